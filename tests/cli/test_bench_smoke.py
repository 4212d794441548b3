"""A very short run of the benchmark (``python -m bench``) so that it does not rot.

No timing assertions: this only checks that every door starts, carries whole
episodes, the large image and idle sessions without errors, and that the
report is printed.
"""

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from ors_grpc.extras import extra_install_command

ROOT = Path(__file__).resolve().parents[2]


def bench_report(*args: str, module: str = "bench", timeout: float = 240) -> str:
    """What `python -m <module> <args>` printed, once it exited 0 (its stderr's tail otherwise)."""
    done = subprocess.run([sys.executable, "-m", module, *args], cwd=ROOT, capture_output=True, text=True,
                          timeout=timeout)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout


def test_bench_runs_every_door_briefly():
    report = bench_report("--workers", "2", "--warmup", "0", "--duration", "0.3", "--rounds", "2",
                          "--image-mib", "0.0625", "--image-calls", "1", "--sessions", "10")
    assert "skipped" not in report, report
    assert "first error" not in report, report
    for door in ("reference", "bridge", "grpc", "bridge-threads", "grpc-threads", "floor-http", "floor-grpc",
                 "floor-grpc-unary"):
        assert any(line.startswith(door + " ") for line in report.splitlines()), (door, report)
    for heading in ("## Closed loop", "episodes/s in each of 2 rounds", "MiB image block", "## Resident memory"):
        assert heading in report, report
    shares = report.split("as a share of its floor's")[1].split("##")[0].splitlines()[1:]
    pairs = [(line.split()[0], line.split()[3]) for line in shares if line.strip()]
    assert pairs == [("bridge", "floor-http"), ("grpc", "floor-grpc"), ("grpc", "floor-grpc-unary"),
                     ("bridge-threads", "floor-http"), ("grpc-threads", "floor-grpc"),
                     ("grpc-threads", "floor-grpc-unary")], report


def test_bench_setup_seconds_mode_runs_both_loops_briefly():
    report = bench_report("--setup-seconds", "0.05", "--batch", "2", "--batches", "2", timeout=120)
    lines = report.splitlines()
    for row in ("cold ", "prepared "):
        assert any(line.startswith(row) and len(line.split()) == 6 for line in lines), (row, report)
    assert any(line.startswith("batch-loop ratio (cold / prepared, 2 batches): ") for line in lines), report
    assert any(line.startswith("per-batch ratio from batch 2 on (median): ") for line in lines), report


def test_bench_against_a_commit_runs_both_sides_of_both_doors_and_removes_its_checkout():
    report = bench_report("--against", "HEAD", "--workers", "2", "--warmup", "0", "--duration", "0.3",
                          "--rounds", "2")
    assert "skipped" not in report and "first error" not in report, report
    rows = [line.split()[:2] for line in report.split("## Closed loop")[1].splitlines()[2:6]]
    assert rows == [["bridge", "HEAD"], ["bridge", "this"], ["grpc", "HEAD"], ["grpc", "this"]], report
    ratios = report.split("episodes/s of this over HEAD")[1].splitlines()[1:3]
    assert [line.split()[0] for line in ratios] == ["bridge", "grpc"], report
    shares = report.split("as a share of the floor's")[1].splitlines()[1:5]
    assert [(line.split()[0], line.split()[1], line.split()[4]) for line in shares] == [
        ("bridge", "HEAD", "floor-http"), ("grpc", "HEAD", "floor-grpc"),
        ("bridge", "this", "floor-http"), ("grpc", "this", "floor-grpc")], report
    checkout = report.split("(checked out in ")[1].split(")")[0]
    assert not Path(checkout).exists(), report
    worktrees = subprocess.run(["git", "worktree", "list"], cwd=ROOT, capture_output=True, text=True).stdout
    assert checkout not in worktrees, worktrees


