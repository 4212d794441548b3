"""Session ids that name the backend that issued them, in the form Envoy's stateful sessions decode.

`ors-grpc serve --advertise-host HOST` hands out session ids (CreateSessionId,
HTTP `/create_session`) of the form

    base64(HOST:PORT) ";UV:" base64(KEY)

where HOST:PORT is the door that issued the id, as the proxy's cluster names
it, and KEY a random uuid4 (the id stays unguessable). This is the value
Envoy's `envoy.http.stateful_session.envelope` extension (header mode) reads
from `x-session-id`: it sends the request to that host, whatever its hash
table says, and passes the header on as KEY. So the backend sees KEY in its
metadata while the request message may name the whole id: both are the
session KEY (`session_key`). docs/deployment.md, "Episodes through deploys
and scaling", has the whole design.
"""

from __future__ import annotations

import base64
import binascii

__all__ = ["door_address", "routed_id", "session_key"]

#: Envoy's marker of the upstream's own value in an envelope.
_VALUE_MARK = ";UV:"


def door_address(host: str, port: int) -> str:
    """`host:port` as Envoy writes a socket address (an IPv6 host in brackets)."""
    return f"[{host}]:{port}" if ":" in host else f"{host}:{port}"


def routed_id(address: str, key: str) -> str:
    """The session id `key` issued by the door at `address` (`door_address`)."""
    return f"{_b64(address)}{_VALUE_MARK}{_b64(key)}"


def session_key(sid: str) -> str:
    """The session a (stripped) session id names: KEY for a routed id, else the id itself."""
    address, mark, value = sid.partition(_VALUE_MARK)
    if not mark or not address:
        return sid
    try:
        key = base64.b64decode(value.partition(";")[0], validate=True).decode()
    except (binascii.Error, UnicodeDecodeError):
        return sid
    return key or sid


def _b64(text: str) -> str:
    return base64.b64encode(text.encode()).decode("ascii")
