"""``python -m bench --placements``: where environments' code runs, compared in one run.

Rows are ``ors-grpc serve`` arguments: ``--in-process``,
``--workers 1``, ``--workers 2`` (the default, ``auto``, on two CPUs) and ``--isolation episode``, each on three
workloads: the trivial ``bench.env:BenchEnv``, and ``bench.cpu_env``'s
``step`` spending 2 ms of pure-Python CPU as a sync tool and as an
``async def`` tool. Every row gets a fresh server and the same closed loop
as the main benchmark, through our Python client on the gRPC door:
episodes/s, tool-call p50/p99, the creation's p50/p99 (the `create` step,
as the client sees it) and the CPU of the server and every process under it,
as a share of a core and in milliseconds per episode ("of it procs": the
processes' part).
Where the server has processes under it (workers, episode processes), their
count and their memory (USS: private pages, from ``/proc/PID/smaps_rollup``)
are sampled half-way through the measured window.

A row whose arguments ``serve`` rejects (a server without worker mode) is
reported as ``not available:`` with serve's own one-line error, and is not
tried again in later rounds.
"""

import argparse
import os
import pathlib
import statistics
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field

from bench.servers import ours_server, run_load
from bench.stats import fmt_ms

#: (row label, serve arguments).
PLACEMENTS: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("in-process", ("--in-process",)),
    ("--workers 1", ("--workers", "1")),
    ("--workers 2", ("--workers", "2")),
    ("--isolation episode", ("--isolation", "episode")),
)
#: (workload name, environment to serve).
WORKLOADS: dict[str, str] = {
    "trivial": "bench.env:BenchEnv",
    "cpu-sync": "bench.cpu_env:SyncCpuEnv",
    "cpu-async": "bench.cpu_env:AsyncCpuEnv",
}
MIB = 1024 * 1024
#: The workload whose rows also measure a creation with the pool warm: episodes one at a time,
#: each `PACED_PAUSE_S` after the last (a closed loop empties any pool).
PACED_WORKLOAD = "trivial"
PACED_CREATIONS = 40
PACED_PAUSE_S = 0.1


@dataclass
class Row:
    workload: str
    placement: str
    load: dict | None = None
    #: serve's one-line error when it rejected the row's arguments.
    unavailable: str | None = None
    #: `bench.load --mode creations`: creations one at a time, the pool warm (PACED_WORKLOAD only).
    paced: dict | None = None
    #: USS in bytes of each process under the server, half-way through.
    child_uss: list[int] = field(default_factory=list)
    rounds: list[float] = field(default_factory=list)

    @property
    def episodes_per_second(self) -> float:
        return self.load["episodes"] / self.load["seconds"] if self.load else 0.0

    @property
    def cpu_ms_per_episode(self) -> float:
        """Milliseconds of CPU of the server and the processes under it per episode (`server_cpu`, the share of
        a core over the whole load, over the measured episodes/s)."""
        eps = self.episodes_per_second
        return self.load["server_cpu"] / eps * 1000 if eps else float("nan")

    @property
    def children_cpu_ms_per_episode(self) -> float:
        """The part of `cpu_ms_per_episode` spent by the processes under the server."""
        eps = self.episodes_per_second
        return self.load["children_cpu"] / eps * 1000 if eps else float("nan")


# --- processes under the server ----------------------------------------------

def _stat_fields(pid: int) -> list[str]:
    return pathlib.Path(f"/proc/{pid}/stat").read_text().rpartition(")")[2].split()


def descendants(pid: int) -> list[int]:
    """Every live process under `pid` (children, their children...)."""
    parents: dict[int, list[int]] = {}
    for entry in pathlib.Path("/proc").iterdir():
        if entry.name.isdigit():
            try:
                parents.setdefault(int(_stat_fields(int(entry.name))[1]), []).append(int(entry.name))
            except (OSError, IndexError):
                continue  # ended meanwhile
    found, todo = [], [pid]
    while todo:
        for child in parents.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def tree_cpu_seconds(pid: int) -> float:
    """CPU seconds of `pid` and every process under it: the live ones' own,
    and the ended ones' (counted in their parent's cutime/cstime once reaped)."""
    return sum(split_cpu_seconds(pid))


