"""The console in a real browser (Chromium, headless): signing in, the
approvals inbox updating live, deciding, refusals in words, the audit
explorer, and the forms' CSRF protection. The fixtures fail any test whose
pages reach another origin."""

from __future__ import annotations

import csv
import json
from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import jwt
from playwright.sync_api import expect

import warden
from tests.conftest import ACTOR_SECRET, Plant
from tests.console.billing import CARD, charge
from tests.console.conftest import Visitor
from warden_server.console import RunningConsole

Visit = Callable[..., Visitor]


def requester(plant: Plant) -> str:
    return plant.token(sub="bot-7", roles=("support",), tenant="acme")


def test_an_approver_sees_a_request_arrive_live_approves_it_and_the_call_resumes(
    billing: warden.Runtime, billing_plant: Plant, console: RunningConsole, visit: Visit
) -> None:
    mia = visit(console)
    page = mia.sign_in(billing_plant.token(sub="mia", roles=("manager",), tenant="acme"))
    expect(page).to_have_url(f"{console.url}/approvals")
    expect(page.locator("#inbox")).to_have_attribute("data-live", "yes")
    expect(page.get_by_text("No requests are waiting in your tenant.")).to_be_visible()
    mia.shot("approvals-empty")

    asked = charge(billing, requester(billing_plant), 730)
    assert asked.status == "suspended"
    card = page.locator(f"#approval-{asked.approval_id}")
    expect(card).to_be_visible()  # arrived without a reload, by the Watch stream
    expect(card).to_contain_text("billing.charge")
    expect(card).to_contain_text("Charges above 500 need a manager's approval.")
    expect(card).to_contain_text("big-charges-need-a-manager")
    expect(card).to_contain_text("bot-7")
    expect(card).to_contain_text("min left")
    expect(card.get_by_role("row", name="/card")).to_contain_text("redacted")
    expect(card.get_by_role("row", name="/amount")).to_contain_text("730")
    assert CARD not in page.content()
    mia.shot("approvals-pending")

    card.get_by_label("Reason (required to deny)").fill("customer called, verified")
    card.get_by_role("button", name="Approve").click()
    expect(page.get_by_role("status").filter(has_text="is approved by mia")).to_be_visible()
    expect(page.get_by_text("No requests are waiting in your tenant.")).to_be_visible()
    mia.shot("approvals-decided")

    resumed = charge(billing, requester(billing_plant), 730, approval_id=asked.approval_id)
    assert resumed.status == "succeeded", resumed
    assert resumed.output.model_dump() == {"charge_id": "ch-c-17", "amount": 730}
    decided = billing_plant.events(kind="approval", status="approved")
    assert [json.loads(r["details"])["reason"] for r in decided] == ["customer called, verified"]
    assert {r["actor_id"] for r in decided} == {"mia"}


def test_si13_an_approver_of_another_tenant_sees_nothing(
    billing: warden.Runtime, billing_plant: Plant, console: RunningConsole, visit: Visit
) -> None:
    asked = charge(billing, requester(billing_plant), 730)
    olga = visit(console)
    page = olga.sign_in(billing_plant.token(sub="olga", roles=("manager",), tenant="globex"))
    expect(page.get_by_text("No requests are waiting in your tenant.")).to_be_visible()
    assert asked.approval_id not in page.content()
    page = olga.go(f"/approvals/{asked.approval_id}")
    expect(page.get_by_role("heading", name="Not found")).to_be_visible()
    page.request.post(
        f"{console.url}/approvals/{asked.approval_id}/decide",
        form={"csrf": olga.csrf(), "verdict": "approve", "reason": "mine now"},
        max_redirects=0,
    )
    page = olga.go("/approvals")
    expect(page.get_by_role("alert")).to_contain_text(
        f"Not found: approval {asked.approval_id!r} not found"
    )
    refused = billing_plant.events(kind="approval", status="refused")
    assert [r["reason"] for r in refused] == ["other-tenant"]


def test_si6_a_requester_cannot_approve_their_own_request(
    billing: warden.Runtime, billing_plant: Plant, console: RunningConsole, visit: Visit
) -> None:
    # A manager who makes a call themselves: the rule would let a manager
    # approve, but never the requester (separation of duties).
    own = billing_plant.token(sub="max", roles=("manager",), tenant="acme")
    asked = charge(billing, own, 730)
    assert asked.status == "suspended"
    max_ = visit(console)
    page = max_.sign_in(own)
    card = page.locator(f"#approval-{asked.approval_id}")
    expect(card).to_contain_text("it is your own (separation of duties)")
    expect(card.get_by_role("button", name="Approve")).to_have_count(0)
    max_.shot("approvals-own-request")

    # Posting the decision anyway (a valid form, with the session's token) is
    # refused by the plane, and the refusal is shown in words.
    page.request.post(
        f"{console.url}/approvals/{asked.approval_id}/decide",
        form={"csrf": max_.csrf(), "verdict": "approve", "reason": "looks fine to me"},
        max_redirects=0,
    )
    # The open page's live list refetches itself on the refusal's event; that
    # background fetch must leave the notice for the next whole page.
    fragment = page.request.get(f"{console.url}/approvals/inbox")
    assert fragment.ok and 'role="alert"' not in fragment.text()
    page.goto(f"{console.url}/approvals")
    expect(page.get_by_role("alert")).to_contain_text(
        "Refused: the requester of a call cannot decide its approval (separation of duties)"
    )
    with warden.Approvals(billing_plant.target, token=own) as approvals:
        assert approvals.get(asked.approval_id).state == "pending"


