// Live approvals: the server sends an event per change (server-sent events fed
// by the plane's Watch stream) and this fetches the re-rendered list. The list
// is not replaced while someone is typing a reason in it.
"use strict";
(function () {
  const inbox = document.getElementById("inbox");
  if (!inbox || !window.EventSource) {
    return;
  }
  const state = document.getElementById("live-state");
  let timer = null;
  let waiting = false;

  function busy() {
    const active = document.activeElement;
    if (active && inbox.contains(active) && active.tagName === "INPUT" && active.value) {
      return true;
    }
    return Array.from(inbox.querySelectorAll("input[name=reason]")).some((i) => i.value !== "");
  }

  async function refresh() {
    timer = null;
    if (busy()) {
      waiting = true;
      state.textContent = "New changes: they will show once you have decided or cleared the reason.";
      return;
    }
    const response = await fetch(inbox.dataset.source, { credentials: "same-origin" });
    if (response.status === 401) {
      state.textContent = "Your session ended: sign in again.";
      return;
    }
    if (response.ok) {
      inbox.innerHTML = await response.text();
      inbox.dataset.refreshed = String(Date.now());
      waiting = false;
      state.textContent = "Up to date.";
    }
  }

  function soon() {
    if (timer === null) {
      timer = setTimeout(refresh, 100);
    }
  }

  inbox.addEventListener("input", () => {
    if (waiting && !busy()) {
      soon();
    }
  });
  const events = new EventSource(inbox.dataset.events);
  events.addEventListener("approval", soon);
  events.addEventListener("refused", (event) => {
    state.textContent = JSON.parse(event.data).message;
    events.close();
  });
  events.addEventListener("open", () => {
    inbox.dataset.live = "yes";
  });
})();
