"""The Model Context Protocol door: MCP's streamable HTTP transport (the
official MCP Python SDK), translating onto the ORS gRPC service. One URL per
episode, `/{env}/mcp/{session_id}`; see docs/mcp.md."""

from ._http import McpDoor, start_mcp_door

__all__ = ["McpDoor", "start_mcp_door"]
