"""One ORS episode over our gRPC service, through the generated stubs.

The same methods as ``HttpDoor`` so that one episode function drives both.
"""

import json
import uuid

import grpc

from ors_grpc._generated.ors.v1 import environment_service_pb2 as pb
from ors_grpc._generated.ors.v1 import environment_service_pb2_grpc as pb_grpc
from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.protocol.constants import SESSION_ID_METADATA_KEY

ENV = "benchenv"
MAX_MESSAGE = 64 * 1024 * 1024


class GrpcDoor:
    """Our gRPC service at ``target`` (``host:port``), over one shared channel."""

    def __init__(self, target: str):
        self.target = target
        self.channel: grpc.aio.Channel | None = None
        self.stub: pb_grpc.EnvironmentServiceStub | None = None

    async def __aenter__(self) -> "GrpcDoor":
        options = [("grpc.max_receive_message_length", MAX_MESSAGE),
                   ("grpc.max_send_message_length", MAX_MESSAGE)]
        self.channel = grpc.aio.insecure_channel(self.target, options=options)
        self.stub = pb_grpc.EnvironmentServiceStub(self.channel)
        return self

    async def __aexit__(self, *exc) -> None:
        await self.channel.close()

    async def new_session_id(self) -> str:
        return (await self.stub.CreateSessionId(pb.CreateSessionIdRequest())).session_id

    async def open_episode(self, sid: str, target: int) -> None:
        metadata = ((SESSION_ID_METADATA_KEY, sid),)
        spec = types_pb2.JsonValue(json=json.dumps({"target": target}))
        await self.stub.CreateEpisode(
            pb.CreateEpisodeRequest(session_id=sid, env_name=ENV, task_spec=spec), metadata=metadata)
        prompt = await self.stub.GetPrompt(pb.GetPromptRequest(session_id=sid), metadata=metadata)
        assert prompt.blocks and prompt.blocks[0].HasField("text"), prompt

    async def _call(self, sid: str, name: str, tool_input: dict) -> types_pb2.ToolOutput:
        call = types_pb2.ToolCall(name=name, input=types_pb2.JsonValue(json=json.dumps(tool_input)))
        result = None
        stream = self.stub.CallTool(pb.CallToolRequest(session_id=sid, call=call),
                                    metadata=((SESSION_ID_METADATA_KEY, sid),))
        async for event in stream:
            kind = event.WhichOneof("event")
            if kind == "result":
                result = event.result
            elif kind == "failure":
                raise RuntimeError(f"tool failure: {event.failure.message}")
        if result is None or result.WhichOneof("outcome") != "output":
            raise RuntimeError(f"tool refused: {result}")
        return result.output

    async def call_tool(self, sid: str, name: str, tool_input: dict) -> dict:
        output = await self._call(sid, name, tool_input)
        reward = output.reward if output.HasField("reward") else None
        return {"finished": output.finished, "reward": reward}

    async def image_call(self, sid: str) -> int:
        output = await self._call(sid, "big_image", {})
        return len(output.blocks[0].image.data)

    async def close_episode(self, sid: str) -> None:
        metadata = ((SESSION_ID_METADATA_KEY, sid),)
        await self.stub.DeleteEpisode(pb.DeleteEpisodeRequest(session_id=sid), metadata=metadata)
        await self.stub.DeleteSessionId(pb.DeleteSessionIdRequest(session_id=sid), metadata=metadata)

    async def open_idle_session(self) -> None:
        await self.open_episode(str(uuid.uuid4()), 10)
