"""The wire protocol, shared by every audience: the server runtime, the
client and the doors (``http_bridge``, ``mcp_bridge``).

- `constants`: metadata keys, defaults and limits (each defined once);
- `errors`: the one error table (reason → gRPC code → HTTP status);
- `convert`: ORS data types ⇄ their protobuf messages;
- `browser_policy`: which `Host` and `Origin` every door a browser can reach serves;
- `routed_ids`: session ids that name the backend that issued them (for Envoy).

Nothing here imports the runtime, the client or a door.
"""
