"""A very short run of the benchmark (``python -m bench``) so that it does not rot.

No timing assertions: this only checks that every door starts, carries whole
episodes, the large image and idle sessions without errors, and that the
report is printed.
"""

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_bench_runs_every_door_briefly():
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--workers", "2", "--warmup", "0", "--duration", "0.3", "--rounds", "2",
         "--image-mib", "0.0625", "--image-calls", "1", "--sessions", "10"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = done.stdout
    assert "skipped" not in report, report
    assert "first error" not in report, report
    for door in ("reference", "bridge", "grpc", "bridge-threads", "grpc-threads"):
        assert any(line.startswith(door + " ") for line in report.splitlines()), (door, report)
    for heading in ("## Closed loop", "episodes/s in each of 2 rounds", "MiB image block", "## Resident memory"):
        assert heading in report, report


def test_bench_setup_seconds_mode_runs_both_loops_briefly():
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--setup-seconds", "0.05", "--batch", "2", "--batches", "2"],
        cwd=ROOT, capture_output=True, text=True, timeout=120,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    lines = done.stdout.splitlines()
    for row in ("cold ", "prepared "):
        assert any(line.startswith(row) and len(line.split()) == 6 for line in lines), (row, done.stdout)
    assert any(line.startswith("batch-loop ratio (cold / prepared, 2 batches): ") for line in lines), done.stdout
    assert any(line.startswith("per-batch ratio from batch 2 on (median): ") for line in lines), done.stdout
