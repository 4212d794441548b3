"""OpenEnv's own server (`create_app` under uvicorn) for an environment class, on a free
loopback port: what `openenv:URL` fronts, in the benchmark and in the tests.

    python -m bench.openenv_server MODULE:ENV MODULE:ACTION MODULE:OBSERVATION [--max-concurrent N]

prints `HTTP listening on 127.0.0.1:PORT` (as `ors-grpc serve` announces a door) once
it accepts connections, and serves until SIGINT or SIGTERM."""

import argparse
import asyncio
import importlib
import os
import socket
import sys

import uvicorn
from openenv.core.env_server import create_app

#: What the server prints once it listens (the port follows).
LISTENING = "HTTP listening on 127.0.0.1:"


def load(path: str) -> object:
    module, _, name = path.partition(":")
    return getattr(importlib.import_module(module), name)


async def serve(args: argparse.Namespace) -> None:
    app = create_app(load(args.env), load(args.action), load(args.observation), max_concurrent_envs=args.max_concurrent)
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    server = uvicorn.Server(uvicorn.Config(app, log_level="warning"))
    task = asyncio.create_task(server.serve(sockets=[sock]))
    while not server.started and not task.done():
        await asyncio.sleep(0.05)
    print(LISTENING + str(sock.getsockname()[1]), flush=True)
    # Nobody need read on after this line (a test's pipe): nothing more to stdout.
    os.dup2(os.open(os.devnull, os.O_WRONLY), 1)
    await task


def main(argv: list[str]) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.openenv_server", description=__doc__.splitlines()[0])
    parser.add_argument("env")
    parser.add_argument("action")
    parser.add_argument("observation")
    parser.add_argument("--max-concurrent", type=int, default=64, help="OpenEnv's max_concurrent_envs (64)")
    if "" not in sys.path:
        sys.path.insert(0, "")
    asyncio.run(serve(parser.parse_args(argv)))


if __name__ == "__main__":
    main(sys.argv[1:])
