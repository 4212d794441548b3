"""Where an environment's sync code runs when it leaves the choice to us
(`sync_code_on_loop = None`, the default): quick functions earn the event
loop, slow ones stay in (or go back to) user-code threads."""

from __future__ import annotations

import gc
import time

import pytest
from pydantic import BaseModel

from ors_grpc import Environment, TextBlock, ToolOutput, tool
from ors_grpc._runtime import user_code
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from tests.support.worker_environments import where_sync_code_runs
from tests.support.grpc_calls import call_tool, create_episode, serving

#: Generous, so that a loaded machine never makes a quick call look slow.
BUDGET_S = 0.2
SLOW_S = 0.3


@pytest.fixture(autouse=True)
def generous_budget(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(user_code, "INLINE_BUDGET_S", BUDGET_S)




class Work(BaseModel):
    sleep_s: float = 0.0
    collect_garbage: bool = False


def fresh_env(on_loop: bool | None = None) -> type[Environment]:
    """A new environment class each time: placements belong to functions,
    and these must not carry over from another test."""

    class Placed(Environment):
        sync_code_on_loop = on_loop
        seen: dict[str, str] = {}

        def __init__(self, task_spec: dict = {}, secrets: dict[str, str] = {}) -> None:
            super().__init__(task_spec, secrets)
            self.seen["constructor"] = where_sync_code_runs()

        def setup(self) -> None:
            self.seen["setup"] = where_sync_code_runs()

        @classmethod
        def list_splits(cls) -> list[str]:
            return ["train"]

        @classmethod
        def list_tasks(cls, split: str) -> list[dict]:
            cls.seen["list_tasks"] = where_sync_code_runs()
            return [{}]

        def get_prompt(self) -> list[TextBlock]:
            self.seen["get_prompt"] = where_sync_code_runs()
            return [TextBlock(text="work")]

        @tool
        def work(self, params: Work) -> ToolOutput:
            """Sleeps as asked; answers where it ran."""
            time.sleep(params.sleep_s)
            if params.collect_garbage:
                gc.collect()
            self.seen["tool"] = where_sync_code_runs()
            return ToolOutput(blocks=[TextBlock(text=where_sync_code_runs())])

        def teardown(self) -> None:
            self.seen["teardown"] = where_sync_code_runs()

    return Placed


async def places_of_calls(env_cls: type[Environment], calls: list[float | dict]) -> list[str]:
    """Call the `work` tool once per entry of `calls` (seconds to sleep, or
    the whole input), in one episode; where each call ran."""
    async with serving([env_cls]) as stub:
        sid = await create_episode(stub, "placed")
        places = []
        for call in calls:
            tool_input = call if isinstance(call, dict) else {"sleep_s": call}
            _, event = await call_tool(stub, sid, "work", tool_input)
            places.append(event.result.output.blocks[0].text.text)
        await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    return places


async def test_a_quick_sync_tool_moves_to_the_loop_after_its_trial_calls() -> None:
    places = await places_of_calls(fresh_env(), [0.0] * (user_code.TRIAL_CALLS + 3))
    assert places == ["thread"] * user_code.TRIAL_CALLS + ["loop"] * 3


async def test_a_tool_that_overruns_on_the_loop_goes_back_to_threads_for_a_trial_twice_as_long() -> None:
    trial = user_code.TRIAL_CALLS
    places = await places_of_calls(fresh_env(), [0.0] * trial + [SLOW_S] + [0.0] * (2 * trial + 2))
    assert places[trial:] == ["loop"] + ["thread"] * (2 * trial) + ["loop"] * 2


async def test_quick_calls_on_the_loop_forgive_an_overrun(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(user_code, "FORGIVE_AFTER_CALLS", 3)
    trial = user_code.TRIAL_CALLS
    # Overrun (trial doubles), prove it, then 3 quick calls on the loop: the
    # trial is halved back, so the next overrun costs `trial`, not 4 * `trial`.
    sleeps = [0.0] * trial + [SLOW_S] + [0.0] * (2 * trial + 3) + [SLOW_S] + [0.0] * (2 * trial + 1)
    places = await places_of_calls(fresh_env(), sleeps)
    second_overrun = trial + 1 + 2 * trial + 3
    assert places[second_overrun - 3 : second_overrun + 1] == ["loop"] * 4
    assert places[second_overrun + 1 :] == ["thread"] * (2 * trial) + ["loop"]


async def test_garbage_collection_during_a_call_on_the_loop_is_not_an_overrun(monkeypatch: pytest.MonkeyPatch) -> None:
    heap = [[] for _ in range(300_000)]  # work for the collector
    started = time.perf_counter()
    gc.collect()
    monkeypatch.setattr(user_code, "INLINE_BUDGET_S", (time.perf_counter() - started) / 2)
    trial = user_code.TRIAL_CALLS
    places = await places_of_calls(fresh_env(), [0.0] * trial + [{"collect_garbage": True}, 0.0])
    assert places[trial:] == ["loop", "loop"]
    del heap


async def test_an_overrun_in_a_user_code_thread_starts_the_trial_over() -> None:
    trial = user_code.TRIAL_CALLS
    places = await places_of_calls(fresh_env(), [0.0] * (trial - 1) + [SLOW_S] + [0.0] * (trial + 2))
    assert places == ["thread"] * (2 * trial) + ["loop"] * 2


@pytest.mark.parametrize("on_loop, expected", [(False, "thread"), (True, "loop")])
async def test_an_environment_that_chooses_keeps_its_choice(on_loop: bool, expected: str) -> None:
    places = await places_of_calls(fresh_env(on_loop), [0.0] * (user_code.TRIAL_CALLS + 3))
    assert set(places) == {expected}


async def run_episodes(env_cls: type[Environment], count: int) -> dict[str, str]:
    """Run `count` whole episodes (task by index, prompt, one call); where
    each kind of sync code ran in the last one."""
    async with serving([env_cls]) as stub:
        for _ in range(count):
            env_cls.seen = {}
            sid = await create_episode(stub, "placed", split="train", index=0)
            await stub.GetPrompt(pb.GetPromptRequest(session_id=sid))
            await call_tool(stub, sid, "work", {})
            await stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid))
    return env_cls.seen


KINDS = ["list_tasks", "constructor", "setup", "get_prompt", "tool", "teardown"]


@pytest.mark.parametrize("on_loop, expected", [(None, "thread"), (False, "thread"), (True, "loop")])
async def test_a_first_episode_runs_sync_code_in_threads_unless_the_environment_pins_the_loop(
    on_loop: bool | None, expected: str
) -> None:
    assert await run_episodes(fresh_env(on_loop), 1) == dict.fromkeys(KINDS, expected)


async def test_every_kind_of_quick_sync_code_earns_the_loop() -> None:
    assert await run_episodes(fresh_env(), user_code.TRIAL_CALLS + 1) == dict.fromkeys(KINDS, "loop")
