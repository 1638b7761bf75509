"""What the store keeps, as plain values: audit records, their chain hashing,
retention checkpoints and the audit query filter. A leaf: it imports nothing
of the plane, so the store and the audit log both build on it and the store
never reaches into ``audit``."""
