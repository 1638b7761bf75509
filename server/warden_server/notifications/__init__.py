"""Approval notifications: webhooks for requested, decided and expired approvals."""

from warden_server.notifications.notifier import Notifier, start_notifier
from warden_server.notifications.signing import SIGNATURE_HEADER, sign, verify

__all__ = ["SIGNATURE_HEADER", "Notifier", "sign", "start_notifier", "verify"]
