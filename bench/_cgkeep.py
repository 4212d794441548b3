"""Server instructions per episode, counted by valgrind's callgrind: ``python -m bench.callgrind``.

Episodes/s on a shared machine swing with its load (rounds of the same pair
of commits range from 0.6x to 3x); the instructions a server executes per
episode do not. The server (``serve bench.env:BenchEnv``, of this checkout
or of ``--tree``) runs under callgrind with counting off; this process runs
``--warmup`` episodes, turns counting on, runs ``--episodes`` more
(``--workers`` at a time, ``bench.load``'s episode, the same for every tree),
dumps the counts and prints them per episode: the event loop's thread (where
the service, the doors and the environment's code run) apart from the other
threads (grpc's poller and executors, whose share varies from run to run with
timing, and the loop monitor, which wakes per second of wall time, about
thirty times as many seconds here).

Both trees take the same path: the environment's code runs in the server
(`--in-process`, where a tree has it: older trees serve it there by default),
its sync code pinned to the loop (a thread hop depends on timing), and the HTTP bridge's quick-result
window is widened to 5 s (every `/call` answers in one response, however
slow the server is under valgrind). ``--door floor-http`` / ``floor-grpc`` /
``floor-grpc-unary`` count the floors' bare servers (``bench/floors.py``)
the same way. ``--worker`` serves ``--workers 1`` instead and counts the
worker process apart (valgrind traces it), the hop's cost on both sides.
Needs valgrind (``apt-get install valgrind``).
"""

import argparse
import asyncio
import re
import subprocess
import sys
import tempfile
from pathlib import Path

from bench.floors import SERVER_OF as FLOOR_SERVERS
from bench.load import make_door, run_episode
from bench.placements import descendants
from bench.servers import REPO_ROOT, ServerProcess

#: The server: serve as the CLI would, with the bridge's quick-result window widened (older trees lack it).
_SERVE = """import sys
try:
    import http_bridge.app
    http_bridge.app.QUICK_RESULT_S = 5.0
except (ImportError, AttributeError):
    pass
from ors_grpc.cli import _parser, main
try:  # environments' code in the server, where callgrind counts it (older trees serve it there by default)
    _parser().parse_args(["serve", "--in-process"])
    if "--workers" not in sys.argv:
        sys.argv.append("--in-process")
except SystemExit:
    pass
sys.exit(main())
"""
_TOTAL = re.compile(r"^(?:summary|totals): (\d+)", re.MULTILINE)


def python_of(tree: Path) -> str:
    """The interpreter of `tree`'s own virtualenv if it has one, else this one."""
    own = tree / ".venv" / "bin" / "python"
    return str(own) if own.exists() else sys.executable


def server_under_callgrind(tree: Path, door: str, out: Path, worker: bool = False) -> ServerProcess:
    valgrind = ["valgrind", "--tool=callgrind", "--instr-atstart=no", "--separate-threads=yes",
                *(["--trace-children=yes"] if worker else []), f"--callgrind-out-file={out}/cg.%p", python_of(tree)]
    if door in FLOOR_SERVERS:  # the floor's bare server, of this checkout (it has no code of the tree's)
        return ServerProcess(f"callgrind-{door}", [*valgrind, "-m", "bench.floors", FLOOR_SERVERS[door]])
    argv = [*valgrind, "-c", _SERVE, "serve", "bench.env:BenchEnv", "--port", "0",
            *(["--http-port", "0"] if door == "http" else []), *(["--workers", "1"] if worker else [])]
    server = ServerProcess(f"callgrind-{door}", argv, {"PYTHONPATH": str(tree), "ORS_BENCH_SYNC_CODE": "loop"})
    server.cwd = tree
    return server


async def run_episodes(door, count: int, workers: int) -> None:
    left = count

    async def worker() -> None:
        nonlocal left
        while left > 0:
            left -= 1
            await run_episode(door, lambda _: None, lambda _: None)

    await asyncio.gather(*(worker() for _ in range(workers)))


def callgrind_control(*args: str) -> None:
    subprocess.run(["callgrind_control", *args], check=True, capture_output=True)


