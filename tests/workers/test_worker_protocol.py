"""A worker process speaking the hop with a test in the server's place: construct answers which
lifecycle steps the environment defines (the server sends no step it does not define, as in-process
runs no code for it), and `end` forgets an episode unless its teardown is still to come."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import pytest

from ors_grpc._runtime.workers.hop import Hello, Ready, Setup, recv_frame, send_frame
from tests.support.reliability_environments import MARKER_DIR_VARIABLE
from tests.support.reliability_helpers import grpc_call, grpc_episode, grpc_stub
from tests.support.servers import ROOT, start_serve

pytestmark = pytest.mark.timeout(60)

ENVIRONMENTS = {
    "plain": "tests.support.worker_environments:NoLifecycleEnv",
    "instance": "tests.support.worker_environments:InstanceSetupEnv",
    "probe": "tests.support.worker_environments:WorkerProbeEnv",
    "teardown_only": "tests.support.reliability_environments:ProbeEnv",
}


class Hop:
    """The server's end of one worker's hop, one call at a time."""

    def __init__(self, connection: socket.socket) -> None:
        self.connection = connection
        self.call_ids = iter(range(1, 1000))

    def call(self, op: str, *args: Any) -> tuple[bool, Any]:
        call_id = next(self.call_ids)
        send_frame(self.connection, (call_id, op, args))
        answered, ok, value = recv_frame(self.connection)
        assert answered == call_id
        return ok, value

    def tell(self, op: str, *args: Any) -> None:
        send_frame(self.connection, (0, op, args))


@contextmanager
def worker(tmp_path: Path) -> Iterator[Hop]:
    path = str(tmp_path / "hop.sock")
    with socket.socket(socket.AF_UNIX) as listener:
        listener.bind(path)
        listener.listen(1)
        listener.settimeout(30)
        process = subprocess.Popen([sys.executable, "-m", "ors_grpc._runtime.workers.worker", path, "1",
                                    str(os.getpid())], cwd=ROOT,
                                   env={**os.environ, MARKER_DIR_VARIABLE: str(tmp_path)})
        try:
            connection, _ = listener.accept()
            with connection:
                connection.settimeout(30)
                assert recv_frame(connection) == Hello(1, process.pid)
                send_frame(connection, Setup(sys_path=sys.path, environments=ENVIRONMENTS))
                assert recv_frame(connection) == Ready()
                yield Hop(connection)
        finally:
            process.kill()
            process.wait()


def test_construct_answers_which_lifecycle_steps_the_environment_defines(tmp_path: Path) -> None:
    with worker(tmp_path) as hop:
        assert hop.call("construct", 1, "plain", {}, {}) == (True, (False, False))
        assert hop.call("construct", 2, "instance", {}, {}) == (True, (True, False))  # set on the instance
        assert hop.call("construct", 3, "probe", {"tag": "t"}, {}) == (True, (True, True))


def test_end_forgets_an_episode_unless_its_teardown_is_to_come(tmp_path: Path) -> None:
    with worker(tmp_path) as hop:
        hop.call("construct", 1, "plain", {}, {})
        assert hop.call("prompt", 1)[0]
        hop.tell("end", 1)
        ok, error = hop.call("prompt", 1)
        assert not ok and isinstance(error, KeyError)

        hop.call("construct", 2, "probe", {"tag": "t"}, {})
        assert hop.call("setup", 2) == (True, None)
        hop.tell("end", 2)  # set up, with a teardown: kept for it
        assert hop.call("teardown", 2, False) == (True, None)
        ok, error = hop.call("prompt", 2)
        assert not ok and isinstance(error, KeyError)


async def test_a_setup_set_on_the_instance_runs_in_a_worker_as_in_process() -> None:
    for mode in ("--workers", "--in-process"):
        with start_serve("tests.support.worker_environments:InstanceSetupEnv",
                         *(["--workers", "1"] if mode == "--workers" else [mode])) as serve:
            async with grpc_stub(serve.grpc_target) as stub:
                sid = await grpc_episode(stub, "tagged", env_name="instancesetupenv")
                answer = (await grpc_call(stub, sid, "set_up"))[-1].result.output
                assert answer.blocks[0].text.text == "True", (mode, answer)


def test_a_teardown_runs_for_an_episode_the_server_set_up_without_a_crossing(tmp_path: Path) -> None:
    with worker(tmp_path) as hop:
        assert hop.call("construct", 1, "teardown_only", {"tag": "set-up"}, {}) == (True, (False, True))
        assert hop.call("teardown", 1, True) == (True, None)  # set up by the server: no setup() to run
        hop.call("construct", 2, "teardown_only", {"tag": "never-set-up"}, {})
        assert hop.call("teardown", 2, False) == (True, None)  # deleted while constructing: as in-process
    assert [path.name for path in tmp_path.iterdir() if path.name.startswith("teardown-")] == ["teardown-set-up"]


async def test_an_async_tool_runs_in_a_task_of_its_own_in_every_mode() -> None:
    for mode in (["--workers", "1"], ["--in-process"]):
        with start_serve("tests.support.worker_environments:NoLifecycleEnv", *mode) as serve:
            async with grpc_stub(serve.grpc_target) as stub:
                sid = await grpc_episode(stub, "timed", env_name="nolifecycleenv")
                events = await grpc_call(stub, sid, "timed")
                assert events[-1].result.output.blocks[0].text.text, (mode, events[-1])
