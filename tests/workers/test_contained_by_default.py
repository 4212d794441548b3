"""Contained by default: `ors-grpc serve` and `Server(...).run()` run environments' code in worker
processes unless told `--in-process`, and every environment that serves in-process serves in the
default too: a class defined in the script that serves it (the reference SDKs' usual shape) is
loaded by the workers from the script's file, without its main block running again; one that no
worker can load (no script file, made at run time) is served in-process, and one log line says so."""

from __future__ import annotations

import asyncio
import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.support.processes import children, descendants
from tests.support.reliability_helpers import grpc_call, grpc_episode, grpc_stub
from tests.support.servers import ROOT, ServeProcess, run_serve

pytestmark = pytest.mark.timeout(120)

WORKER_PROBE = "tests.support.worker_environments:WorkerProbeEnv"

#: An environment as the reference SDKs' examples write it: defined in the script that serves it.
SCRIPT_ENVIRONMENT = textwrap.dedent('''
    import os
    from pydantic import BaseModel
    from ors_grpc import Environment, Server, TextBlock, ToolOutput, tool

    class Guess(BaseModel):
        number: int

    class ScriptEnv(Environment):
        @classmethod
        def list_splits(cls):
            return ["train"]

        @classmethod
        def list_tasks(cls, split):
            return [{"secret": 7}]

        def get_prompt(self):
            return [TextBlock(text="Guess my number.")]

        @tool
        def guess(self, params: Guess) -> ToolOutput:
            """Guess; says which process answered."""
            right = params.number == 7
            return ToolOutput(blocks=[TextBlock(text="correct" if right else "wrong")],
                              metadata={"pid": os.getpid()}, reward=float(right), finished=right)
''')
#: Serves it; every run of the main block leaves its pid in `ran`.
SERVE_IT = '''
if __name__ == "__main__":
    with open("ran", "a") as ran:
        ran.write(f"{{os.getpid()}}\\n")
    Server([ScriptEnv]{config}).run(host="127.0.0.1", port=0, grpc_port=0)
'''


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


def _serve_command(*args: str) -> list[str]:
    """`ors-grpc serve` as written, without the test run's ORS_TEST_SERVE_ARGS: these tests are about the default."""
    return [sys.executable, "-m", "ors_grpc.cli", "serve", "--port", "0", *args]


async def _guess(serve: ServeProcess, env_name: str = "scriptenv") -> tuple[str, int]:
    async with grpc_stub(serve.grpc_target) as stub:
        sid = await grpc_episode(stub, "t", env_name=env_name)
        last = (await grpc_call(stub, sid, "guess", {"number": 7}))[-1]
    assert last.HasField("result"), last
    return last.result.output.blocks[0].text.text, json.loads(last.result.output.metadata.json)["pid"]


async def _pid(serve: ServeProcess) -> int:
    async with grpc_stub(serve.grpc_target) as stub:
        sid = await grpc_episode(stub, "t", env_name="workerprobeenv")
        last = (await grpc_call(stub, sid, "pid"))[-1]
    return json.loads(last.result.output.metadata.json)["pid"]


def test_ors_grpc_serve_runs_environments_in_worker_processes_unless_told_in_process(tmp_path: Path) -> None:
    with run_serve(_serve_command(WORKER_PROBE), cwd=ROOT, env=_env()) as serve:
        assert asyncio.run(_pid(serve)) != serve.proc.pid
    with run_serve(_serve_command(WORKER_PROBE, "--in-process"), cwd=ROOT, env=_env()) as serve:
        assert asyncio.run(_pid(serve)) == serve.proc.pid


@pytest.mark.parametrize("args", [["--in-process", "--workers", "2"], ["--in-process", "--isolation", "episode"]])
def test_in_process_with_workers_or_isolation_is_a_usage_error(args: list[str]) -> None:
    done = subprocess.run(_serve_command(*args), cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and "not allowed with argument" in done.stderr, done.stderr


def test_a_class_defined_in_the_serving_script_runs_in_workers_and_its_main_block_runs_once(tmp_path: Path) -> None:
    script = tmp_path / "guess_script.py"
    script.write_text(SCRIPT_ENVIRONMENT + SERVE_IT.format(config=""))
    with (tmp_path / "stderr").open("w") as stderr, \
            run_serve([sys.executable, str(script)], cwd=tmp_path, env=_env(), stderr=stderr) as serve:
        answer, pid = asyncio.run(_guess(serve))  # the tool's input model is the script's own class too
        assert answer == "correct" and pid in children(serve.proc.pid)
    assert (tmp_path / "ran").read_text().split() == [str(serve.proc.pid)]  # in no worker
    log = (tmp_path / "stderr").read_text()
    assert "serving_in_process" not in log
    # The script's server writes the lines `ors-grpc serve` and its workers write.
    assert re.search(r"^time=\S+ \S+ level=INFO logger=ors_grpc\.workers msg=workers_started", log, re.M), log


def test_a_script_without_a_main_guard_stops_where_it_would_serve_in_a_worker(tmp_path: Path) -> None:
    """As multiprocessing's spawn would run it again in full, recursively: here each worker runs the
    script up to `Server(...).run()`, and stops there with its classes defined."""
    script = tmp_path / "guess_script.py"
    script.write_text(SCRIPT_ENVIRONMENT + SERVE_IT.format(config="").replace(
        'if __name__ == "__main__":', "if True:  # no main guard"))
    with run_serve([sys.executable, str(script)], cwd=tmp_path, env=_env()) as serve:
        answer, pid = asyncio.run(_guess(serve))
        workers = children(serve.proc.pid)
        assert answer == "correct" and pid in workers
        assert sorted(descendants(serve.proc.pid)) == workers  # no worker started a server of its own
    ran = (tmp_path / "ran").read_text().split()
    assert ran[0] == str(serve.proc.pid) and sorted(int(p) for p in ran[1:]) == workers


def test_a_class_with_no_script_file_is_served_in_process_and_one_line_says_why(tmp_path: Path) -> None:
    code = SCRIPT_ENVIRONMENT + SERVE_IT.format(config="").replace(
        'if __name__ == "__main__":', "if True:")
    with (tmp_path / "stderr").open("w") as stderr, \
            run_serve([sys.executable, "-c", code], cwd=tmp_path, env=_env(), stderr=stderr) as serve:
        assert asyncio.run(_guess(serve)) == ("correct", serve.proc.pid)
    [line] = [line for line in (tmp_path / "stderr").read_text().splitlines() if "serving_in_process" in line]
    assert "'ScriptEnv' is defined in __main__ with no script file" in line and "python -c" in line


def test_asked_for_workers_a_class_they_cannot_load_fails_the_start_saying_why(tmp_path: Path) -> None:
    code = SCRIPT_ENVIRONMENT + SERVE_IT.format(config=", config=ServerConfig(workers=2)").replace(
        'if __name__ == "__main__":', "from ors_grpc.server import ServerConfig\nif True:")
    done = subprocess.run([sys.executable, "-c", code], cwd=tmp_path, env=_env(), capture_output=True, text=True,
                          timeout=60)
    assert done.returncode == 2, done.stderr
    assert "environment 'ScriptEnv' is defined in __main__ with no script file" in done.stderr
    assert "worker processes cannot load it" in done.stderr

