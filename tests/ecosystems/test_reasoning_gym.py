"""reasoning-gym datasets served by `ors-grpc serve reasoning-gym:...`, played to a
right and a wrong answer with the unmodified openreward client over HTTP and with
ors_grpc.client over gRPC, in the server process and in --workers 2: every reward
is reasoning-gym's own `score_answer` for the same entry."""

from __future__ import annotations

import subprocess
import sys
from typing import Iterator

import pytest
import reasoning_gym
from openreward.api.environments.client import EnvironmentsAPI

from ors_grpc.client import ORSClient, ORSServerError
from tests.support.reasoning_gym_play import FAMILIES, SERVE_SPEC, WRONG_ANSWER, entry, expected_reward
from tests.support.servers import ROOT, ServeProcess, start_serve

PLACEMENTS = {"in-process": ("--in-process",), "workers": ("--workers", "2"), "episode processes": ("--isolation", "episode")}


@pytest.fixture(scope="module", params=list(PLACEMENTS))
def server(request: pytest.FixtureRequest) -> Iterator[ServeProcess]:
    with start_serve(SERVE_SPEC, "--http-port", "0", *PLACEMENTS[request.param]) as serve:
        yield serve


@pytest.mark.parametrize("family", FAMILIES)
def test_openreward_over_http_plays_each_family_to_the_datasets_own_scores(server: ServeProcess, family: str) -> None:
    api = EnvironmentsAPI(base_url=server.http_url, api_key="")
    try:
        env = api.get(family, variant=family)
        assert env.list_splits() == ["train", "test"]
        assert env.num_tasks("train") == 4 and env.num_tasks("test") == 2
        assert [tool.name for tool in env.list_tools()] == []
        assert env.terminal_tool().name == "submit" and env.terminal_tool().arg == "answer"
        rewards = []
        for index, answer_of in [(1, lambda task: entry(task)["entry"]["answer"]), (2, lambda task: WRONG_ANSWER)]:
            task = env.get_task("train", index)
            spec = task.task_spec
            assert spec["dataset"] in family.split("+") and spec["index"] == index
            answer = answer_of(spec)
            with env.session(task=task) as session:
                assert session.get_prompt()[0].text == entry(spec)["entry"]["question"]
                result = session.call_terminal_tool(answer)
            assert result.finished is True
            assert result.reward == expected_reward(spec, answer)
            rewards.append(result.reward)
        assert rewards[0] == 1.0 and rewards[1] < 1.0
    finally:
        api.close()


@pytest.mark.parametrize("family", FAMILIES)
def test_ors_grpc_client_plays_each_family_by_split_and_index(server: ServeProcess, family: str) -> None:
    with ORSClient(server.grpc_target) as client:
        env = client.environment(family)
        for index in range(2):
            spec = env.get_task("test", index).task_spec
            right = entry(spec)["entry"]["answer"]
            with env.session(split="test", index=index) as session:
                assert session.get_prompt()[0].text == entry(spec)["entry"]["question"]
                result = session.call_tool("submit", {"answer": right})
                assert result.finished and result.reward == expected_reward(spec, right) == 1.0
            with env.session(split="test", index=index) as session:
                result = session.call_tool("submit", {"answer": WRONG_ANSWER})
                assert result.finished and result.reward == expected_reward(spec, WRONG_ANSWER)


def test_a_mix_draws_each_task_from_the_dataset_reasoning_gyms_composite_draws_it_from(server: ServeProcess) -> None:
    mix = reasoning_gym.create_dataset("composite", seed=5, size=4, datasets=[
        reasoning_gym.composite.DatasetSpec(name, 1.0, {}) for name in ("gcd", "chain_sum")])
    with ORSClient(server.grpc_target) as client:
        env = client.environment("gcd+chain_sum")
        specs = [env.get_task("train", index).task_spec for index in range(4)]
    assert [entry(spec)["entry"]["question"] for spec in specs] == [mix[index]["question"] for index in range(4)]


def test_dataset_configuration_passes_through_and_a_bad_one_stops_serve_at_startup(tmp_path) -> None:
    spec = "reasoning-gym:basic_arithmetic?split=train:3:0&min_terms=5&max_terms=5&max_digits=1&min_digits=1"
    with start_serve(spec) as serve, ORSClient(serve.grpc_target) as client:
        env = client.environment("basic_arithmetic")
        task = env.get_task("train", 2).task_spec
        with env.session(split="train", index=2) as session:
            question = session.get_prompt()[0].text
    config = {"min_terms": 5, "max_terms": 5, "max_digits": 1, "min_digits": 1}
    assert task == {"dataset": "basic_arithmetic", "config": config, "seed": 0, "size": 3, "index": 2}
    assert question == reasoning_gym.create_dataset("basic_arithmetic", seed=0, size=3, **config)[2]["question"]
    assert entry(task)["entry"]["metadata"]["num_terms"] == 5

    bad = subprocess.run([sys.executable, "-m", "ors_grpc.cli", "serve", "--port", "0",
                          "reasoning-gym:leg_counting?no_such_parameter=1"],
                         cwd=ROOT, capture_output=True, text=True, timeout=120)
    assert bad.returncode == 2
    assert "leg_counting" in bad.stderr and "no_such_parameter" in bad.stderr and len(bad.stderr.splitlines()) == 1


def test_an_environment_makes_episodes_of_its_own_datasets_only(server: ServeProcess) -> None:
    with ORSClient(server.grpc_target) as client:
        env = client.environment("leg_counting")
        own = env.get_task("train", 0).task_spec
        for foreign in [{**own, "dataset": "gcd"}, {**own, "config": {"max_animals": 50}}]:
            with pytest.raises(ORSServerError, match="leg_counting serves entries of"):
                with env.session(foreign) as session:
                    session.get_prompt()
        with env.session({**own, "index": 3}) as session:  # any entry of its own dataset
            assert session.get_prompt()[0].text == entry({**own, "index": 3})["entry"]["question"]
