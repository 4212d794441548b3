"""The environment the playground's browser tests play besides `arithmetic`: markup in its
task and prompt, an image tool, a tool whose input has every kind of field, a tool that
raises, and group scoring."""

from __future__ import annotations

import base64
import json
import struct
import zlib
from enum import Enum
from typing import Optional

from pydantic import BaseModel

from ors_grpc import Environment, GroupScore, ImageBlock, Split, TextBlock, ToolOutput, tool

#: Markup that would run script if the page ever put environment text into HTML.
HOSTILE_TITLE = '<img src=x onerror="document.title=\'pwned\'"><script>document.title="pwned"</script>'
HOSTILE_OUTPUT = "<b>not bold</b><iframe src=x></iframe>"


def red_square_png(side: int = 8) -> bytes:
    """A real PNG (the browser decodes it), made here rather than shipped."""
    rows = b"".join(b"\x00" + b"\xc8\x1e\x1e" * side for _ in range(side))

    def chunk(kind: bytes, data: bytes) -> bytes:
        return struct.pack(">I", len(data)) + kind + data + struct.pack(">I", zlib.crc32(kind + data) & 0xFFFFFFFF)

    header = struct.pack(">IIBBBBB", side, side, 8, 2, 0, 0, 0)
    return b"\x89PNG\r\n\x1a\n" + chunk(b"IHDR", header) + chunk(b"IDAT", zlib.compress(rows)) + chunk(b"IEND", b"")


class NoInput(BaseModel):
    pass


class Size(str, Enum):
    small = "small"
    large = "large"


class Address(BaseModel):
    street: str
    number: int


class Order(BaseModel):
    """Every kind of field the playground's form makes."""

    name: str
    quantity: int
    price: float
    size: Size
    gift: bool = False
    tags: list[str] = []
    address: Address
    note: Optional[str] = None


class Showcase(Environment):
    """A task and a prompt with markup, an image, a form of every field kind, a failing tool, scoring."""

    @classmethod
    def list_splits(cls) -> list[Split]:
        return [Split(name="train", type="train")]

    @classmethod
    def list_tasks(cls, split: str) -> list[dict]:
        return [{"title": HOSTILE_TITLE}]

    def get_prompt(self) -> list[TextBlock]:
        return [TextBlock(text=self.task_spec["title"])]

    @tool
    def snapshot(self, params: NoInput) -> ToolOutput:
        """A picture, and some markup as text."""
        image = base64.b64encode(red_square_png()).decode("ascii")
        return ToolOutput(blocks=[ImageBlock(data=image, mimeType="image/png"), TextBlock(text=HOSTILE_OUTPUT)])

    @tool
    def order(self, params: Order) -> ToolOutput:
        """Echo the order as JSON."""
        return ToolOutput(blocks=[TextBlock(text=json.dumps(params.model_dump(mode="json"), sort_keys=True))])

    @tool
    def explode(self, params: NoInput) -> ToolOutput:
        """Always raises."""
        raise RuntimeError("the showcase exploded")

    def score_group(self, candidates):
        return [GroupScore(reward=float(len(candidate.messages)), metadata={"index": index})
                for index, candidate in enumerate(candidates)]
