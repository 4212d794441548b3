"""``python -m bench --ecosystems``: other ecosystems' environments served by ors-grpc.

- reasoning-gym: episodes/s of ``ors-grpc serve reasoning-gym:leg_counting`` (create,
  prompt, one ``submit``, delete) through the HTTP door and the gRPC door;
- OpenEnv: the cost of fronting a running OpenEnv server (``ors-grpc serve
  openenv:URL``) against calling it directly with OpenEnv's own client, and the same
  environment hosted by ors-grpc (``openenv:MODULE:CLASS``); an episode is a reset and
  four steps (bench/openenv_env.py).

Every row gets fresh servers and a separate load generator process (``bench.load``,
bench/ecosystem_doors.py), in ``--rounds`` interleaved rounds; each row's median round is
reported. A row whose extra is missing says what to install.
"""

import argparse
import importlib.util
import statistics
import sys
from dataclasses import dataclass, field

from bench.ecosystem_doors import REASONING_GYM_SPEC
from bench.servers import ServerProcess, ours_server, run_load
from bench.stats import fmt_ms
from ors_grpc.extras import extra_install_command

OPENENV_CLASSES = ("bench.openenv_env:CountEnvironment", "bench.openenv_env:CountAction",
                   "bench.openenv_env:CountObservation")
#: The rows the fronting cost is read from: direct and fronted, under load and one episode at a time.
DIRECT, FRONTED = "OpenEnv direct", "OpenEnv fronted"
DIRECT_ONE, FRONTED_ONE = "OpenEnv direct, 1", "OpenEnv fronted, 1"