async def count_episodes(server: ServerProcess, door: str, args: argparse.Namespace) -> None:
    http = door in ("http", "floor-http")
    target = f"http://127.0.0.1:{server.ports['HTTP']}" if http else f"127.0.0.1:{server.ports['gRPC']}"
    pids = [str(server.proc.pid), *map(str, descendants(server.proc.pid))]  # the server, and its worker
    async with make_door(door, target) as client:
        await run_episodes(client, args.warmup, args.workers)
        for pid in pids:
            callgrind_control("--instr=on", pid)
        await run_episodes(client, args.episodes, args.workers)
        for pid in pids:
            callgrind_control("--dump", pid)
            callgrind_control("--instr=off", pid)


def per_thread(out: Path, pid: int) -> dict[int, int]:
    """Instructions of `pid`'s first dump, by thread number (1 is the main thread: the event loop's)."""
    counted = {}
    for path in out.glob(f"cg.{pid}.1-*"):
        found = _TOTAL.search(path.read_text(errors="replace"))
        if found:
            counted[int(path.name.rpartition("-")[2])] = int(found.group(1))
    return counted


def measure(tree: Path, door: str, args: argparse.Namespace) -> list[tuple[float, float]]:
    """(loop thread, other threads) instructions per episode, in millions: the server's, then (with
    `--worker`) its worker process's."""
    out = tempfile.mkdtemp(prefix="ors-callgrind-keep-"); print("OUT", out)
    if True:
        with server_under_callgrind(tree, door, Path(out), args.worker) as server:
            server.start({"gRPC", "HTTP"} if door == "http" else {"HTTP"} if door == "floor-http" else {"gRPC"},
                         timeout=600)
            pids = [server.proc.pid, *descendants(server.proc.pid)]
            asyncio.run(count_episodes(server, door, args))
        counts = []
        for pid in pids:
            counted = per_thread(Path(out), pid)
            if 1 not in counted:
                raise RuntimeError(f"callgrind dumped no counts for {pid} (threads: {sorted(counted)})")
            loop = counted.pop(1)
            counts.append((loop / args.episodes / 1e6, sum(counted.values()) / args.episodes / 1e6))
    return counts


def parse_args(argv: list[str]) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m bench.callgrind", description=__doc__.splitlines()[0])
    parser.add_argument("--door", choices=("grpc", "http", *FLOOR_SERVERS), default="grpc",
                        help="grpc: our client's RunEpisode streams; http: the bridge, raw aiohttp; floor-*: the"
                             " floors' bare servers (bench/floors.py), whatever --tree says")
    parser.add_argument("--tree", type=Path, action="append",
                        help="a checkout whose server to count (again for several; default: this one)")
    parser.add_argument("--episodes", type=int, default=500)
    parser.add_argument("--warmup", type=int, default=30)
    parser.add_argument("--workers", type=int, default=4)
    parser.add_argument("--runs", type=int, default=1, help="runs per tree, interleaved")
    parser.add_argument("--worker", action="store_true",
                        help="serve with --workers 1 and count the worker process too (valgrind traces it)")
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(sys.argv[1:] if argv is None else argv)
    trees = args.tree or [REPO_ROOT]
    print(f"# server instructions per episode (M), {args.door} door, {args.episodes} episodes,"
          f" {args.workers} at a time, after {args.warmup}")
    print(f"{'tree':<40} {'process':<7} {'loop thread':>11} {'other threads':>13} {'all':>7}")
    for _ in range(args.runs):
        for tree in trees:
            counts = measure(tree.resolve(), args.door, args)
            for process, (loop, others) in zip(("server", "worker"), counts):
                print(f"{str(tree)[-40:]:<40} {process:<7} {loop:>11.3f} {others:>13.3f} {loop + others:>7.3f}",
                      flush=True)
            if len(counts) > 1:
                print(f"{str(tree)[-40:]:<40} {'both':<7} {sum(c[0] for c in counts):>11.3f}"
                      f" {sum(c[1] for c in counts):>13.3f} {sum(sum(c) for c in counts):>7.3f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