def test_bench_placements_mode_prints_every_row_measured_or_why_not():
    report = bench_report("--placements", "--workers", "2", "--warmup", "0", "--duration", "1", "--rounds", "1")
    assert "## Where environments' code runs" in report, report
    lines = report.splitlines()
    for workload in ("trivial", "cpu-sync", "cpu-async"):
        for placement in ("in-process", "--workers 1", "--workers 2", "--isolation episode"):
            prefix = f"{workload:<10} {placement:<20} "
            row = next((line for line in lines if line.startswith(prefix)), None)
            assert row is not None, (workload, placement, report)
            rest = row[len(prefix):]
            if placement == "in-process" or not rest.startswith("not available: "):
                # Measured: episodes/s ... errors (0), server CPU, CPU ms per episode, the processes' part of it,
                # procs, and the USS column.
                fields = rest.split()
                assert len(fields) == 12 and float(fields[0]) > 0 and fields[6] == "0" and float(fields[8]) > 0, row
            else:
                assert "error" in rest and "did not start" not in rest, row  # serve's own one-line error


@pytest.mark.skipif(shutil.which("valgrind") is None, reason="needs valgrind")
def test_bench_callgrind_counts_a_few_episodes_of_this_checkout():
    report = bench_report("--episodes", "3", "--warmup", "1", "--workers", "1", module="bench.callgrind", timeout=600)
    loop, others, total = (float(figure) for figure in report.splitlines()[-1].split()[-3:])
    assert loop > 0 and others >= 0 and total == pytest.approx(loop + others, abs=0.002), report


def test_bench_ecosystems_mode_runs_reasoning_gym_through_both_doors_briefly():
    # OpenEnv's rows run where its extra is (tests/mcp/test_openenv.py); here they say what to install.
    report = bench_report("--ecosystems", "--workers", "2", "--warmup", "0", "--duration", "0.5", "--rounds", "1")
    table = report.split("## Other ecosystems")[1].splitlines()[2:9]
    rows = {line[:20].strip(): line[20:].split() for line in table}
    for label in ("reasoning-gym HTTP", "reasoning-gym gRPC"):
        assert float(rows[label][0]) > 0 and rows[label][5] == "0", report
    assert "first error" not in report, report
    for label in ("OpenEnv direct", "OpenEnv fronted", "OpenEnv direct, 1", "OpenEnv fronted, 1", "OpenEnv hosted"):
        assert rows[label][0] == "skipped:", report
        hint = f"needs the openenv extra: {extra_install_command('openenv')}"
        assert " ".join(rows[label]).endswith(hint), report


def test_bench_crowd_mode_completes_every_episode_in_both_modes():
    # Two load-generator processes share the crowd, so the merge of their shares is exercised too.
    report = bench_report("--crowd", "12", "--crowd-think-s", "0.05", "--crowd-procs", "2", "--crowd-rounds", "2")
    assert "## Crowd: 12 concurrent gRPC episodes, 0.05 s think time, 2 load-generator process(es)" in report, report
    assert "first error" not in report and "not available" not in report, report
    lines = report.splitlines()
    for mode in ("in-process", "default"):
        row = next(line for line in lines if line.startswith(f"{mode} ")).split()  # the table's, the first
        # mode, ok, failed, p50, p99, max, p99 of create/prompt/call/delete, episode overhead p99, wall, CPU,
        # peak RSS, the load generators' CPU, load average.
        assert len(row) == 16, row
        assert row[1:3] == ["12", "0"], row  # every episode completed, none failed
        assert all(float(cell) >= 0 for cell in row[3:13]) and float(row[13]) > 0, row
        assert len(row[14].split("/")) == 2, row  # one CPU share per load generator
    assert any(line.startswith("default / in-process, p99 of all steps: ") for line in lines), report
    for mode in ("in-process", "default"):
        rounds = next(line for line in lines if line.startswith(f"{mode} ") and "in each round" in line)
        assert len(rounds.split(":")[1].split()) == 2, rounds
