"""The proto enums that have JSON names in ORS (split types, message roles,
refusal reasons, how an episode ended): one table each, read both ways by
the service, the client and the doors."""

from __future__ import annotations

from typing import Generic, Hashable, Mapping, Optional, TypeVar

from ors_grpc._generated.ors.v1 import environment_service_pb2 as service_pb2
from ors_grpc._generated.ors.v1 import types_pb2

__all__ = ["EPISODE_END", "MESSAGE_ROLE", "RUN_TOOL_ERROR_REASON", "SPLIT_TYPE", "EnumCodec"]

Name = TypeVar("Name", bound=Optional[Hashable])


class EnumCodec(Generic[Name]):
    """A proto enum's values by their JSON names, and back."""

    def __init__(self, values: Mapping[Name, int]) -> None:
        self._values = dict(values)
        self._names = {value: name for name, value in self._values.items()}

    def value(self, name: Name) -> int:
        """The value of `name` (KeyError for a name the enum does not have)."""
        return self._values[name]

    def value_or(self, name: Name, default: int) -> int:
        return self._values.get(name, default)

    def name(self, value: int, default: Optional[Name] = None) -> Optional[Name]:
        """The JSON name of `value`; `default` for UNSPECIFIED or a value this build does not know."""
        return self._names.get(value, default)


SPLIT_TYPE: EnumCodec[str] = EnumCodec({
    "train": types_pb2.SPLIT_TYPE_TRAIN,
    "validation": types_pb2.SPLIT_TYPE_VALIDATION,
    "test": types_pb2.SPLIT_TYPE_TEST,
})

MESSAGE_ROLE: EnumCodec[str] = EnumCodec({
    "system": types_pb2.MESSAGE_ROLE_SYSTEM,
    "user": types_pb2.MESSAGE_ROLE_USER,
    "assistant": types_pb2.MESSAGE_ROLE_ASSISTANT,
})

#: RunToolError `reason` (openreward's); None (JSON null) is UNSPECIFIED.
RUN_TOOL_ERROR_REASON: EnumCodec[Optional[str]] = EnumCodec({
    None: types_pb2.RUN_TOOL_ERROR_REASON_UNSPECIFIED,
    "not_found": types_pb2.RUN_TOOL_ERROR_REASON_NOT_FOUND,
    "name_collision": types_pb2.RUN_TOOL_ERROR_REASON_NAME_COLLISION,
    "input_validation": types_pb2.RUN_TOOL_ERROR_REASON_INPUT_VALIDATION,
    "episode_finished": types_pb2.RUN_TOOL_ERROR_REASON_EPISODE_FINISHED,
})

#: EpisodeRecord `ended`; None (JSON null) is UNSPECIFIED: the episode is live.
EPISODE_END: EnumCodec[Optional[str]] = EnumCodec({
    None: service_pb2.EPISODE_END_UNSPECIFIED,
    "deleted": service_pb2.EPISODE_END_DELETED,
    "reaped": service_pb2.EPISODE_END_REAPED,
    "server_stopped": service_pb2.EPISODE_END_SERVER_STOPPED,
})
