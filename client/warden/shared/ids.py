"""Ids that grow with time: UUIDv7 (RFC 9562).

Every id the plane indexes as it appends (audit record ids, invocation ids,
call ids) is one of these. An id whose first bits are the time lands at the
end of its index, on a page the store has just written; a random id (UUIDv4)
lands anywhere, so as the store grows nearly every append reads, dirties and
writes back one more page per such index. Measured on the plane's own schema
(``docs/performance.md``), random invocation and call ids took an append
from 97 to 147 µs of CPU once the store passed 180 MB; these hold it near
108 µs.

The 74 bits after the time are random, so ids made in the same millisecond
by different processes or machines do not collide, and an id says no more
than when it was made.
"""

from __future__ import annotations

import os
import time
import uuid
from typing import Final

_MASK_48: Final = (1 << 48) - 1
_MASK_62: Final = (1 << 62) - 1


def uuid7() -> uuid.UUID:
    """A UUIDv7: 48 bits of Unix time in milliseconds, then the version, 12
    random bits, the variant and 62 random bits."""
    stamp = time.time_ns() // 1_000_000
    random = int.from_bytes(os.urandom(10), "big")
    return uuid.UUID(
        int=(stamp & _MASK_48) << 80
        | 0x7 << 76
        | (random >> 64 & 0xFFF) << 64
        | 0b10 << 62
        | random & _MASK_62
    )