def test_a_form_posted_without_the_csrf_token_is_refused(
    billing: warden.Runtime, billing_plant: Plant, console: RunningConsole, visit: Visit
) -> None:
    asked = charge(billing, requester(billing_plant), 730)
    mia = visit(console)
    page = mia.sign_in(billing_plant.token(sub="mia", roles=("manager",), tenant="acme"))
    expect(page.locator(f"#approval-{asked.approval_id}")).to_be_visible()
    # A forged form, in the console's own page, carrying everything but the token.
    page.evaluate(
        """(id) => {
            const form = document.createElement("form");
            form.method = "post";
            form.action = `/approvals/${id}/decide`;
            for (const [name, value] of [["verdict", "approve"], ["reason", "forged"]]) {
                const input = document.createElement("input");
                input.name = name;
                input.value = value;
                form.appendChild(input);
            }
            document.body.appendChild(form);
            form.submit();
        }""",
        asked.approval_id,
    )
    expect(page.get_by_role("heading", name="Form refused")).to_be_visible()
    mia.shot("form-refused")
    wrong = page.request.post(
        f"{console.url}/approvals/{asked.approval_id}/decide",
        form={"csrf": "not-the-token", "verdict": "approve"},
    )
    assert wrong.status == 403
    signed_out = page.request.post(f"{console.url}/sign-out", form={})
    assert signed_out.status == 403
    with warden.Approvals(
        billing_plant.target, token=billing_plant.token(sub="mia", roles=("manager",))
    ) as approvals:
        assert approvals.get(asked.approval_id).state == "pending"
    assert billing_plant.events(kind="approval", status="approved") == []


def test_an_auditor_filters_the_log_opens_a_record_and_exports_it(
    billing: warden.Runtime, billing_plant: Plant, console: RunningConsole, visit: Visit
) -> None:
    token = requester(billing_plant)
    assert charge(billing, token, 20).status == "succeeded"
    denied = charge(billing, token, 200_000)
    assert denied.status == "failed"
    assert charge(billing, token, 730).status == "suspended"
    billing_plant.await_outcome_reports()

    ada = visit(console)
    page = ada.sign_in(billing_plant.token(sub="ada", roles=("auditor",), tenant="acme"))
    expect(page).to_have_url(f"{console.url}/audit")
    ada.shot("audit-log")
    page.get_by_label("Code").fill("POLICY_DENIED")
    page.get_by_label("Kind").select_option("decision")
    page.get_by_role("button", name="Apply filters").click()
    rows = page.locator("table.records tbody tr")
    expect(rows).to_have_count(1)
    expect(rows.first).to_contain_text("POLICY_DENIED")
    ada.shot("audit-filtered")

    rows.first.get_by_role("link").click()
    expect(page.get_by_role("heading", name="Decision", exact=True)).to_be_visible()
    expect(page.locator(".card").first).to_contain_text("POLICY_DENIED")
    expect(page.get_by_role("heading", name="Outcome", exact=True)).to_be_visible()
    expect(page.get_by_text(denied.invocation_id).first).to_be_visible()
    ada.shot("audit-record")

    page.go_back()
    with page.expect_download() as download:
        page.get_by_role("link", name="CSV").click()
    exported = download.value.path().read_text()
    table = list(csv.DictReader(exported.splitlines()))
    assert [r["code"] for r in table] == ["POLICY_DENIED"]
    assert table[0]["invocation_id"] == denied.invocation_id
    assert CARD not in exported
    with page.expect_download() as download:
        page.get_by_role("link", name="JSON lines").click()
    lines = [json.loads(line) for line in download.value.path().read_text().splitlines()]
    assert [r["seq"] for r in lines] == [int(table[0]["seq"])]

    page = ada.go("/audit/stats?since=1h")
    expect(page.get_by_role("img", name="Records by code")).to_be_visible()
    expect(page.get_by_role("img", name="Records by stage over time")).to_be_visible()
    ada.shot("audit-stats")
    page = ada.go("/audit/stats?since=0s")  # a window too short to slice: no chart over time
    expect(page.get_by_role("img", name="Records by code")).to_be_visible()
    expect(page.get_by_role("img", name="Records by stage over time")).to_have_count(0)
    page = ada.go("/audit/stats?since=1h&until=2h")
    expect(page.get_by_role("alert")).to_contain_text("is not before until '2h'")
    page = ada.go("/audit/verify")
    page.get_by_role("button", name="Verify now").click()
    expect(page.get_by_role("alert")).to_contain_text("needs auditor:all")
    page = ada.go("/policy")
    expect(page.get_by_text("Revision in force")).to_be_visible()
    rules = page.get_by_role("table", name="The rules of revision")
    expect(rules.locator("tbody tr")).to_have_count(3)
    manager = rules.get_by_role("row", name="big-charges-need-a-manager")
    expect(manager).to_contain_text("require_approval")
    expect(manager).to_contain_text("billing.charge")
    expect(manager).to_contain_text("input.amount > 500")
    expect(manager).to_contain_text('"manager" in approver.roles')
    expect(manager.get_by_role("cell").last).to_have_text("billing.yaml:7")
    ada.shot("policy")
    reads = [r["reason"] for r in billing_plant.events(kind="access", actor_id="ada")]
    assert "audit.export" in reads  # the console read through the audit API, recorded


