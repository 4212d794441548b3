"""Random ids in uuid4's forms, made for a third of `uuid.uuid4()`'s cost.

Session ids (`str(uuid4())`) and task ids (`uuid4().hex`) are minted on
every episode and every tool call, by clients and servers alike; `uuid.UUID`
checks and converts its bytes in Python on every one. These set uuid4's
version and variant bits on 16 random bytes themselves: the same ids.
"""

from __future__ import annotations

import os

__all__ = ["uuid4_hex", "uuid4_text"]


def uuid4_hex() -> str:
    """A random uuid4 as 32 hex digits (`uuid.uuid4().hex`)."""
    raw = bytearray(os.urandom(16))
    raw[6] = raw[6] & 0x0F | 0x40  # version 4
    raw[8] = raw[8] & 0x3F | 0x80  # the RFC 4122 variant
    return raw.hex()


def uuid4_text() -> str:
    """A random uuid4 in its usual text form (`str(uuid.uuid4())`)."""
    digits = uuid4_hex()
    return f"{digits[:8]}-{digits[8:12]}-{digits[12:16]}-{digits[16:20]}-{digits[20:]}"
