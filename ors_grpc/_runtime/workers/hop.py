"""The hop between the server and one of its workers: frames over a Unix socket.

A frame is a 4-byte big-endian length, then a pickle. Pickle, because the
values that cross are the environment's own (task specs, pydantic models,
`RunToolOutput`, the exceptions it raises) and cross as they are, with no
second codec on the hot path; and it is safe here: the socket lives in a
directory only the server's user can open (0700), the worker runs the
operator's own code, and nothing else can connect. The proto types would
need every value converted twice per call.

Once a connection's handshake is done, a `Framing` protocol takes its
transport over: each frame read is handed on as it arrives, from the
transport's own callback (no reader task, no task step per frame), and the
frames sent leave together: the server's at the end of the next turn of its
event loop, a worker's at the end of the current one. A write wakes the
other side; in the server's one more turn, more I/O comes in and more calls
send (under load six or seven frames share a write, a system call and a
wake-up; alone, a frame waits two turns of an idle loop). A worker's turn
may hold environment code, which no answer should wait for.

Messages:

- server -> worker: `(call_id, op, args)`, answered once; call id 0 asks for
  no answer (`end` of an episode, `cancel` of a call: the worker handles
  them as their frame arrives); while tracing is on, a call carries a
  fourth item, the trace context of the server's current span (W3C headers,
  `tracing.current_carrier`), so that tracing off costs the hop nothing;
- worker -> server: `(call_id, ok, value)`: the result, or the exception the
  environment raised (`portable_error` when it cannot be pickled); a tool's
  output, the answer of most calls, crosses as plain data (`answer_frame`:
  ok is `TOOL_OUTPUT`): pydantic's own serializer and validator, in Rust, turn it
  into and out of dicts for a fraction of what pickling its four models
  costs (pickle calls each model's `__reduce_ex__` and `__setstate__` in
  Python; that was over a quarter of a worker's CPU and a sixth of the
  server's loop in worker mode).
The first exchange is the worker's `Hello`, then the server's `Setup` (what
to import), then the worker's `Ready` (or the traceback of its failure).

Heartbeats travel on a second connection to the same socket, which a thread
of the worker opens once it is ready and writes to with a plain blocking
socket (`send_frame`), so that a worker whose event loop is stuck still
reports it: `Heartbeats` (who is reporting), then one `Heartbeat` every
`Setup.heartbeat_interval_s`, carrying the loop's lag and how long one
callback has held it, measured off the loop (`loop_monitor`). The server
never writes to that connection.

With `--isolation episode`, the server also speaks to the template process
over a socket pair it inherits: `Setup`, answered `Ready`; then `Fork`,
answered `Forked` with the child's pid; and, unasked, `Exited` when a child
ends. The template has no event loop: it uses `send_frame`/`recv_frame`.
"""

from __future__ import annotations

import asyncio
import pickle
import socket
import struct
from dataclasses import dataclass, field
from typing import Any, Callable, Optional

from ors_grpc.authoring.types import ImageBlock, RunToolError, RunToolOutput, RunToolSuccess, TextBlock, ToolOutput

__all__ = [
    "TOOL_OUTPUT", "Exited", "Fork", "Forked", "Framing", "Heartbeat", "Heartbeats", "Hello", "Ready", "Setup",
    "answer_frame", "answer_value", "portable_error", "read_frame", "recv_frame", "send_frame", "write_frame",
]

_HEADER = struct.Struct(">I")
#: A frame larger than this is a bug (messages are bounded by the server's message limit well below).
MAX_FRAME_BYTES = 1 << 30


@dataclass(frozen=True)
class Hello:
    """The worker's first frame: who it is."""

    worker_id: int
    pid: int


@dataclass(frozen=True)
class Setup:
    """The server's answer to Hello: what the worker imports, and from where."""

    #: The server's sys.path, so that MODULE:CLASS imports as it did in the server.
    sys_path: list[str]
    #: Environments by served name, as "module:qualname".
    environments: dict[str, str]
    #: Toolsets sessions may attach, as "module:qualname" (attached by that path).
    toolsets: list[str] = field(default_factory=list)
    log_level: int = 20
    #: `--isolation episode`: the worker exits once its one episode is over.
    exit_after_episode: bool = False
    #: Seconds between two heartbeats (0: send none, no stall limit is watched).
    heartbeat_interval_s: float = 0.0


