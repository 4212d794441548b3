"""Run the reference ``ors-sdk`` server on ``bench/env.py``: ``python -m bench.ref_server``.

The environment module is loaded from the same source file as ours, with
``from ors_grpc import`` replaced by ``from ors import``. The server runs the
way ``ors.Server.run`` runs it (its logging set up, uvicorn with its default
loop and HTTP implementation, ``timeout_keep_alive=60``, no access log), but on
a socket bound to 127.0.0.1 port 0, whose port it prints like ``ors-grpc
serve`` does: ``HTTP listening on 127.0.0.1:<port>``.
"""

import importlib.util
import pathlib
import socket
import sys
import types

ENV_SOURCE = pathlib.Path(__file__).with_name("env.py")


def load_reference_env() -> type:
    """Import ``bench/env.py`` against the reference SDK and return ``BenchEnv``."""
    source = ENV_SOURCE.read_text().replace("from ors_grpc import", "from ors import")
    module = types.ModuleType("bench_env_reference")
    module.__file__ = str(ENV_SOURCE)
    sys.modules[module.__name__] = module
    exec(compile(source, str(ENV_SOURCE), "exec"), module.__dict__)
    return module.BenchEnv


def bind_loopback() -> socket.socket:
    """What ``uvicorn.run(host=..., port=...)`` would bind, but on port 0.

    ``proto=IPPROTO_TCP`` matters: asyncio sets TCP_NODELAY only on sockets
    whose proto says TCP, and without it every keep-alive response waits ~40 ms
    for a delayed ACK (Nagle).
    """
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", 0))
    sock.listen(2048)
    sock.set_inheritable(True)
    return sock


def main() -> None:
    import ors
    import uvicorn
    from ors._log import setup_logging

    app = ors.Server([load_reference_env()]).app
    setup_logging()
    sock = bind_loopback()
    config = uvicorn.Config(app, timeout_keep_alive=60, access_log=False, backlog=2048)
    server = uvicorn.Server(config)
    # What uvicorn's "auto" picked, so that the report can say so.
    loop_impl = "uvloop" if importlib.util.find_spec("uvloop") else "asyncio"
    http_impl = "httptools" if importlib.util.find_spec("httptools") else "h11"
    print(f"reference: uvicorn {uvicorn.__version__} loop={loop_impl} http={http_impl}", flush=True)
    print(f"HTTP listening on 127.0.0.1:{sock.getsockname()[1]}", flush=True)
    server.run(sockets=[sock])


if __name__ == "__main__":
    main()
