"""The notifier: follows the approval records of the audit log, queues a
notification per record and webhook in the store, and delivers the queue
with retries and backoff.

It runs in the plane's first process only. The queue and its cursor are in
the store (``store/notifications.py``), so a delivery that failed, or was
cut short by the plane stopping, is tried again when the plane is back, and
every event is notified once it is committed, whichever process committed it.
"""

from __future__ import annotations

import logging
import threading
import time
import urllib.error
import urllib.request
from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, Any

from warden_server.config import Config, NotificationsSection, WebhookSection
from warden_server.notifications.payloads import body_of, event_of
from warden_server.notifications.signing import SIGNATURE_HEADER, sign
from warden_server.store.notifications import Notification, NotificationQueue, Pending

if TYPE_CHECKING:
    from warden_server.plane import Plane

log = logging.getLogger(__name__)

TIMEOUT_S = 10.0
MAX_ERROR = 500


def console_url(config: Config) -> str:
    """Where notifications link to."""
    return (
        config.notifications.console_url
        or config.console.public_url
        or f"http://{config.console.listen}"
    )


def post(url: str, body: bytes, headers: dict[str, str]) -> None:
    """POST ``body``; raises OSError (urllib's errors are ones) unless the answer is 2xx."""
    request = urllib.request.Request(url, data=body, headers=headers, method="POST")  # noqa: S310 (the config allows http and https only)
    with urllib.request.urlopen(request, timeout=TIMEOUT_S) as answer:  # noqa: S310
        answer.read(65_536)


class Notifier:
    """Delivers the approval notifications of one store to its webhooks."""

    def __init__(
        self,
        queue: NotificationQueue,
        section: NotificationsSection,
        link_base: str,
        *,
        clock: Callable[[], float] = time.time,
        send: Callable[[str, bytes, dict[str, str]], None] = post,
    ) -> None:
        self._queue = queue
        self._section = section
        self._hooks = {hook.url: hook for hook in section.webhooks}
        self._link_base = link_base
        self._clock = clock
        self._send = send
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> None:
        self._thread = threading.Thread(target=self._run, name="warden-notifier", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=TIMEOUT_S + 5)
        self._queue.close()

    def run_once(self) -> None:
        """Queue what is new, then deliver what is due."""
        now = self._clock()
        while self._queue.take_new_events(self._pending, now):
            pass
        for notification in self._queue.due(now):
            if self._stop.is_set():
                return
            self._deliver(notification)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.run_once()
            except Exception:
                log.exception("approval notifications: a round failed; trying again")
            wait = self._section.poll_seconds
            due = self._queue.next_due_at()
            if due is not None:
                wait = max(0.0, min(wait, due - self._clock()))
            self._stop.wait(wait)

    def _pending(
        self, record: dict[str, Any], approval: dict[str, Any] | None
    ) -> Iterator[Pending]:
        status = record["status"]
        if status not in ("requested", "approved", "denied", "expired"):
            return
        event = event_of(record, approval, self._link_base)
        for hook in self._hooks.values():
            if status in hook.events:
                yield Pending(hook.url, event["event"], body_of(hook, event))

    def _deliver(self, notification: Notification) -> None:
        hook: WebhookSection | None = self._hooks.get(notification.webhook)
        now = self._clock()
        if hook is None:  # the webhook left the config
            self._queue.failed(notification.id, "webhook no longer configured", None, now)
            return
        body = notification.body.encode()
        headers = {
            "Content-Type": "application/json",
            "User-Agent": "warden-notifier",
            "X-Warden-Event": notification.event,
            "X-Warden-Delivery": f"{notification.event_seq}",
            SIGNATURE_HEADER: sign(hook.secret, body, int(now)),
        }
        try:
            self._send(hook.url, body, headers)
        except (OSError, ValueError) as exc:
            error = _in_words(exc)[:MAX_ERROR]
            attempts = notification.attempts + 1
            if attempts >= self._section.max_attempts:
                log.error(
                    "approval notification %s to %s given up after %d attempts: %s",
                    notification.event, hook.url, attempts, error,
                )  # fmt: skip
                self._queue.failed(notification.id, error, None, now)
                return
            wait = min(
                self._section.retry_initial_seconds * 2 ** (attempts - 1),
                self._section.retry_max_seconds,
            )
            log.warning(
                "approval notification %s to %s failed (%s); retrying in %.0fs",
                notification.event, hook.url, error, wait,
            )  # fmt: skip
            self._queue.failed(notification.id, error, now + wait, now)
            return
        self._queue.delivered(notification.id, self._clock())


def _in_words(exc: BaseException) -> str:
    if isinstance(exc, urllib.error.HTTPError):
        return f"the webhook answered HTTP {exc.code}"
    if isinstance(exc, urllib.error.URLError):
        return f"the webhook could not be reached: {exc.reason}"
    return str(exc) or type(exc).__name__


def start_notifier(plane: Plane) -> Notifier | None:
    """Start delivering when ``[notifications] webhooks`` names any."""
    config = plane.config
    if not config.notifications.webhooks:
        return None
    notifier = Notifier(
        NotificationQueue(config.store_path), config.notifications, console_url(config)
    )
    notifier.start()
    return notifier
