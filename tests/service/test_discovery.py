"""Discovery RPCs: health, version, environments, tools, splits, tasks."""

from __future__ import annotations

import json

import grpc
import pytest

import ors_grpc
from ors_grpc import Environment, Split, TextBlock, ToolOutput, tool
from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc._runtime.service import environment_map
from tests.support.grpc_calls import error_reason, expect_error, serving
from tests.support.environments import EchoEnv, EchoInput, TEST_TASKS, TRAIN_TASKS


def exact(value) -> str:
    """JSON text that tells 1 from 1.0 and keeps key order, for comparisons."""
    return json.dumps(value, ensure_ascii=False)


class IndexOnlyEnv(Environment):
    """Supports index access only: listing raises NotImplementedError."""

    @classmethod
    def list_splits(cls):
        return [Split(name="eval", type="test"), "holdout"]

    @classmethod
    def list_tasks(cls, split):
        raise NotImplementedError

    @classmethod
    async def num_tasks(cls, split):
        return 3

    @classmethod
    async def get_task(cls, split, index):
        if not 0 <= index < 3:
            raise IndexError(index)
        return {"n": index}

    def get_prompt(self):
        return [TextBlock(text="n")]

    @tool
    def noop(self) -> ToolOutput:
        return ToolOutput(blocks=[])


async def test_health_version_and_environments(stub) -> None:
    health = await stub.Health(pb.HealthRequest())
    assert (health.status, health.open_sessions) == ("ok", 0)
    assert (await stub.Version(pb.VersionRequest())).version == ors_grpc.__version__
    names = (await stub.ListEnvironments(pb.ListEnvironmentsRequest())).names
    assert list(names) == ["echoenv", "slowsetupenv", "failingsetupenv"]


async def test_list_tools_gives_shared_tools_with_pydantic_schemas(stub) -> None:
    tools = {t.name: t for t in (await stub.ListTools(pb.ListToolsRequest(env_name="ECHOENV"))).tools}
    assert "hint" not in tools  # @tool(shared=False)
    assert {"echo", "add", "submit", "fail", "sleep", "big", "image", "metadata", "secret"} <= set(tools)
    assert json.loads(tools["echo"].input_schema.json) == EchoInput.model_json_schema()
    assert tools["echo"].description == "Echo the text back."
    assert not tools["fail"].HasField("input_schema")  # no parameters: JSON null


async def test_splits_map_bare_names_to_types() -> None:
    async with serving([EchoEnv, IndexOnlyEnv]) as stub:
        echo = (await stub.ListSplits(pb.ListSplitsRequest(env_name="echoenv"))).splits
        assert [(s.name, s.type) for s in echo] == [
            ("train", types_pb2.SPLIT_TYPE_TRAIN), ("test", types_pb2.SPLIT_TYPE_TEST)
        ]
        index_only = (await stub.ListSplits(pb.ListSplitsRequest(env_name="indexonlyenv"))).splits
        assert [(s.name, s.type) for s in index_only] == [
            ("eval", types_pb2.SPLIT_TYPE_TEST), ("holdout", types_pb2.SPLIT_TYPE_VALIDATION)
        ]


async def test_tasks_are_lossless_json(stub) -> None:
    listed = await stub.ListTasks(pb.ListTasksRequest(env_name="EchoEnv", split="train"))
    assert listed.env_name == "EchoEnv"
    assert [exact(json.loads(t.spec.json)) for t in listed.tasks] == [exact(t) for t in TRAIN_TASKS]
    assert (await stub.NumTasks(pb.NumTasksRequest(env_name="echoenv", split="test"))).num_tasks == 2
    task = (await stub.GetTask(pb.GetTaskRequest(env_name="echoenv", split="train", index=0))).task
    spec = json.loads(task.spec.json)
    assert spec["big"] == 2**70 and isinstance(spec["ratio"], float)
    assert exact(spec) == exact(TRAIN_TASKS[0])


async def test_task_range_has_slice_semantics(stub) -> None:
    async def task_ids(**bounds) -> list[int]:
        request = pb.GetTaskRangeRequest(env_name="echoenv", split="train", **bounds)
        return [json.loads(t.spec.json)["id"] for t in (await stub.GetTaskRange(request)).tasks]

    assert await task_ids() == [0, 1, 2]
    assert await task_ids(start=1) == [1, 2]
    assert await task_ids(stop=-1) == [0, 1]
    assert await task_ids(start=-2, stop=10) == [1, 2]
    assert await task_ids(start=5) == []
    tests = (await stub.GetTaskRange(pb.GetTaskRangeRequest(env_name="echoenv", split="test"))).tasks
    assert [json.loads(t.spec.json) for t in tests] == TEST_TASKS