@dataclass(frozen=True)
class Ready:
    """The worker imported everything (error: the traceback of what failed)."""

    error: str = ""


@dataclass(frozen=True)
class Heartbeats:
    """The first frame of a worker's heartbeat connection: whose heartbeats follow."""

    worker_id: int
    pid: int


@dataclass(frozen=True)
class Heartbeat:
    """The worker is alive; how its event loop does, in seconds."""

    #: How late the loop runs what it is given (a stuck loop's grows; so can a loaded one's).
    lag_s: float
    #: How long the one callback running on the loop now has run (grows only while one holds it).
    held_s: float


@dataclass(frozen=True)
class Fork:
    """Server -> template: fork a process that serves as worker `worker_id` on the hop at `socket_path`."""

    worker_id: int
    socket_path: str


@dataclass(frozen=True)
class Forked:
    """Template -> server: the process forked for worker `worker_id` is `pid`."""

    worker_id: int
    pid: int


@dataclass(frozen=True)
class Exited:
    """Template -> server: its child `pid` ended; `status` as Popen's returncode (-N: killed by signal N)."""

    pid: int
    status: int


def write_frame(writer: asyncio.StreamWriter, message: Any) -> None:
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    writer.write(_HEADER.pack(len(data)) + data)


def send_frame(sock: socket.socket, message: Any) -> None:
    """`write_frame` on a blocking socket (a thread off the event loop, or the template, which has none)."""
    data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
    sock.sendall(_HEADER.pack(len(data)) + data)