@dataclass
class Row:
    label: str
    how: str
    #: Closed-loop workers (None: --workers).
    workers: int | None = None
    loads: list[dict] = field(default_factory=list)
    skipped: str | None = None

    @property
    def load(self) -> dict:
        """The median round's load (by episodes/s)."""
        ranked = sorted(self.loads, key=lambda load: load["episodes"])
        return ranked[len(ranked) // 2]

    @property
    def episodes_per_second(self) -> float:
        return self.load["episodes"] / self.load["seconds"]


def openenv_server() -> ServerProcess:
    return ServerProcess("openenv", [sys.executable, "-m", "bench.openenv_server", *OPENENV_CLASSES])


def _measure(row: Row, door: str, servers: list[tuple[ServerProcess, set[str]]], target_of, args) -> None:
    """Start `servers` in order, load the target `target_of(servers)` names, stop them."""
    started: list[ServerProcess] = []
    try:
        for server, ports in servers:
            server.start(ports)
            started.append(server)
        timeout = args.warmup + args.duration + 120
        row.loads.append(run_load(door, target_of(started), "episodes", timeout, workers=row.workers or args.workers,
                                  warmup=args.warmup, duration=args.duration))
    except RuntimeError as exc:
        row.skipped = str(exc).splitlines()[0][:200]
    finally:
        for server in reversed(started):
            server.stop()


def _round(rows: dict[str, Row], args: argparse.Namespace) -> None:
    http = lambda started: f"http://127.0.0.1:{started[-1].ports['HTTP']}"  # noqa: E731
    grpc = lambda started: f"127.0.0.1:{started[-1].ports['gRPC']}"  # noqa: E731
    plans = {
        "reasoning-gym HTTP": ("rg-http", lambda: [(ours_server(True, REASONING_GYM_SPEC), {"gRPC", "HTTP"})], http),
        "reasoning-gym gRPC": ("rg-grpc", lambda: [(ours_server(False, REASONING_GYM_SPEC), {"gRPC"})], grpc),
        DIRECT: ("openenv-direct", lambda: [(openenv_server(), {"HTTP"})], http),
        FRONTED: ("openenv-grpc", None, grpc),
        DIRECT_ONE: ("openenv-direct", lambda: [(openenv_server(), {"HTTP"})], http),
        FRONTED_ONE: ("openenv-grpc", None, grpc),
        "OpenEnv hosted": ("openenv-grpc", lambda: [(ours_server(False, f"openenv:{OPENENV_CLASSES[0]}"), {"gRPC"})],
                           grpc),
    }
    for label, (door, servers, target_of) in plans.items():
        row = rows[label]
        if row.skipped:
            continue
        if servers is None:  # fronting: OpenEnv's server first, then ours onto its port
            openenv = openenv_server()
            try:
                openenv.start({"HTTP"})
            except RuntimeError as exc:
                row.skipped = str(exc).splitlines()[0][:200]
                continue
            try:
                url = f"http://127.0.0.1:{openenv.ports['HTTP']}"
                _measure(row, door, [(ours_server(False, f"openenv:{url}"), {"gRPC"})], target_of, args)
            finally:
                openenv.stop()
        else:
            _measure(row, door, servers(), target_of, args)


def run(args: argparse.Namespace) -> int:
    rows = {
        "reasoning-gym HTTP": Row("reasoning-gym HTTP", "serve reasoning-gym:leg_counting --http-port, raw aiohttp"),
        "reasoning-gym gRPC": Row("reasoning-gym gRPC", "serve reasoning-gym:leg_counting, ors_grpc.client"),
        DIRECT: Row(DIRECT, "OpenEnv's server, OpenEnv's GenericEnvClient (WebSocket)"),
        FRONTED: Row(FRONTED, "serve openenv:URL of that server, ors_grpc.client"),
        DIRECT_ONE: Row(DIRECT_ONE, "the same, one episode at a time", workers=1),
        FRONTED_ONE: Row(FRONTED_ONE, "the same, one episode at a time", workers=1),
        "OpenEnv hosted": Row("OpenEnv hosted", "serve openenv:bench.openenv_env:CountEnvironment, ors_grpc.client"),
    }
    for extra, module, labels in [("reasoning-gym", "reasoning_gym", list(rows)[:2]),
                                  ("openenv", "openenv", list(rows)[2:])]:
        if importlib.util.find_spec(module) is None:
            for label in labels:
                rows[label].skipped = f"needs the {extra} extra: {extra_install_command(extra)}"
    for _ in range(args.rounds):
        _round(rows, args)
    print(f"\n## Other ecosystems: {args.workers} workers, {args.duration:g} s (after {args.warmup:g} s warm-up),"
          f" median of {args.rounds} rounds")
    print(f"{'row':<20} {'episodes/s':>10} {'calls/s':>9} {'call p50':>9} {'call p99':>9} {'create p50':>10}"
          f" {'errors':>6}  how")
    for row in rows.values():
        if row.skipped or not row.loads:
            print(f"{row.label:<20} skipped: {row.skipped}")
            continue
        load = row.load
        print(f"{row.label:<20} {row.episodes_per_second:>10.1f} {load['tool_calls']['count'] / load['seconds']:>9.1f}"
              f" {fmt_ms(load['tool_calls']['p50']):>9} {fmt_ms(load['tool_calls']['p99']):>9}"
              f" {fmt_ms(load['creates']['p50']):>10} {load['errors']:>6}  {row.how}")
        if load["first_error"]:
            print(f"{'':<20} first error: {load['first_error']}")
    for direct_label, fronted_label in [(DIRECT, FRONTED), (DIRECT_ONE, FRONTED_ONE)]:
        direct, fronted = rows[direct_label], rows[fronted_label]
        if not (direct.loads and fronted.loads and direct.load["episodes"]) or direct.skipped or fronted.skipped:
            continue
        ratio = fronted.episodes_per_second / direct.episodes_per_second
        added = fronted.load["tool_calls"]["p50"] - direct.load["tool_calls"]["p50"]
        workers = fronted.workers or args.workers
        print(f"fronting cost ({workers} worker{'s' if workers != 1 else ''}): {ratio:.2f}x the direct episodes/s,"
              f" {fmt_ms(added)} ms more per step (p50); per round: " + ", ".join(
                  f"{f['episodes'] / max(1, d['episodes']):.2f}x" for d, f in zip(direct.loads, fronted.loads)))
    return 0 if all(not row.loads or statistics.median([load["errors"] for load in row.loads]) == 0
                    for row in rows.values()) else 1
