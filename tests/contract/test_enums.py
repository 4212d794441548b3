"""The enum tables of ors_grpc/protocol/enums.py name every value of their
proto enum (a value added to the proto without a JSON name fails here), and
read the same both ways."""

from __future__ import annotations

import pytest

from ors_grpc._generated.ors.v1 import types_pb2
from ors_grpc.protocol.enums import MESSAGE_ROLE, RUN_TOOL_ERROR_REASON, SPLIT_TYPE, EnumCodec


@pytest.mark.parametrize("codec, enum, unspecified_name", [
    (SPLIT_TYPE, types_pb2.SplitType, None),
    (MESSAGE_ROLE, types_pb2.MessageRole, None),
    (RUN_TOOL_ERROR_REASON, types_pb2.RunToolErrorReason, None),
], ids=["split type", "message role", "run-tool refusal reason"])
def test_every_proto_value_has_one_json_name(codec: EnumCodec, enum, unspecified_name) -> None:
    for value in enum.values():
        name = codec.name(value)
        if enum.Name(value).endswith("_UNSPECIFIED"):
            assert name is unspecified_name
            continue
        assert name is not None, enum.Name(value)
        assert enum.Name(value).endswith("_" + name.upper())
        assert codec.value(name) == value


def test_unknown_values_and_names_fall_back_where_asked() -> None:
    assert SPLIT_TYPE.name(99, "validation") == "validation"
    assert SPLIT_TYPE.value_or("dev", types_pb2.SPLIT_TYPE_VALIDATION) == types_pb2.SPLIT_TYPE_VALIDATION
    assert RUN_TOOL_ERROR_REASON.value(None) == types_pb2.RUN_TOOL_ERROR_REASON_UNSPECIFIED
    with pytest.raises(KeyError):
        MESSAGE_ROLE.value("tool")