async def test_unknown_environment_is_not_found(stub) -> None:
    for call in [
        stub.ListTools(pb.ListToolsRequest(env_name="nope")),
        stub.ListSplits(pb.ListSplitsRequest(env_name="nope")),
        stub.ListTasks(pb.ListTasksRequest(env_name="nope", split="train")),
        stub.NumTasks(pb.NumTasksRequest(env_name="nope", split="train")),
        stub.GetTask(pb.GetTaskRequest(env_name="nope", split="train")),
        stub.GetTaskRange(pb.GetTaskRangeRequest(env_name="nope", split="train")),
    ]:
        error = await expect_error(call)
        assert error.code() == grpc.StatusCode.NOT_FOUND
        assert error.details() == "unknown environment 'nope'; this server hosts: echoenv, slowsetupenv, failingsetupenv"
        assert error_reason(error) == "ERROR_REASON_UNKNOWN_ENVIRONMENT"


async def test_invalid_split_and_index_say_what_is_valid(stub) -> None:
    for split, call in [
        ("validation", stub.ListTasks(pb.ListTasksRequest(env_name="echoenv", split="validation"))),
        ("x", stub.NumTasks(pb.NumTasksRequest(env_name="echoenv", split="x"))),
        ("x", stub.GetTask(pb.GetTaskRequest(env_name="echoenv", split="x", index=0))),
        ("x", stub.GetTaskRange(pb.GetTaskRangeRequest(env_name="echoenv", split="x"))),
    ]:
        error = await expect_error(call)
        assert (error.code(), error.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT, f"Invalid split: {split!r} is not a split of echoenv (its splits: train, test)")
        assert error_reason(error) == "ERROR_REASON_INVALID_SPLIT"
    for index in (3, -4, 2**62):
        error = await expect_error(stub.GetTask(pb.GetTaskRequest(env_name="echoenv", split="train", index=index)))
        assert (error.code(), error.details()) == (
            grpc.StatusCode.INVALID_ARGUMENT,
            f"Invalid index: {index} is out of range for split 'train', which has 3 tasks (0 to 2, or -3 to -1 from the end)")
        assert error_reason(error) == "ERROR_REASON_INVALID_INDEX"


@pytest.mark.parametrize(("env_name", "split"), [("echoenv", "train"), ("indexonlyenv", "eval")])
async def test_a_negative_index_counts_from_the_end_in_every_environment(env_name: str, split: str) -> None:
    # As the reference's `tasks[index]`; IndexOnlyEnv's own get_task takes 0 to 2 only: it is given 2.
    async with serving([EchoEnv, IndexOnlyEnv]) as stub:
        for index, position in ((-1, 2), (-3, 0)):
            task = await stub.GetTask(pb.GetTaskRequest(env_name=env_name, split=split, index=index))
            assert task == await stub.GetTask(pb.GetTaskRequest(env_name=env_name, split=split, index=position))


async def test_index_only_environment() -> None:
    async with serving([IndexOnlyEnv]) as stub:
        error = await expect_error(stub.ListTasks(pb.ListTasksRequest(env_name="indexonlyenv", split="eval")))
        assert error.code() == grpc.StatusCode.FAILED_PRECONDITION
        assert error_reason(error) == "ERROR_REASON_LISTING_UNSUPPORTED"
        assert error.details().startswith("list_tasks is not supported for this environment.")
        assert (await stub.NumTasks(pb.NumTasksRequest(env_name="indexonlyenv", split="eval"))).num_tasks == 3
        ranged = await stub.GetTaskRange(pb.GetTaskRangeRequest(env_name="indexonlyenv", split="eval", start=1))
        assert [json.loads(t.spec.json) for t in ranged.tasks] == [{"n": 1}, {"n": 2}]


class RangeErrorEnv(IndexOnlyEnv):
    """get_task_range raises IndexError: reported as an invalid range."""

    @classmethod
    async def get_task_range(cls, split, start=None, stop=None):
        raise IndexError("out of range")


async def test_index_error_in_task_range_is_invalid_index_range() -> None:
    async with serving([RangeErrorEnv]) as stub:
        error = await expect_error(stub.GetTaskRange(pb.GetTaskRangeRequest(env_name="rangeerrorenv", split="eval")))
        assert (error.details(), error_reason(error)) == (
            "Invalid index range for split 'eval', which has 3 tasks", "ERROR_REASON_INVALID_INDEX")


def test_environment_without_tools_is_refused() -> None:
    class NoTools(IndexOnlyEnv):
        noop = None

    with pytest.raises(ValueError, match="no tools"):
        environment_map([NoTools])
