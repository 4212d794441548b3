"""Which web pages may drive a door: the `Host` check (DNS rebinding, 421), the
`Origin` check (another site's page, 403, on requests that can change state)
and the CORS answers for origins allowed on purpose (never `*`). One rule for
every door a browser can reach (the HTTP door with its playground and docs,
the MCP door); each door applies it. Bound to loopback, only loopback names
and `--allowed-host` patterns are served; clients that are not browsers send
no `Origin` and are unaffected. The rule and the pattern forms
(`NAME`, `NAME:PORT`, `NAME:*`): docs/http-bridge.md, "Web pages".
"""

from __future__ import annotations

import enum
import ipaddress
from dataclasses import dataclass, field
from typing import Iterable, Mapping, Optional

from ors_grpc.protocol.constants import API_KEY_HEADER, IDEMPOTENCY_KEY_HEADER, SESSION_ID_HEADER

__all__ = [
    "CORS_PREFLIGHT_MAX_AGE_S",
    "FOREIGN_HOST_DETAIL",
    "FOREIGN_ORIGIN_DETAIL",
    "LOOPBACK_HOSTS",
    "MAX_REMEMBERED_HOSTS",
    "BrowserPolicy",
    "READ_ONLY_METHODS",
    "OriginKind",
    "is_loopback_bind",
    "is_preflight",
]

#: The names a request's `Host` may give a loopback-bound door, with any port.
LOOPBACK_HOSTS = ("127.0.0.1", "localhost", "[::1]")
#: Methods that only read: a foreign `Origin` is refused on the others (HTTP door).
READ_ONLY_METHODS = frozenset({"GET", "HEAD", "OPTIONS"})
#: `Host` values whose answer a policy remembers at most (then it starts over):
#: a server is reached under a few names, but a client can send any.
MAX_REMEMBERED_HOSTS = 1024
#: Seconds a browser may keep a preflight's answer.
CORS_PREFLIGHT_MAX_AGE_S = 600
#: What an allowed page may send and read: the headers of the ORS HTTP API
#: and of MCP's streamable HTTP transport.
CORS_ALLOW_METHODS = "GET, POST, DELETE, OPTIONS"
CORS_ALLOW_HEADERS = (f"Content-Type, Accept, {SESSION_ID_HEADER}, {API_KEY_HEADER}, Authorization, X-Secrets, "
                      f"{IDEMPOTENCY_KEY_HEADER}, Last-Event-ID, Mcp-Session-Id, Mcp-Protocol-Version")
CORS_EXPOSE_HEADERS = "Retry-After, X-Backend-State, Mcp-Session-Id, Mcp-Protocol-Version"

FOREIGN_HOST_DETAIL = (
    "Misdirected request: the Host header names neither this server's loopback address (127.0.0.1, "
    "localhost, [::1]) nor an allowed host, so that a web page cannot reach it through DNS rebinding. "
    "To serve another name on purpose (behind a proxy), start it with --allowed-host NAME[:PORT] "
    "(ServerConfig.allowed_hosts)"
)
FOREIGN_ORIGIN_DETAIL = (
    "Forbidden: the request comes from a web page of another origin (its Origin header is neither this "
    "server's nor allowed). To let a page served elsewhere use this server, start it with "
    "--allowed-origin SCHEME://NAME[:PORT] (ServerConfig.allowed_origins)"
)


class OriginKind(enum.Enum):
    """Where a request's page comes from."""

    #: No `Origin` (not a browser), or the server's own origin.
    OWN = "own"
    #: A page served elsewhere, allowed on purpose: answered with CORS headers.
    ALLOWED = "allowed"
    #: A page of another origin: refused where state can change.
    FOREIGN = "foreign"


def is_loopback_bind(host: str) -> bool:
    """Whether a door bound to `host` is reachable from this machine only."""
    name = host.strip().strip("[]").lower()
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False  # all interfaces (""), or a name: reachable from elsewhere


def _split_port(value: str) -> tuple[str, Optional[str]]:
    """`name:port` -> (name, port); (value, None) when no digits follow the last colon."""
    colon = value.rfind(":")
    if colon > value.rfind("]") and value[colon + 1:].isdigit():
        return value[:colon], value[colon + 1:]
    return value, None


@dataclass(frozen=True)
class _Patterns:
    """Allowed values: exactly (`exact`), or a base with any port or none (`any_port`)."""

    exact: frozenset[str]
    any_port: frozenset[str]

    @classmethod
    def of(cls, entries: Iterable[str]) -> "_Patterns":
        exact, any_port = set(), set()
        for entry in entries:
            if entry.endswith(":*"):
                any_port.add(entry[:-2])
            else:
                exact.add(entry)
        return cls(frozenset(exact), frozenset(any_port))

    def match(self, value: str) -> bool:
        return value in self.exact or _split_port(value)[0] in self.any_port


