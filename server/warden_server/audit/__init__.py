"""The audit log: events, the hash chain that makes it tamper-evident, and
reading it back (queries and verification)."""
