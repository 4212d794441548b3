"""Episodes of other ecosystems' environments for the load generator (``bench.load``,
door kinds ``rg-http``, ``rg-grpc``, ``openenv-direct``, ``openenv-grpc``):

- reasoning-gym (``ors-grpc serve reasoning-gym:...``): create the episode of task
  `i` of ``train``, read the prompt, ``submit`` an answer (the one tool call),
  through the HTTP door (raw aiohttp, as ``bench.http_door``) or our gRPC client;
- OpenEnv's counting environment (bench/openenv_env.py): reset, then four steps,
  through OpenEnv's own client straight to OpenEnv's server (``openenv-direct``) or
  through our gRPC client to ``ors-grpc serve openenv:...`` (``openenv-grpc``:
  hosted there, or fronting that same server).
"""

import itertools
import json
import time
from collections.abc import Callable

from bench.client_door import MAX_MESSAGE
from bench.http_door import HttpDoor, run_tool_output
from ors_grpc.client import AsyncORSClient

#: The reasoning-gym environment the benchmark serves, and the size of its train split.
REASONING_GYM_ENV = "leg_counting"
REASONING_GYM_TASKS = 1000
REASONING_GYM_SPEC = f"reasoning-gym:{REASONING_GYM_ENV}?split=train:{REASONING_GYM_TASKS}:0"
#: The OpenEnv environment's name as served (its class name) and its steps.
OPENENV_ENV = "countenvironment"
OPENENV_STEPS = (1, 2, 3, 4)

_Callback = Callable[[float], None]


def _finished(output_finished: bool, what: str) -> None:
    if not output_finished:
        raise RuntimeError(f"{what} did not end the episode")


class ReasoningGymHttpDoor(HttpDoor):
    """Episodes of the reasoning-gym environment over HTTP/SSE."""

    def __init__(self, base_url: str):
        super().__init__(base_url)
        self.indices = itertools.cycle(range(REASONING_GYM_TASKS))

    async def episode(self, on_tool_call: _Callback, on_create: _Callback) -> None:
        sid = await self.new_session_id()
        start = time.perf_counter()
        await self._post("/create", sid, {"env_name": REASONING_GYM_ENV, "split": "train", "index": next(self.indices)})
        on_create(time.perf_counter() - start)
        prompt = json.loads(await self._get(f"/{REASONING_GYM_ENV}/prompt", sid))
        assert prompt and prompt[0]["type"] == "text", prompt
        start = time.perf_counter()
        body = await self._post(f"/{REASONING_GYM_ENV}/call", sid, {"name": "submit", "input": {"answer": "12"}},
                                accept_sse=True)
        on_tool_call(time.perf_counter() - start)
        _finished(run_tool_output(body)["finished"], "submit")
        await self.close_episode(sid)


class _OursOverGrpc:
    """Our gRPC service at ``target`` through one AsyncORSClient."""

    def __init__(self, target: str, env: str):
        self.client = AsyncORSClient(target, max_message_bytes=MAX_MESSAGE)
        self.env = self.client.environment(env)
        self.indices = itertools.cycle(range(REASONING_GYM_TASKS))

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        await self.client.close()


class ReasoningGymClientDoor(_OursOverGrpc):
    def __init__(self, target: str):
        super().__init__(target, REASONING_GYM_ENV)

    async def episode(self, on_tool_call: _Callback, on_create: _Callback) -> None:
        start = time.perf_counter()
        async with self.env.session(split="train", index=next(self.indices)) as session:
            on_create(time.perf_counter() - start)
            prompt = await session.get_prompt()
            assert prompt and prompt[0].type == "text", prompt
            start = time.perf_counter()
            output = await session.call_tool("submit", {"answer": "12"})
            on_tool_call(time.perf_counter() - start)
            _finished(output.finished, "submit")


class OpenEnvClientDoor(_OursOverGrpc):
    """The counting environment as an ORS environment, through our gRPC client."""

    def __init__(self, target: str):
        super().__init__(target, OPENENV_ENV)

    async def episode(self, on_tool_call: _Callback, on_create: _Callback) -> None:
        start = time.perf_counter()
        async with self.env.session(split="train", index=next(self.indices)) as session:
            await session.get_prompt()  # waits for the reset
            on_create(time.perf_counter() - start)
            for n in OPENENV_STEPS:
                start = time.perf_counter()
                output = await session.call_tool("step", {"n": n})
                on_tool_call(time.perf_counter() - start)
            _finished(output.finished and output.reward == 1.0, "the last step")


class OpenEnvDirectDoor:
    """The counting environment straight from OpenEnv's server, through OpenEnv's own
    client: one WebSocket session per episode."""

    def __init__(self, url: str):
        # Imported before the clock starts: openenv takes seconds to import (gradio).
        from openenv.core.generic_client import GenericEnvClient

        self.client_class = GenericEnvClient
        self.url = url
        self.seeds = itertools.count()

    async def __aenter__(self):
        return self

    async def __aexit__(self, *exc) -> None:
        pass

    async def episode(self, on_tool_call: _Callback, on_create: _Callback) -> None:
        start = time.perf_counter()
        async with self.client_class(base_url=self.url) as env:
            await env.reset(seed=next(self.seeds))
            on_create(time.perf_counter() - start)
            for n in OPENENV_STEPS:
                start = time.perf_counter()
                result = await env.step({"n": n})
                on_tool_call(time.perf_counter() - start)
            _finished(result.done and result.reward == 1.0, "the last step")


DOORS = {
    "rg-http": ReasoningGymHttpDoor,
    "rg-grpc": ReasoningGymClientDoor,
    "openenv-direct": OpenEnvDirectDoor,
    "openenv-grpc": OpenEnvClientDoor,
}
