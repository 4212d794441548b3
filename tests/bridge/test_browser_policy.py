"""The Host and Origin rule every door applies (`ors_grpc.protocol.browser_policy`):
which bind checks hosts, how allowed hosts and origins match, what is refused
at startup. Through the doors: tests/reliability/test_host_and_origin.py."""

from __future__ import annotations

import pytest

from ors_grpc.protocol.browser_policy import MAX_REMEMBERED_HOSTS, BrowserPolicy, OriginKind, is_loopback_bind


@pytest.mark.parametrize("bind, loopback", [
    ("127.0.0.1", True), ("127.0.0.2", True), ("localhost", True), ("::1", True), ("[::1]", True),
    ("0.0.0.0", False), ("::", False), ("", False), ("10.0.0.5", False), ("my-host.internal", False),
])
def test_which_binds_are_loopback(bind: str, loopback: bool) -> None:
    assert is_loopback_bind(bind) is loopback


def test_bound_to_loopback_only_loopback_names_are_served() -> None:
    policy = BrowserPolicy.for_bind("127.0.0.1")
    for host in ("127.0.0.1", "127.0.0.1:8080", "localhost", "LocalHost:1", "[::1]", "[::1]:65535"):
        assert policy.host_allowed(host), host
    for host in ("evil.example", "evil.example:8080", "127.0.0.1.evil.example", "localhost.evil.example:80",
                 "localhost:evil", "[::2]:80", "127.0.0.2:80", ""):
        assert not policy.host_allowed(host), host


def test_a_request_without_host_is_not_a_browsers_and_is_served() -> None:
    assert BrowserPolicy.for_bind("127.0.0.1").host_allowed(None)


def test_the_bound_loopback_address_is_a_loopback_name_too() -> None:
    assert BrowserPolicy.for_bind("127.0.0.2").host_allowed("127.0.0.2:8080")
    assert not BrowserPolicy.for_bind("127.0.0.1").host_allowed("127.0.0.2:8080")


def test_bound_elsewhere_the_host_check_is_off_unless_hosts_are_named() -> None:
    assert BrowserPolicy.for_bind("0.0.0.0").host_allowed("anything.example:1")
    named = BrowserPolicy.for_bind("0.0.0.0", ["ors.example.com"])
    assert named.host_allowed("ors.example.com") and named.host_allowed("localhost:8080")
    assert not named.host_allowed("evil.example")


def test_allowed_host_patterns_name_a_port_or_any() -> None:
    policy = BrowserPolicy.for_bind("127.0.0.1", ["plain.example", "Port.Example:8443", "any.example:*", "[2001:db8::1]:*"])
    served = ["plain.example", "PLAIN.EXAMPLE", "port.example:8443", "any.example", "any.example:1",
              "[2001:db8::1]", "[2001:db8::1]:80"]
    refused = ["plain.example:80", "port.example", "port.example:8444", "any.example:x", "sub.any.example:1"]
    assert [host for host in served if not policy.host_allowed(host)] == []
    assert [host for host in refused if policy.host_allowed(host)] == []


def test_origins_own_allowed_and_foreign() -> None:
    policy = BrowserPolicy.for_bind("127.0.0.1", [], ["https://app.example", "http://localhost:*"])
    assert policy.origin_kind(None, "127.0.0.1:8080") is OriginKind.OWN
    assert policy.origin_kind("http://127.0.0.1:8080", "127.0.0.1:8080") is OriginKind.OWN
    assert policy.origin_kind("HTTPS://127.0.0.1:8080", "127.0.0.1:8080") is OriginKind.OWN
    assert policy.origin_kind("https://app.example", "127.0.0.1:8080") is OriginKind.ALLOWED
    assert policy.origin_kind("http://localhost:3000", "127.0.0.1:8080") is OriginKind.ALLOWED
    for foreign in ("http://127.0.0.1:8081", "http://app.example", "https://app.example:444", "null",
                    "https://app.example.evil.example", "http://evil.example"):
        assert policy.origin_kind(foreign, "127.0.0.1:8080") is OriginKind.FOREIGN, foreign
    assert not BrowserPolicy.for_bind("127.0.0.1").allows_cross_origin and policy.allows_cross_origin


@pytest.mark.parametrize("hosts, origins, option", [
    (["*"], [], "--allowed-host '*'"), (["*.example.com"], [], "--allowed-host"), (["::1"], [], "in brackets"),
    (["http://x.example"], [], "no scheme"), (["x.example/path"], [], "no path"),
    ([], ["*"], "--allowed-origin '*'"), ([], ["null"], "no 'null'"), ([], ["app.example"], "http(s)://"),
    ([], ["ftp://app.example"], "--allowed-origin"), ([], ["https://app.example/page"], "no path"),
])
def test_a_malformed_or_wildcard_entry_is_refused_naming_it(hosts: list[str], origins: list[str], option: str) -> None:
    with pytest.raises(ValueError, match=option.replace("(", r"\(").replace(")", r"\)").replace("*", r"\*")):
        BrowserPolicy.for_bind("127.0.0.1", hosts, origins)


def test_cors_headers_name_the_origin_never_a_wildcard() -> None:
    for headers in (BrowserPolicy.cors_headers("https://app.example"),
                    BrowserPolicy.preflight_headers("https://app.example")):
        assert headers["Access-Control-Allow-Origin"] == "https://app.example"
        assert headers["Vary"] == "Origin"
        assert "*" not in headers.values()


def test_answers_stay_right_past_the_remembered_hosts() -> None:
    policy = BrowserPolicy.for_bind("127.0.0.1", ["proxy.example"])
    assert [policy.host_allowed(f"evil{n}.example") for n in range(3 * MAX_REMEMBERED_HOSTS)] == \
        [False] * (3 * MAX_REMEMBERED_HOSTS)
    assert policy.host_allowed("localhost:8080") and policy.host_allowed("proxy.example")
    assert not policy.host_allowed("evil0.example")
