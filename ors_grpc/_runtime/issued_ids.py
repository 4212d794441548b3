"""The session ids a server handed out (CreateSessionId) and not yet used, for a while.

A client asks for an id, then creates its episode under it a moment later.
Behind a proxy that routes an id to the backend that issued it (routed ids,
`ors_grpc.protocol.routed_ids`), that creation can reach no other backend: if
the backend began draining in between, refusing it would make the client's
own retries (same id, same backend) fail too. So a draining server, which
issues no more ids, still creates an episode under an id it issued within
`ttl_s` seconds before; every other creation it refuses (DRAINING).
"""

from __future__ import annotations

import time

from ors_grpc.protocol.random_ids import uuid4_text

__all__ = ["ISSUED_ID_TTL_S", "IssuedIds"]

#: Seconds an issued id stays creatable on a draining server: well over the
#: reference clients' whole creation (ors-sdk: 3 tries of `/create` 1 s and 2 s apart).
ISSUED_ID_TTL_S = 30.0


class IssuedIds:
    """Ids issued in the last `ttl_s` seconds, oldest first."""

    def __init__(self, ttl_s: float = ISSUED_ID_TTL_S) -> None:
        self._ttl_s = ttl_s
        self._issued: dict[str, float] = {}

    def new(self) -> str:
        """A new random session id (a uuid4), remembered."""
        now = time.monotonic()
        self._forget_older_than(now - self._ttl_s)
        sid = uuid4_text()
        self._issued[sid] = now
        return sid

    def recent(self, sid: str) -> bool:
        """Whether `sid` was issued here within the last `ttl_s` seconds."""
        issued_at = self._issued.get(sid)
        return issued_at is not None and issued_at >= time.monotonic() - self._ttl_s

    def forget(self, sid: str) -> None:
        """`sid` was used (an episode was created under it) or released."""
        self._issued.pop(sid, None)

    def __len__(self) -> int:
        return len(self._issued)

    def _forget_older_than(self, cutoff: float) -> None:
        while self._issued:
            oldest = next(iter(self._issued))
            if self._issued[oldest] >= cutoff:
                return
            del self._issued[oldest]
