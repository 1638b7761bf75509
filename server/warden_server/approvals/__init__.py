"""The approval lifecycle beyond the pipeline's approval stage (SPEC §7, SI-6):
deciding (``deciding``), expiry (``expiry``), the events watchers receive
(``events``) and the audit records of it all (``audit``)."""
