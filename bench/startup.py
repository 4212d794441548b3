"""``python -m bench.startup``: how long ``ors-grpc serve`` takes to be ready, by mode.

For each mode (``serve`` arguments; rows interleaved, ``--rounds`` times) a
fresh server is started and three moments are read, from the start of the
process: its doors announced (``gRPC listening``), its health SERVING, and
the end of a first episode's first tool call (create, call, delete, through
the Python client); and the CPU the server and every process under it spent
until then (on a loaded machine wall time follows the load; CPU does not).
Prints each mode's median and its difference from the in-process row. The
figures of the day are in docs/benchmarks.md.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import time
from dataclasses import dataclass

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ors_grpc.client import ORSClient

#: (row label, serve arguments).
MODES: tuple[tuple[str, tuple[str, ...]], ...] = (
    ("in-process", ("--in-process",)),
    ("default (workers auto)", ()),
    ("--workers 2", ("--workers", "2")),
)
ENVIRONMENT = "bench.env:BenchEnv"


@dataclass
class Start:
    listening_s: float
    serving_s: float
    first_call_s: float
    cpu_s: float


def cpu_seconds(pid: int) -> float:
    """User and system CPU of `pid` and every process under it (Linux /proc), in seconds."""
    total, todo = 0.0, [pid]
    tick = os.sysconf("SC_CLK_TCK")
    while todo:
        current = todo.pop()
        try:
            with open(f"/proc/{current}/stat") as stat:
                fields = stat.read().rsplit(")", 1)[1].split()
            with open(f"/proc/{current}/task/{current}/children") as children:
                todo += [int(child) for child in children.read().split()]
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def start_once(serve_args: tuple[str, ...]) -> Start:
    started = time.monotonic()
    proc = subprocess.Popen([sys.executable, "-m", "ors_grpc.cli", "--log-level", "WARNING", "serve", ENVIRONMENT,
                             "--port", "0", *serve_args], stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None
        target = None
        for line in proc.stdout:
            if line.startswith("gRPC listening on "):
                target = line.split()[-1]
                break
        if target is None:
            raise RuntimeError(f"serve {' '.join(serve_args)} exited with status {proc.wait()}")
        listening = time.monotonic() - started
        with grpc.insecure_channel(target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            while health.Check(health_pb2.HealthCheckRequest()).status != health_pb2.HealthCheckResponse.SERVING:
                time.sleep(0.005)
        serving = time.monotonic() - started
        with ORSClient(target) as client:
            with client.environment("benchenv").session(split="train", index=0) as session:
                session.call_tool("step", {"n": 1})
        first_call = time.monotonic() - started
        return Start(listening, serving, first_call, cpu_seconds(proc.pid))
    finally:
        proc.terminate()
        proc.wait()


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m bench.startup", description=__doc__.splitlines()[0])
    parser.add_argument("--rounds", type=int, default=5, help="starts per mode, interleaved")
    args = parser.parse_args(argv)
    starts: dict[str, list[Start]] = {label: [] for label, _ in MODES}
    for _ in range(args.rounds):
        for label, serve_args in MODES:
            starts[label].append(start_once(serve_args))
    base = cpu_base = None
    print(f"start-up of `ors-grpc serve {ENVIRONMENT}`, median of {args.rounds} (s from the process's start):")
    print(f"{'mode':<24} {'listening':>10} {'SERVING':>10} {'first call':>11} {'vs in-process':>14} "
          f"{'CPU s':>7} {'vs in-process':>14}")
    for label, _ in MODES:
        rows = starts[label]
        listening, serving, first, cpu = (statistics.median(getattr(s, f) for s in rows)
                                          for f in ("listening_s", "serving_s", "first_call_s", "cpu_s"))
        base = first if base is None else base
        cpu_base = cpu if cpu_base is None else cpu_base
        print(f"{label:<24} {listening:>10.3f} {serving:>10.3f} {first:>11.3f} {first - base:>+14.3f} "
              f"{cpu:>7.2f} {cpu - cpu_base:>+14.2f}")


if __name__ == "__main__":
    main()
