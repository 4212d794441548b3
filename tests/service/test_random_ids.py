"""The random ids clients and servers mint: uuid4s in their usual forms."""

import uuid

from ors_grpc.protocol.random_ids import uuid4_hex, uuid4_text


def test_hex_ids_are_version_4_uuids_in_hex() -> None:
    ids = {uuid4_hex() for _ in range(1000)}
    assert len(ids) == 1000
    for text in ids:
        parsed = uuid.UUID(hex=text)
        assert (parsed.version, parsed.variant, parsed.hex) == (4, uuid.RFC_4122, text)


def test_text_ids_are_version_4_uuids_as_str_writes_them() -> None:
    ids = {uuid4_text() for _ in range(1000)}
    assert len(ids) == 1000
    for text in ids:
        parsed = uuid.UUID(text)
        assert (parsed.version, parsed.variant, str(parsed)) == (4, uuid.RFC_4122, text)
