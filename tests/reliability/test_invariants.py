"""Episode invariants end to end over HTTP (the `openreward` server's rules):
no tool runs after `finished: true`, and one tool's calls in a session never overlap.

The same invariants at the service level: tests/service/test_tool_calls.py.
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import aiohttp
import pytest

from ors_grpc._runtime.tool_calls import EPISODE_FINISHED
from tests.support.reliability_helpers import http_call, http_episode, http_stats, serve_probe

pytestmark = pytest.mark.timeout(60)


def refused_as_finished(result: dict, name: str) -> bool:
    return result == {"ok": False, "error": EPISODE_FINISHED.format(name=name), "reason": "episode_finished"}


async def test_after_finished_every_call_ends_with_episode_finished_without_running(tmp_path: Path) -> None:
    with serve_probe(marker_dir=tmp_path) as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            sid = await http_episode(http, "finish")
            graded = (await http_call(http, sid, "submit", {"answer": "yes"})).result()
            assert (graded["output"]["reward"], graded["output"]["finished"]) == (1.0, True)
            for name, tool_input in [("submit", {"answer": "yes"}), ("echo_tag", {}), ("slow", {"seconds": 0})]:
                stream = await http_call(http, sid, name, tool_input)
                assert stream.names() == ["task_id", "end"]  # a tool-level answer, not an SSE error
                assert refused_as_finished(stream.result(), name)
            # A name that is no tool stays `not_found` after the end, as under openreward (and in every mode).
            stream = await http_call(http, sid, "no_such_tool", {})
            assert stream.result() == {"ok": False, "error": "'no_such_tool' is not a valid tool", "reason": "not_found"}
            async with http.post("/delete", headers={"X-Session-ID": sid}) as response:
                assert response.status == 200
    # The teardown recorded the session's runs: only the first submit ran.
    assert json.loads((tmp_path / "teardown-finish").read_text())["runs"] == {"submit": 1}


async def test_concurrent_calls_to_one_tool_in_a_session_run_one_at_a_time() -> None:
    with serve_probe() as serve:
        async with aiohttp.ClientSession(base_url=serve.http_url) as http:
            sid = await http_episode(http, "serial")
            streams = await asyncio.gather(*(http_call(http, sid, "slow", {"seconds": 0.2}) for _ in range(5)))
            texts = sorted(stream.result()["output"]["blocks"][0]["text"] for stream in streams)
            assert texts == [f"slow run {run}" for run in range(1, 6)]
            assert await http_stats(http, sid) == {"runs": {"slow": 5}, "max_active": 1}

