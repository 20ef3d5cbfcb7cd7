"""hiredis packs commands to the same bytes as redis-py's Python packer, and refuses what it refuses."""

from __future__ import annotations

import pytest
from redis.asyncio.connection import Connection
from redis.exceptions import DataError

from gateway.state import redis_wire

COMMANDS = [
    ("SET", "k", "v"),
    ("EVALSHA", "a" * 40, 2, "q:{lane}", "r:{lane}", 0.1, 1e20, -3, 123456789.123456789, float("inf")),
    ("HSET", "k", "text", "你好，世界 ✓", "raw", b"\x00\xff bytes"),
    ("CONFIG GET", "maxmemory"),
    (b"CLIENT SETNAME", "botgw"),
    ("SET", "k", bytearray(b"ba")),
    ("SET", "k", memoryview(b"mv")),
    ("SET", "k", memoryview(b"abcdefgh")[::2]),  # strided views: hiredis would read the raw buffer
    ("SET", "k", memoryview(b"abcdefgh")[::-1]),
    ("SET", "k", "大" * 10_000, b"x" * 10_000),  # large values go out in chunks of their own
    ("", "a b", 1),
]


@pytest.mark.parametrize("command", COMMANDS, ids=lambda command: str(command[0]))
def test_hiredis_packs_the_bytes_redis_py_packs(command: tuple) -> None:
    connection = Connection()
    expected = b"".join(bytes(chunk) for chunk in redis_wire._python_pack(connection, *command))
    assert b"".join(bytes(chunk) for chunk in redis_wire._pack(connection, *command)) == expected


def test_a_value_redis_py_refuses_is_refused_the_same_way() -> None:
    with pytest.raises(DataError):
        redis_wire._pack(Connection(), "SET", "k", True)


def test_another_encoding_keeps_redis_py_packer() -> None:
    connection = Connection(encoding="latin-1")
    assert redis_wire._pack(connection, "SET", "k", "é") == redis_wire._python_pack(connection, "SET", "k", "é")
