"""The server runtime (internal: no public API here; serve with
``ors_grpc.server`` or the ``ors-grpc`` command).

- `grpc_server`: builds the grpc.aio server (interceptors, health, reflection);
- `service`: ``ors.v1.EnvironmentService``, one handler per RPC;
- `sessions`: the session table (every episode, setup, reaper);
- `tool_calls`, `exclusive_gate`: tool calls as tasks, and the gate of
  exclusive and terminal tools;
- `warm_pool`: episodes prepared ahead;
- `environment_host`: the one seam to environments' code (an episode's
  host with its lifecycle state, a class's catalog host, their factory);
- `local_hosts`: its in-process implementation, over `user_code` (where
  environment code runs: loop or user-code thread);
- `workers/`: its implementation in supervised worker processes
  (`--workers N`, `--isolation episode`; docs/workers.md);
- `inprocess`: a channel onto the service without a socket.
"""
