"""What a notification says: the approval event as JSON (``warden``), or a
Slack-compatible message (``slack``), each with a link to the approval's page
in the console. Never the call's arguments: only their digest."""

from __future__ import annotations

import json
from typing import Any

from warden_server.config import WebhookSection

EVENTS = ("requested", "approved", "denied", "expired")


def event_of(
    record: dict[str, Any], approval: dict[str, Any] | None, console_url: str
) -> dict[str, Any]:
    """The ``warden`` payload of one approval audit record."""
    details = json.loads(record["details"]) if record.get("details") else {}
    approval = approval or {}
    approval_id = record["approval_id"]
    return {
        "event": f"approval.{record['status']}",
        "seq": record["seq"],
        "at": record["ts"],
        "approval_id": approval_id,
        "capability_id": record.get("capability_id"),
        "capability_version": record.get("capability_version"),
        "service": record.get("service"),
        "tenant": record.get("tenant"),
        "requester_id": approval.get("requester_id"),
        "rule_id": approval.get("rule_id"),
        "message": approval.get("message"),
        "expires_at": approval.get("expires_at"),
        "decided_by": record.get("actor_id")
        if record["status"] in ("approved", "denied")
        else None,
        "reason": details.get("reason"),
        "input_digest": record.get("input_digest"),
        "url": f"{console_url.rstrip('/')}/approvals/{approval_id}",
    }


def body_of(webhook: WebhookSection, event: dict[str, Any]) -> str:
    """The body POSTed to ``webhook`` for ``event``."""
    if webhook.format == "slack":
        return json.dumps(_slack(event), ensure_ascii=False, sort_keys=True)
    return json.dumps(event, ensure_ascii=False, sort_keys=True)


_HEADLINES = {
    "approval.requested": "Approval requested",
    "approval.approved": "Approved",
    "approval.denied": "Denied",
    "approval.expired": "Expired",
}


def _slack(event: dict[str, Any]) -> dict[str, Any]:
    headline = _HEADLINES.get(event["event"], event["event"])
    who = {
        "approval.requested": f"requested by {event['requester_id']}",
        "approval.approved": f"by {event['decided_by']}",
        "approval.denied": f"by {event['decided_by']}",
        "approval.expired": "no one decided in time",
    }.get(event["event"], "")
    lines = [f"*{headline}*: `{event['capability_id']}` ({event['tenant'] or 'no tenant'}), {who}"]
    if event.get("message"):
        lines.append(str(event["message"]))
    if event.get("reason"):
        lines.append(f"Reason: {event['reason']}")
    text = "\n".join(lines)
    link = f"<{event['url']}|Open in the Warden console>"
    return {
        "text": f"{text}\n{link}",
        "blocks": [
            {"type": "section", "text": {"type": "mrkdwn", "text": text}},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": link}]},
        ],
    }
