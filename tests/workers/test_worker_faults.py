"""Every fault of environments' code run in processes of their own, through
both doors (gRPC, and the HTTP door of `serve --http-port`), with `--workers 2`
and with `--isolation episode`: the call in flight is answered, the episode
whose process went answers ERROR_REASON_ENVIRONMENT_CRASHED naming the cause
(the call in flight too, when the fault struck it rather than a timeout),
the process is gone and replaced, and an episode in another process loses
nothing. Blocked and spinning event loops (the stall limit) are in
`test_stalls.py`."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Optional

import grpc
import pytest
from grpc_health.v1 import health_pb2, health_pb2_grpc

from ors_grpc.protocol.errors import (
    CRASH_CAUSE_MEMORY_LIMIT, CRASH_CAUSE_TOOL_TIMEOUT, ORSError, environment_crashed_from_exitcode,
)
from tests.support.episode_doors import DOOR_NAMES, EpisodeDoor, episode_door
from tests.support.reliability_helpers import eventually
from tests.support.processes import children, descendants, process_gone
from tests.support.servers import ROOT, start_serve
from tests.support.worker_environments import POISON_VARIABLE

pytestmark = pytest.mark.timeout(120)

WORKER_PROBE = "tests.support.worker_environments:WorkerProbeEnv"
ENV_NAME = "workerprobeenv"
#: `serve` arguments of each way of running environments' code apart from the server.
MODES = {
    "workers": ("--workers", "2"),
    "isolation": ("--isolation", "episode", "--workers", "2"),
}
#: The process that imports the environments in each mode (a worker; or the template episode processes fork from).
STARTED_PROCESS = {"workers": "a worker process", "isolation": "the template process"}
TOOL_TIMEOUT_S = 1
#: A bound on waiting out the restart backoff (it doubles up to 30 s while processes die young).
BACKOFF_BOUND_S = 60.0


@dataclasses.dataclass(frozen=True)
class Fault:
    #: The doomed episode's tool that brings its process down; None: the test SIGKILLs the process.
    tool: Optional[str]
    #: How the episode answers afterwards.
    crash: ORSError
    serve_options: tuple[str, ...] = ()
    #: The failure the call in flight is answered, if not the crash itself (as a status).
    answered: Optional[str] = None


_PAST_THE_TIMEOUT = dict(
    crash=environment_crashed_from_exitcode(-signal.SIGKILL, CRASH_CAUSE_TOOL_TIMEOUT),
    serve_options=("--tool-timeout", str(TOOL_TIMEOUT_S)),
    answered=f"tool call timed out after {TOOL_TIMEOUT_S}s",  # at the timeout; the kill comes after the grace
)
FAULTS = {
    "exit": Fault("exit_process", environment_crashed_from_exitcode(3)),
    "sigsegv": Fault("segfault", environment_crashed_from_exitcode(-signal.SIGSEGV)),
    "sigkill from outside": Fault(None, environment_crashed_from_exitcode(-signal.SIGKILL)),
    "sync hang past the tool timeout": Fault("block_thread", **_PAST_THE_TIMEOUT),
    "sync spin past the tool timeout": Fault("spin", **_PAST_THE_TIMEOUT),
    "memory limit": Fault("hoard_memory", environment_crashed_from_exitcode(-signal.SIGKILL, CRASH_CAUSE_MEMORY_LIMIT),
                          serve_options=("--worker-memory-limit", "200")),
}


async def _gone(pid: int) -> bool:
    return process_gone(pid)


async def pid_of(door: EpisodeDoor, sid: str) -> int:
    return (await door.call(sid, "pid")).metadata["pid"]


@pytest.mark.parametrize("door_name", DOOR_NAMES)
@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("fault_name", FAULTS)
async def test_a_fault_costs_the_episodes_of_its_process_and_no_other(
        fault_name: str, mode: str, door_name: str) -> None:
    fault = FAULTS[fault_name]
    with start_serve(WORKER_PROBE, "--http-port", "0", *MODES[mode], *fault.serve_options) as serve:
        async with episode_door(door_name, serve, ENV_NAME) as door:
            doomed, neighbour = await door.create("doomed"), await door.create("neighbour")
            doomed_pid, neighbour_pid = await pid_of(door, doomed), await pid_of(door, neighbour)
            assert len({doomed_pid, neighbour_pid, serve.proc.pid}) == 3  # two processes, neither the server
            assert (await door.call(neighbour, "echo_tag")).text == "neighbour"

            if fault.tool is None:
                os.kill(doomed_pid, signal.SIGKILL)
            elif fault.answered is not None:
                assert (await door.call(doomed, fault.tool)).failure == fault.answered
            else:  # the call in flight when its process died: the episode's end, never a tool failure
                await door.expect_call_answered(doomed, fault.tool, fault.crash)

            await eventually(lambda: _gone(doomed_pid), f"the doomed process {doomed_pid} to be gone")
            await eventually(lambda: door.prompt_refused(doomed), "the doomed episode to be refused")
            await door.expect_refused(doomed, fault.crash)  # never sent to another process
            # The neighbour lost nothing: same process, same state, its calls answered.
            assert await pid_of(door, neighbour) == neighbour_pid
            assert (await door.call(neighbour, "stats")).metadata["runs"] == {"echo_tag": 1}
            assert (await door.call(neighbour, "echo_tag")).text == "neighbour"
            await eventually(lambda: _a_new_process_serves(door, {doomed_pid, neighbour_pid, serve.proc.pid}),
                             "a new process to serve new episodes")
            for sid in (doomed, neighbour):
                await door.delete(sid)


@pytest.mark.parametrize("mode", [*MODES, "in-process"])
async def test_a_segfault_leaves_the_python_traceback_of_the_code_that_caused_it_in_the_log(
        mode: str, tmp_path: Path) -> None:
    # A signal names no code: the process that died prints where it was (faulthandler), in every mode.
    log = tmp_path / "serve.log"
    placement = MODES.get(mode, ("--in-process",))
    with log.open("w") as stderr, start_serve(WORKER_PROBE, *placement, stderr=stderr) as serve:
        async with episode_door("grpc", serve, ENV_NAME) as door:
            sid = await door.create("doomed")
            with contextlib.suppress(Exception):  # answered ENVIRONMENT_CRASHED, or the server is gone
                await door.call(sid, "segfault")
            await eventually(lambda: _logged(log, "Fatal Python error: Segmentation fault"), "the fault's report")
    text = log.read_text()
    assert 'worker_environments.py", line' in text and " in segfault" in text, text


async def _a_new_process_serves(door: EpisodeDoor, old_pids: set[int]) -> bool:
    fresh = await door.create("fresh")
    try:
        answer = await door.call(fresh, "echo_tag")
        return answer.text == "fresh" and await pid_of(door, fresh) not in old_pids
    finally:
        await door.delete(fresh)


async def _health_is(stub: health_pb2_grpc.HealthStub, status: int) -> bool:
    return (await stub.Check(health_pb2.HealthCheckRequest())).status == status


# With --isolation episode, episode processes are forked from a template that imported the environments once:
# none imports them again, so their crash loop is the template's (test_episode_isolation.py, a dead template).
@pytest.mark.parametrize("door_name", DOOR_NAMES)
@pytest.mark.parametrize("mode", ["workers"])
async def test_a_crash_loop_is_reported_once_and_health_is_not_serving_while_no_process_is_up(
        mode: str, door_name: str, tmp_path: Path) -> None:
    poison, log = tmp_path / "poison", tmp_path / "serve.log"
    with log.open("w") as stderr, start_serve(WORKER_PROBE, "--http-port", "0", *MODES[mode],
                                              env={POISON_VARIABLE: str(poison)}, stderr=stderr) as serve:
        async with episode_door(door_name, serve, ENV_NAME) as door, \
                grpc.aio.insecure_channel(serve.grpc_target) as channel:
            health = health_pb2_grpc.HealthStub(channel)
            poison.write_text("poison")  # from now on every process started dies at start: a crash loop
            doomed, neighbour = await door.create("doomed"), await door.create("neighbour")  # the started two
            doomed_pid, neighbour_pid = await pid_of(door, doomed), await pid_of(door, neighbour)
            assert (await door.call(neighbour, "echo_tag")).text == "neighbour"
            os.kill(doomed_pid, signal.SIGKILL)
            await eventually(lambda: door.prompt_refused(doomed), "the doomed episode to be refused")
            # A process is still up: the neighbour lost nothing.
            assert (await door.call(neighbour, "stats")).metadata["runs"] == {"echo_tag": 1}
            assert (await door.call(neighbour, "echo_tag")).text == "neighbour"
            # The neighbour's process killed too: none is up. Health says so; creations are refused, to be retried.
            os.kill(neighbour_pid, signal.SIGKILL)
            await eventually(lambda: door.prompt_refused(neighbour), "the neighbour's episode to be refused")
            await eventually(lambda: _health_is(health, health_pb2.HealthCheckResponse.NOT_SERVING),
                             "health NOT_SERVING")
            assert await door.try_create("meanwhile") is None
            await eventually(lambda: _logged(log, "RuntimeError: poisoned"), "a failed start to be logged")
            poison.unlink()  # the environment can start again: a start, after its backoff, succeeds
            await eventually(lambda: _health_is(health, health_pb2.HealthCheckResponse.SERVING),
                             "health SERVING again", timeout_s=BACKOFF_BOUND_S)
            fresh = await door.create("fresh")
            assert (await door.call(fresh, "echo_tag")).text == "fresh"
    # Reported once, with the traceback, however many starts failed.
    assert log.read_text().count("RuntimeError: poisoned: this worker cannot start") == 1, log.read_text()


async def _logged(log: Path, text: str) -> bool:
    return text in log.read_text()


@pytest.mark.parametrize("mode", MODES)
def test_environments_that_workers_cannot_import_fail_the_start_with_the_traceback(mode: str) -> None:
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run(
        [sys.executable, "-m", "ors_grpc.cli", "serve", "tests.support.worker_only_failing_environment:WorkerShyEnv",
         "--port", "0", *MODES[mode]], capture_output=True, text=True, timeout=120, cwd=ROOT, env=env)
    assert done.returncode == 2, done.stderr
    assert f"{STARTED_PROCESS[mode]} could not import the environments" in done.stderr
    assert done.stderr.count("RuntimeError: no simulator licence in this process") == 1


@pytest.mark.parametrize("mode", MODES)
async def test_the_server_killed_leaves_no_process_behind(mode: str) -> None:
    with start_serve(WORKER_PROBE, "--http-port", "0", *MODES[mode]) as serve:
        for door_name in DOOR_NAMES:  # an episode open through each door
            async with episode_door(door_name, serve, ENV_NAME) as door:
                await door.create(door_name)
        processes = descendants(serve.proc.pid)
        assert len(processes) >= 2
        serve.proc.kill()
        serve.proc.wait()
        for pid in processes:
            await eventually(lambda pid=pid: _gone(pid), f"process {pid} to end with its server")


def test_the_next_server_sweeps_the_hop_directory_a_killed_one_left() -> None:
    with start_serve(WORKER_PROBE, *MODES["workers"]) as serve:
        # A worker's argv names the hop's socket (`python -m ...worker SOCKET WORKER_ID SERVER_PID`).
        worker = children(serve.proc.pid)[0]
        hop = Path(Path(f"/proc/{worker}/cmdline").read_bytes().split(b"\0")[3].decode()).parent
        serve.proc.kill()
        serve.proc.wait()
    assert hop.is_dir() and not _listening(hop / "hop.sock")  # SIGKILL gave the server no chance to remove it
    long_ago = time.time() - 3600
    os.utime(hop, (long_ago, long_ago))
    with start_serve(WORKER_PROBE, *MODES["workers"]):
        assert not hop.exists()


def _listening(path: Path) -> bool:
    probe = socket.socket(socket.AF_UNIX)
    try:
        probe.connect(str(path))
        return True
    except OSError:
        return False
    finally:
        probe.close()