def _host_entry(entry: str) -> str:
    """An `--allowed-host` value, checked and lowercased (ValueError naming it)."""
    value = entry.strip().lower()
    name, port = _split_port(value[:-2] if value.endswith(":*") else value)
    if not name or any(c in name for c in "*/@ ") or (":" in name and not name.startswith("[")):
        raise ValueError(f"--allowed-host {entry!r}: expected NAME, NAME:PORT or NAME:* "
                         "(an IPv6 address in brackets; no scheme, no path, no wildcard name)")
    return value


def _origin_entry(entry: str) -> str:
    """An `--allowed-origin` value, checked and lowercased (ValueError naming it)."""
    value = entry.strip().lower().rstrip("/")
    scheme, sep, rest = value.partition("://")
    try:
        if scheme not in ("http", "https") or not sep:
            raise ValueError(entry)
        _host_entry(rest)
    except ValueError:
        raise ValueError(f"--allowed-origin {entry!r}: expected http(s)://NAME[:PORT] or http(s)://NAME:* "
                         "(each origin named: no '*', no 'null', no path)") from None
    return value


@dataclass(frozen=True)
class BrowserPolicy:
    """The Host and Origin rule of one door (see the module's doc); built once, read per request."""

    #: False: every `Host` is served (bound to all interfaces, no host named).
    checks_host: bool
    hosts: _Patterns
    origins: _Patterns
    #: `host_allowed`'s answers by raw `Host` value: one dict lookup per request.
    _answers: dict[Optional[str], bool] = field(default_factory=dict, compare=False, repr=False)

    @classmethod
    def for_bind(cls, bind_host: str, allowed_hosts: Iterable[str] = (),
                 allowed_origins: Iterable[str] = ()) -> "BrowserPolicy":
        """The policy of a door bound to `bind_host`; ValueError for a malformed allowed entry."""
        named_hosts = [_host_entry(entry) for entry in allowed_hosts]
        origins = [_origin_entry(entry) for entry in allowed_origins]
        loopback = [f"{name}:*" for name in LOOPBACK_HOSTS]
        if is_loopback_bind(bind_host):
            bound = bind_host.strip().lower()
            loopback.append(f"[{bound}]:*" if ":" in bound and not bound.startswith("[") else f"{bound}:*")
        return cls(
            checks_host=is_loopback_bind(bind_host) or bool(named_hosts),
            hosts=_Patterns.of([*loopback, *named_hosts]),
            origins=_Patterns.of(origins),
        )

    @property
    def allows_cross_origin(self) -> bool:
        """Whether any page served elsewhere may use the door (CORS answers are needed)."""
        return bool(self.origins.exact or self.origins.any_port)

    def host_allowed(self, host: Optional[str]) -> bool:
        """Whether a request with this `Host` header is served (False: 421)."""
        answer = self._answers.get(host)
        if answer is None:
            answer = not self.checks_host or host is None or self.hosts.match(host.lower())
            if len(self._answers) >= MAX_REMEMBERED_HOSTS:
                self._answers.clear()
            self._answers[host] = answer
        return answer

    def origin_kind(self, origin: Optional[str], host: Optional[str]) -> OriginKind:
        """Where the page of a request with this `Origin` (and a served `Host`) comes from."""
        if origin is None:
            return OriginKind.OWN
        origin = origin.lower()
        if host is not None:
            host = host.lower()
            if origin == "http://" + host or origin == "https://" + host:
                return OriginKind.OWN
        return OriginKind.ALLOWED if self.origins.match(origin) else OriginKind.FOREIGN

    @staticmethod
    def cors_headers(origin: str) -> dict[str, str]:
        """The headers of an answer to an allowed page of `origin`."""
        return {"Access-Control-Allow-Origin": origin, "Access-Control-Expose-Headers": CORS_EXPOSE_HEADERS,
                "Vary": "Origin"}

    @staticmethod
    def preflight_headers(origin: str) -> dict[str, str]:
        """The headers of the answer to an allowed page's preflight (OPTIONS)."""
        return {"Access-Control-Allow-Origin": origin, "Access-Control-Allow-Methods": CORS_ALLOW_METHODS,
                "Access-Control-Allow-Headers": CORS_ALLOW_HEADERS,
                "Access-Control-Max-Age": str(CORS_PREFLIGHT_MAX_AGE_S), "Vary": "Origin"}


def is_preflight(method: str, headers: Mapping[str, str]) -> bool:
    """A browser's CORS preflight: OPTIONS with `Origin` and `Access-Control-Request-Method`
    (`headers` looked up case-insensitively, as aiohttp's and Starlette's are)."""
    return method == "OPTIONS" and "origin" in headers and "access-control-request-method" in headers