def test_verify_panel_shows_an_intact_chain_to_an_auditor_of_every_tenant(
    billing_plant: Plant, console: RunningConsole, visit: Visit
) -> None:
    root = visit(console)
    page = root.sign_in(billing_plant.token(sub="root", roles=("auditor:all",), tenant=""))
    page = root.go("/audit/verify")
    page.get_by_role("button", name="Verify now").click()
    expect(page.get_by_role("heading", name="Intact")).to_be_visible()
    root.shot("audit-verify")


def test_a_token_the_plane_rejects_does_not_sign_in(
    billing_plant: Plant, console: RunningConsole, visit: Visit
) -> None:
    now = datetime.now(UTC)
    claims = {"sub": "mia", "roles": ["manager"], "tenant": "acme", "aud": "warden"}
    forged = jwt.encode(
        {**claims, "iss": "warden-test", "exp": now + timedelta(minutes=5)},
        "another-secret-0123456789abcdef0123",
        algorithm="HS256",
    )
    expired = jwt.encode(
        {**claims, "iss": "warden-test", "exp": now - timedelta(minutes=5)},
        ACTOR_SECRET,
        algorithm="HS256",
    )
    wrong_issuer = jwt.encode(
        {**claims, "iss": "someone-else", "exp": now + timedelta(minutes=5)},
        ACTOR_SECRET,
        algorithm="HS256",
    )
    eve = visit(console)
    for token in (forged, expired, wrong_issuer, "not a token"):
        page = eve.sign_in(token)
        expect(page.get_by_role("alert")).to_contain_text("The plane did not accept your token")
        assert page.url.endswith("/sign-in")
    eve.shot("sign-in-refused")
    page = eve.go("/approvals")
    expect(page).to_have_url(f"{console.url}/sign-in")


def test_the_session_cookie_is_httponly_and_samesite_strict_and_sign_out_ends_it(
    billing_plant: Plant, console: RunningConsole, visit: Visit
) -> None:
    mia = visit(console)
    page = mia.go("/sign-in")
    mia.shot("sign-in")
    page = mia.sign_in(billing_plant.token(sub="mia", roles=("manager",), tenant="acme"))
    (cookie,) = mia.context.cookies()
    assert cookie["httpOnly"] is True
    assert cookie["sameSite"] == "Strict"
    assert page.evaluate("document.cookie") == ""
    page.get_by_role("button", name="Sign out").click()
    expect(page).to_have_url(f"{console.url}/sign-in")
    page = mia.go("/audit")
    expect(page).to_have_url(f"{console.url}/sign-in")
    # The old session id is worthless now.
    mia.context.add_cookies([{**cookie}])
    page = mia.go("/approvals")
    expect(page).to_have_url(f"{console.url}/sign-in")


def test_a_proxy_header_signs_in_and_a_rejected_one_does_not(
    billing_plant: Plant, start_console: Callable[..., RunningConsole], visit: Visit
) -> None:
    console = start_console(token_header="X-Forwarded-Access-Token")
    token = billing_plant.token(sub="mia", roles=("manager",), tenant="acme")
    mia = visit(console, extra_http_headers={"X-Forwarded-Access-Token": token})
    page = mia.go("/approvals")
    expect(page.get_by_role("heading", name="Approvals", exact=True)).to_be_visible()
    expect(page.locator("header")).to_contain_text("mia")
    eve = visit(console, extra_http_headers={"X-Forwarded-Access-Token": "Bearer forged"})
    page = eve.go("/approvals")
    expect(page).to_have_url(f"{console.url}/sign-in")


def test_every_page_sends_a_strict_content_security_policy(
    billing_plant: Plant, console: RunningConsole, visit: Visit
) -> None:
    mia = visit(console)
    mia.sign_in(billing_plant.token(sub="mia", roles=("manager", "auditor"), tenant="acme"))
    pages = ("/sign-in", "/approvals", "/audit", "/audit/stats", "/policy", "/static/console.js")
    for path in pages:
        response = mia.page.request.get(console.url + path)
        policy = response.headers["content-security-policy"]
        assert "script-src 'self'" in policy
        assert "default-src 'none'" in policy
        assert "unsafe-inline" not in policy
