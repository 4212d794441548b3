"""A very short run of the benchmark's MCP door (``python -m bench --door mcp``)
so that it does not rot. No timing assertions: it only checks that the door
carries episodes without errors beside the bridge and that the report is printed."""

import subprocess
import sys

from tests.support.servers import ROOT


def test_bench_door_mcp_runs_the_mcp_door_next_to_the_bridge_briefly():
    done = subprocess.run(
        [sys.executable, "-m", "bench", "--door", "mcp", "--workers", "2", "--warmup", "0", "--duration", "0.3",
         "--rounds", "1", "--image-mib", "0.0625", "--image-calls", "1"],
        cwd=ROOT, capture_output=True, text=True, timeout=240,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    report = done.stdout
    assert "skipped" not in report and "first error" not in report, report
    rows = [line.split()[0] for line in report.split("## Closed loop")[1].splitlines()[2:4]]
    assert rows == ["bridge", "mcp"], report
    assert "## Resident memory" not in report, report
