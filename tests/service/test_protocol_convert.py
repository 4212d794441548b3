"""Blocks an environment returns, written into wire messages (`ors_grpc.protocol.convert.write_blocks`)."""

from __future__ import annotations

from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.authoring.types import ImageBlock, TextBlock
from ors_grpc.protocol.convert import write_blocks


def _written(blocks) -> list[tuple[str, str]]:
    message = types_pb2.ToolOutput()
    write_blocks(message.blocks, blocks)
    return [(block.WhichOneof("block"), block.text.text or block.image.mime_type) for block in message.blocks]


def test_models_dicts_and_any_iterable_are_written_in_order() -> None:
    models = [TextBlock(text="a"), ImageBlock(data="aGk=", mimeType="image/png")]
    assert _written(models) == [("text", "a"), ("image", "image/png")]
    assert _written(block for block in models) == [("text", "a"), ("image", "image/png")]
    mixed = (block for block in [TextBlock(text="a"), {"text": "b", "type": "text"}])
    assert _written(mixed) == [("text", "a"), ("text", "b")]
    assert _written(()) == []