def split_cpu_seconds(pid: int) -> tuple[float, float]:
    """`tree_cpu_seconds` as (`pid`'s own, the processes' under it)."""
    own = under = 0
    for proc in [pid, *descendants(pid)]:
        try:
            fields = _stat_fields(proc)
        except OSError:
            continue
        if proc == pid:
            own += int(fields[11]) + int(fields[12])  # utime, stime
            under += int(fields[13]) + int(fields[14])  # cutime, cstime: reaped children
        else:
            under += sum(int(value) for value in fields[11:15])
    return own / os.sysconf("SC_CLK_TCK"), under / os.sysconf("SC_CLK_TCK")


def uss_bytes(pid: int) -> int | None:
    """Unique set size of `pid` (its private pages), None if it ended."""
    try:
        text = pathlib.Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None
    kib = 0
    for line in text.splitlines():
        key, _, rest = line.partition(":")
        if key in ("Private_Clean", "Private_Dirty", "Private_Hugetlb"):
            kib += int(rest.split()[0])
    return kib * 1024


# --- measuring ---------------------------------------------------------------

def serve_error(exc: Exception, server_name: str) -> str:
    """serve's own last line (argparse's `error: ...`) from a failed start."""
    lines = [line for line in str(exc).removeprefix(f"{server_name} did not start: ").splitlines() if line.strip()]
    return lines[-1].strip()[:300] if lines else type(exc).__name__


def measure(workload: str, placement: str, serve_args: tuple[str, ...], args: argparse.Namespace) -> Row:
    row = Row(workload, placement)
    server = ours_server(http=False, environment=WORKLOADS[workload], serve_args=serve_args)
    try:
        server.start({"gRPC"})
    except (RuntimeError, OSError) as exc:
        row.unavailable = serve_error(exc, server.name)
        return row
    with server:
        assert server.proc is not None
        pid = server.proc.pid
        target = f"127.0.0.1:{server.ports['gRPC']}"
        cpu_before, wall_before = split_cpu_seconds(pid), time.perf_counter()
        with ThreadPoolExecutor(1) as pool:
            load = pool.submit(run_load, "grpc", target, "episodes", args.warmup + args.duration + 120,
                               workers=args.workers, warmup=args.warmup, duration=args.duration)
            half_way = time.monotonic() + args.warmup + args.duration / 2
            while not load.done() and time.monotonic() < half_way:
                time.sleep(0.05)
            row.child_uss = [uss for uss in map(uss_bytes, descendants(pid)) if uss is not None]
            row.load = load.result()
        own, under = (after - before for after, before in zip(split_cpu_seconds(pid), cpu_before))
        wall = time.perf_counter() - wall_before
        row.load["server_cpu"], row.load["children_cpu"] = (own + under) / wall, under / wall
        if workload == PACED_WORKLOAD:
            row.paced = run_load("grpc", target, "creations", 120, count=PACED_CREATIONS, pause=PACED_PAUSE_S)
    return row


