"""The hop's frames: reassembled whatever the reads split them into; a tool's output crossing as plain data."""

import asyncio
import pickle
import random
import struct

from ors_grpc import ImageBlock, TextBlock, ToolOutput
from ors_grpc._runtime.workers.hop import TOOL_OUTPUT, Framing, answer_frame, answer_value
from ors_grpc.authoring.environment import tool_result
from ors_grpc.authoring.types import RunToolError, RunToolOutput


def _stream(messages: list) -> bytes:
    return b"".join(struct.pack(">I", len(data)) + data for data in (pickle.dumps(m, protocol=pickle.HIGHEST_PROTOCOL) for m in messages))


async def _received(stream: bytes, read_sizes: list[int]) -> list:
    got: list = []
    framing = Framing(got.append, lambda: None)
    offset = 0
    while offset < len(stream):
        size = random.choice(read_sizes)
        framing.data_received(stream[offset:offset + size])
        offset += size
    return got


def test_frames_are_handed_on_whole_whatever_the_reads_split_them_into() -> None:
    random.seed(7)
    messages = [(n, "run_tool", ("x" * random.randint(0, 200_000),)) for n in range(40)] + [(n,) for n in range(40)]
    stream = _stream(messages)
    for read_sizes in ([1], [1, 2, 3, 5], [4096, 65536], [len(stream)]):
        assert asyncio.run(_received(stream, read_sizes)) == messages


def test_a_tool_output_crosses_as_plain_data_and_comes_back_equal() -> None:
    outputs = [
        tool_result("step", ToolOutput(
            blocks=[TextBlock(text="total=3"), ImageBlock(data="aGk=", mimeType="image/png")],
            metadata={"a": [1, {"b": None}]}, reward=0.5, finished=True,
        )),
        RunToolOutput(RunToolError(error="no such tool", reason="not_found")),
    ]
    for output in outputs:
        call_id, ok, value = pickle.loads(pickle.dumps(answer_frame(3, output)))
        assert (call_id, ok) == (3, TOOL_OUTPUT)
        assert type(value) is dict
        assert answer_value(ok, value) == output


def test_a_tool_output_that_would_not_come_back_equal_crosses_as_it_is() -> None:
    changed = ToolOutput(blocks=[TextBlock(text="t")])
    changed.reward = "high"  # assigned after validation: its type does not allow it
    as_tuple = ToolOutput(blocks=(TextBlock(text="t"),))
    for output in (tool_result("step", changed), tool_result("step", as_tuple), {"not": "an output"}):
        assert answer_frame(1, output) == (1, True, output)
        assert answer_value(True, output) is output


class _Writes:
    """A transport that keeps what is written to it, one entry per write."""

    def __init__(self) -> None:
        self.writes: list[bytes] = []

    def set_protocol(self, protocol) -> None:
        pass

    def is_closing(self) -> bool:
        return False

    def write(self, data: bytes) -> None:
        self.writes.append(data)


async def _writes_of_frames_sent_a_turn_apart(wait_a_turn: bool) -> list[bytes]:
    transport = _Writes()
    framing = Framing(lambda message: None, lambda: None, wait_a_turn=wait_a_turn)
    framing.take_over(type("Writer", (), {"transport": transport})())
    framing.send((1, "run_tool", ()))
    framing.send((2, "run_tool", ()))
    await asyncio.sleep(0)  # the loop's next turn
    framing.send((3, "prompt", ()))
    for _ in range(3):
        await asyncio.sleep(0)
    return transport.writes


def test_frames_sent_in_one_turn_leave_in_one_write_at_its_end() -> None:
    writes = asyncio.run(_writes_of_frames_sent_a_turn_apart(wait_a_turn=False))
    assert writes == [_stream([(1, "run_tool", ()), (2, "run_tool", ())]), _stream([(3, "prompt", ())])]


def test_the_servers_frames_wait_a_turn_for_the_next_turns() -> None:
    writes = asyncio.run(_writes_of_frames_sent_a_turn_apart(wait_a_turn=True))
    assert writes == [_stream([(1, "run_tool", ()), (2, "run_tool", ()), (3, "prompt", ())])]
