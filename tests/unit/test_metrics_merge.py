"""The plane's /metrics over several processes: one set of figures."""

from __future__ import annotations

from warden_server.telemetry.metrics import merge_expositions

FIRST = """# HELP warden_decisions Begin decisions.
# TYPE warden_decisions counter
warden_decisions_total{code="none",stage="none",status="granted"} 3.0
warden_decisions_created{code="none",stage="none",status="granted"} 100.0
# HELP warden_policy_revision_info The policy revision in force (value 1).
# TYPE warden_policy_revision_info gauge
warden_policy_revision_info{revision="abc"} 1.0
# HELP warden_audit_commit_batch_size Transactions committed together.
# TYPE warden_audit_commit_batch_size histogram
warden_audit_commit_batch_size_bucket{le="1.0"} 2.0
warden_audit_commit_batch_size_bucket{le="+Inf"} 3.0
warden_audit_commit_batch_size_count 3.0
warden_audit_commit_batch_size_sum 4.0
"""

SECOND = """# HELP warden_decisions Begin decisions.
# TYPE warden_decisions counter
warden_decisions_total{code="none",stage="none",status="granted"} 4.0
warden_decisions_total{code="FORBIDDEN",stage="authorization",status="failed"} 1.0
warden_decisions_created{code="none",stage="none",status="granted"} 90.0
# HELP warden_policy_revision_info The policy revision in force (value 1).
# TYPE warden_policy_revision_info gauge
warden_policy_revision_info{revision="abc"} 1.0
# HELP warden_audit_commit_batch_size Transactions committed together.
# TYPE warden_audit_commit_batch_size histogram
warden_audit_commit_batch_size_bucket{le="1.0"} 1.0
warden_audit_commit_batch_size_bucket{le="+Inf"} 1.0
warden_audit_commit_batch_size_count 1.0
warden_audit_commit_batch_size_sum 1.0
"""


def test_counters_and_histograms_add_up_and_gauges_do_not() -> None:
    merged = {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for family in merge_expositions([FIRST, SECOND])
        for s in family.samples
    }
    granted = (("code", "none"), ("stage", "none"), ("status", "granted"))
    assert merged[("warden_decisions_total", granted)] == 7
    assert merged[("warden_decisions_created", granted)] == 90
    forbidden = (("code", "FORBIDDEN"), ("stage", "authorization"), ("status", "failed"))
    assert merged[("warden_decisions_total", forbidden)] == 1
    assert merged[("warden_policy_revision_info", (("revision", "abc"),))] == 1
    assert merged[("warden_audit_commit_batch_size_bucket", (("le", "+Inf"),))] == 4
    assert merged[("warden_audit_commit_batch_size_sum", ())] == 5