def median_round(rounds: list[Row]) -> Row:
    measured = sorted((r for r in rounds if r.load), key=lambda r: r.episodes_per_second)
    if not measured:
        return rounds[0]
    median = measured[(len(measured) - 1) // 2]
    median.rounds = [r.episodes_per_second for r in rounds if r.load]
    return median


def measure_all(args: argparse.Namespace) -> list[Row]:
    """Every row in turn, `args.rounds` times (a slow spell hits one round of
    every row, not every round of one); each row's median round."""
    rejected: dict[str, str] = {}
    rounds: dict[tuple[str, str], list[Row]] = {}
    for _ in range(args.rounds):
        for workload in args.placement_workloads:
            for placement, serve_args in PLACEMENTS:
                if placement not in args.placement_rows:
                    continue
                if placement in rejected:
                    row = Row(workload, placement, unavailable=rejected[placement])
                else:
                    row = measure(workload, placement, serve_args, args)
                    if row.unavailable:
                        rejected[placement] = row.unavailable
                rounds.setdefault((workload, placement), []).append(row)
    return [median_round(rows) for rows in rounds.values()]


# --- report ------------------------------------------------------------------

def print_table(rows: list[Row], args: argparse.Namespace) -> None:
    print(f"\n## Where environments' code runs: {args.workers} workers, {args.duration:g} s"
          f" (after {args.warmup:g} s warm-up), gRPC door (ors_grpc.client), median of {args.rounds} round(s)")
    print(f"{'workload':<10} {'serve args':<20} {'episodes/s':>10} {'vs in-proc':>10} {'p50 ms':>8} {'p99 ms':>8}"
          f" {'create p50':>10} {'create p99':>10} {'errors':>6} {'server CPU':>10} {'CPU ms/ep':>9}"
          f" {'of it procs':>11} {'procs':>5}"
          f" {'USS/proc MiB':>12}")
    in_process = {r.workload: r for r in rows if r.placement == "in-process" and r.load}
    for row in rows:
        label = f"{row.workload:<10} {row.placement:<20}"
        if row.unavailable:
            print(f"{label} not available: {row.unavailable}")
            continue
        load = row.load
        base = in_process.get(row.workload)
        versus = f"{row.episodes_per_second / base.episodes_per_second:.2f}x" if base and base.episodes_per_second else ""
        uss = f"{statistics.median(row.child_uss) / MIB:.1f}" if row.child_uss else "-"
        print(f"{label} {row.episodes_per_second:>10.1f} {versus:>10} {fmt_ms(load['tool_calls']['p50']):>8}"
              f" {fmt_ms(load['tool_calls']['p99']):>8} {fmt_ms(load['creates']['p50']):>10}"
              f" {fmt_ms(load['creates']['p99']):>10} {load['errors']:>6} {load['server_cpu']:>10.0%}"
              f" {row.cpu_ms_per_episode:>9.2f} {row.children_cpu_ms_per_episode:>11.2f} {len(row.child_uss):>5}"
              f" {uss:>12}")
        if load["first_error"]:
            print(f"{'':<31} first error: {load['first_error']}")
    print_paced(rows)
    if args.rounds > 1:
        print(f"episodes/s in each of {args.rounds} rounds (rows above: each row's median round):")
        for row in rows:
            if row.rounds:
                print(f"{row.workload:<10} {row.placement:<20} " + "  ".join(f"{eps:.1f}" for eps in row.rounds))


def print_paced(rows: list[Row]) -> None:
    paced = [row for row in rows if row.paced]
    if not paced:
        return
    print(f"\n## Creation with the pool warm: {PACED_WORKLOAD}, {PACED_CREATIONS} episodes one at a time,"
          f" {PACED_PAUSE_S:g} s apart (in the round shown above)")
    print(f"{'serve args':<20} {'create p50':>10} {'create p99':>10} {'p50 over in-proc':>16} {'errors':>6}")
    base = next((row.paced["creates"]["p50"] for row in paced if row.placement == "in-process"), None)
    for row in paced:
        creates = row.paced["creates"]
        over = f"{fmt_ms(creates['p50'] - base)}" if base is not None else ""
        print(f"{row.placement:<20} {fmt_ms(creates['p50']):>10} {fmt_ms(creates['p99']):>10} {over:>16}"
              f" {row.paced['errors']:>6}")


def run(args: argparse.Namespace) -> int:
    cpu_ms = os.environ.get("ORS_BENCH_CPU_MS", "2")
    print(f"workloads: trivial (bench.env), cpu-sync / cpu-async (bench.cpu_env: each step spends {cpu_ms} ms"
          " of Python CPU, as a sync tool / an async def tool); USS/proc: median private memory of the processes"
          " under the server (workers, episode processes), sampled half-way")
    print_table(measure_all(args), args)
    return 0