async def read_frame(reader: asyncio.StreamReader) -> Any:
    """The next message (asyncio.IncompleteReadError at the end of the stream)."""
    (size,) = _HEADER.unpack(await reader.readexactly(_HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"hop frame of {size} bytes")
    return pickle.loads(await reader.readexactly(size))


def recv_frame(sock: socket.socket) -> Any:
    """`read_frame` on a blocking socket (EOFError at the end of the stream)."""
    (size,) = _HEADER.unpack(_recv_exactly(sock, _HEADER.size))
    if size > MAX_FRAME_BYTES:
        raise ValueError(f"hop frame of {size} bytes")
    return pickle.loads(_recv_exactly(sock, size))


def _recv_exactly(sock: socket.socket, size: int) -> bytes:
    data = bytearray()
    while len(data) < size:
        chunk = sock.recv(size - len(data))
        if not chunk:
            raise EOFError("the hop closed")
        data += chunk
    return bytes(data)


class Framing(asyncio.Protocol):
    """The hop's frames on a connection whose handshake is done: `on_message(message)` for each
    frame as it arrives, `on_lost()` once the connection closed; `send` batches what is sent until
    the end of this turn of the loop, or with `wait_a_turn` of the next one."""

    def __init__(self, on_message: Callable[[Any], None], on_lost: Callable[[], None], *,
                 wait_a_turn: bool = False) -> None:
        self._on_message = on_message
        self._on_lost = on_lost
        self._loop = asyncio.get_running_loop()
        self._transport: Optional[asyncio.Transport] = None
        #: The start of a frame still coming, and how long that frame is (header included, once known).
        self._received = bytearray()
        self._wanted = 0
        #: Frames sent and not written yet, and what writes them (at the end of this turn, or of the next).
        self._outgoing: list[bytes] = []
        self._flush_soon = self._flush_next_turn if wait_a_turn else self.flush

    def take_over(self, writer: asyncio.StreamWriter) -> None:
        """Read and write `writer`'s connection from now on. Its stream reader holds nothing:
        a handshake ends with a frame that the other side waits for before it sends again."""
        self._transport = writer.transport  # type: ignore[assignment]  # a stream's (uvloop's in the server)
        writer.transport.set_protocol(self)

    def send(self, message: Any) -> None:
        data = pickle.dumps(message, protocol=pickle.HIGHEST_PROTOCOL)
        if not self._outgoing:
            self._loop.call_soon(self._flush_soon)
        self._outgoing.append(_HEADER.pack(len(data)))
        self._outgoing.append(data)

    def _flush_next_turn(self) -> None:
        self._loop.call_soon(self.flush)

    def flush(self) -> None:
        """Write the frames sent so far (when their turn ends, or now)."""
        outgoing, self._outgoing = self._outgoing, []
        if outgoing and self._transport is not None and not self._transport.is_closing():
            self._transport.write(b"".join(outgoing))

    async def drain(self) -> None:
        """Returns once what was sent has left this process (or the connection closed)."""
        self.flush()
        while self._transport is not None and not self._transport.is_closing() \
                and self._transport.get_write_buffer_size():
            await asyncio.sleep(0.005)

    def close(self) -> None:
        self.flush()
        if self._transport is not None:
            self._transport.close()

    def data_received(self, data: bytes) -> None:
        received = self._received
        if received:  # the start of a frame came before
            received += data
            if len(received) < self._wanted:  # (a large frame arrives in many reads: copied once)
                return
            data = bytes(received)
            received.clear()
        view, start, end = memoryview(data), 0, len(data)
        while end - start >= _HEADER.size:
            (size,) = _HEADER.unpack_from(data, start)
            if size > MAX_FRAME_BYTES:
                raise ValueError(f"hop frame of {size} bytes")  # the transport closes: the hop is lost
            stop = start + _HEADER.size + size
            if stop > end:
                break
            message = pickle.loads(view[start + _HEADER.size:stop])
            start = stop
            self._on_message(message)
        if start < end:
            received += view[start:]
            self._wanted = _HEADER.size + (_HEADER.unpack_from(data, start)[0] if end - start >= _HEADER.size else 0)

    def connection_lost(self, exc: Optional[Exception]) -> None:
        self._outgoing.clear()
        self._on_lost()


#: An answer's `ok` when its value is a tool's output as plain data (`answer_frame`).
TOOL_OUTPUT = 2
#: A tool output's block types (none of their subclasses: those cross as they are).
_BLOCK_TYPES = frozenset({TextBlock, ImageBlock})
# pydantic's own serializer and validator of the output, without model_dump's and model_validate's wrappers.
_dump_output = RunToolOutput.__pydantic_serializer__.to_python
_validate_output = RunToolOutput.__pydantic_validator__.validate_python


def answer_frame(call_id: int, value: Any) -> tuple[int, Any, Any]:
    """The frame answering call `call_id` with `value`. A tool's output made of our own types (no
    subclass, blocks in a list) goes as plain data, which validates back into an equal output: its
    dump is refused if any field holds what its type does not allow (a field assigned after
    validation), and then it goes as it is, like any other value."""
    if type(value) is RunToolOutput:
        root = value.root
        if type(root) is RunToolError or (
            type(root) is RunToolSuccess and type(root.output) is ToolOutput and type(root.output.blocks) is list
            and _BLOCK_TYPES.issuperset(map(type, root.output.blocks))
        ):
            try:
                return call_id, TOOL_OUTPUT, _dump_output(value, warnings="error")
            except Exception:
                pass
    return call_id, True, value


def answer_value(ok: Any, value: Any) -> Any:
    """The value of a successful answer (`ok` true, or `TOOL_OUTPUT`) as the worker had it."""
    return _validate_output(value) if ok == TOOL_OUTPUT else value


class ForeignError(Exception):
    """An exception of the environment that could not cross the hop as it
    is; `foreign_type` names its type (the server words errors `Type: message`)."""

    def __init__(self, foreign_type: str, message: str) -> None:
        super().__init__(foreign_type, message)
        self.foreign_type = foreign_type
        self.message = message

    def __str__(self) -> str:
        return self.message


def portable_error(exc: BaseException) -> BaseException:
    """`exc` if it survives a pickle round trip, else a ForeignError with its type name and message."""
    try:
        pickle.loads(pickle.dumps(exc, protocol=pickle.HIGHEST_PROTOCOL))
        return exc
    except Exception:
        return ForeignError(type(exc).__name__, str(exc))


def local_error(exc: BaseException) -> BaseException:
    """An exception from the hop as the server raises it: a ForeignError
    becomes an exception whose type has the original's name."""
    if isinstance(exc, ForeignError):
        return type(exc.foreign_type, (Exception,), {})(exc.message)
    return exc
