"""Warden's Python SDK: register capabilities and invoke them under governance.

import warden

rt = warden.Runtime("127.0.0.1:50051", service="orders", token=SERVICE_TOKEN)

@rt.capability("orders.refund", input=RefundIn, output=RefundOut,
               side_effect="write", errors={"NOT_ELIGIBLE": "This order cannot be refunded."})
def refund(inp: RefundIn, ctx: warden.Context) -> RefundOut: ...

env = rt.invoke("orders.refund", {"order_id": "A1", "amount": 730}, actor=ACTOR_JWT)
"""

from warden._approvals import Approval, ApprovalEvent, Approvals
from warden._cancel import CancelToken
from warden._capability import DiscoveredCapability
from warden._context import Actor, Context, DeclaredError
from warden._envelope import Envelope, unwrap
from warden._errors import ApprovalError, CapabilityError, WardenError
from warden._grants import GrantKey, GrantVerificationError, verify_grant
from warden._markers import ModelHidden, Sensitive
from warden._retry import NO_RETRY, RetryPolicy, may_retry
from warden._runtime import RegisteredCapability, Runtime
from warden.shared.grant_token import GrantClaims
from warden.shared.tls import TLS

__all__ = [
    "NO_RETRY",
    "TLS",
    "Actor",
    "Approval",
    "ApprovalError",
    "ApprovalEvent",
    "Approvals",
    "CancelToken",
    "CapabilityError",
    "Context",
    "DeclaredError",
    "DiscoveredCapability",
    "Envelope",
    "GrantClaims",
    "GrantKey",
    "GrantVerificationError",
    "ModelHidden",
    "RegisteredCapability",
    "RetryPolicy",
    "Runtime",
    "Sensitive",
    "WardenError",
    "may_retry",
    "unwrap",
    "verify_grant",
]
