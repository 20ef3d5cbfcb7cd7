"""The tools' audit trail (tools/audit.py) against a real redis-server: secrets masked before they are stored,
filters by person and age, newest last, the most recent `limit`, and retention by age and by count; and on a
real Redis Cluster."""

from __future__ import annotations

import secrets
import time

import pytest
from redis.asyncio import Redis

from gateway.state.keys import Keys
from gateway.state.redis_client import open_redis
from tools.audit import READ_PAGE, AuditRecord, ToolAudit, encode, parse_duration
from tools.config import ToolsSettings

ALICE, BOB = "wecom:ww1:alice", "wecom:ww1:bob"


def fresh_keys() -> Keys:
    return Keys("a" + secrets.token_hex(4))


def call(user: str, n: int, **arguments: object) -> AuditRecord:
    return AuditRecord(ts=time.time(), bot="assistant", user=user, tool="rooms.book", kind="call",
                       arguments={"n": n, **arguments}, outcome="ok", duration_ms=n)


async def test_secret_looking_arguments_are_masked_before_they_are_stored(redis: Redis) -> None:
    keys = fresh_keys()
    audit = ToolAudit(redis, keys, ToolsSettings())
    arguments = {
        "room": "A-301", "keyword": "kept", "tokens_used": 7, "monkey": "kept too",
        "Password": "pw-1", "passwd": "pw-2", "access_token": "tok-1", "apiKey": "key-1", "API-KEY": "key-2",
        "client_secret": "sec-1", "Authorization": "Bearer b-1", "cookie": "c-1",
        "nested": {"db": {"user": "u", "PASSWORD": "pw-3"}, "items": [{"sessionToken": "tok-2", "id": 1}]},
    }
    await audit.record(AuditRecord(ts=time.time(), bot="assistant", user=ALICE, tool="rooms.book",
                                   kind="confirm_asked", arguments=arguments))
    raw = repr(await redis.xrange(keys.tools_audit))
    for secret in ("pw-1", "pw-2", "pw-3", "tok-1", "tok-2", "key-1", "key-2", "sec-1", "b-1", "c-1"):
        assert secret not in raw, f"{secret} stored in the trail: {raw}"

    [stored] = await audit.read()
    assert stored.arguments == {
        "room": "A-301", "keyword": "kept", "tokens_used": 7, "monkey": "kept too",
        "Password": "***", "passwd": "***", "access_token": "***", "apiKey": "***", "API-KEY": "***",
        "client_secret": "***", "Authorization": "***", "cookie": "***",
        "nested": {"db": {"user": "u", "PASSWORD": "***"}, "items": [{"sessionToken": "***", "id": 1}]},
    }
    assert stored.kind == "confirm_asked" and stored.outcome == "" and stored.user == ALICE
    assert set(stored.to_json()) == {"ts", "bot", "user", "tool", "kind", "arguments", "outcome", "duration_ms"}


async def test_read_filters_by_person_newest_last_and_keeps_the_most_recent_limit(redis: Redis) -> None:
    """Bob's records outnumber a page of the stream several times over, so Alice's are found across pages."""
    keys = fresh_keys()
    audit = ToolAudit(redis, keys, ToolsSettings())
    alice_at, total = {0, 1, 700, 1499, 1500}, 1501
    assert total > 2 * READ_PAGE
    for n in range(total):
        await audit.record(call(ALICE if n in alice_at else BOB, n))

    alices = await audit.read(user=ALICE)
    assert [r.arguments["n"] for r in alices] == sorted(alice_at) and {r.user for r in alices} == {ALICE}
    assert [r.arguments["n"] for r in await audit.read(user=ALICE, limit=2)] == [1499, 1500]
    everyone = await audit.read(limit=1501)
    assert [r.arguments["n"] for r in everyone] == list(range(1501))
    assert [r.arguments["n"] for r in await audit.read()] == list(range(501, 1501)), "the default: 1000 newest"
    assert [r.arguments["n"] for r in await audit.read(user=BOB, limit=3)] == [1496, 1497, 1498]
    assert await audit.read(user="wecom:ww1:nobody") == []
    assert await audit.read(user="wecom:ww1:ali") == [], "a person is matched exactly, not by prefix"


async def test_since_leaves_out_older_records(redis: Redis) -> None:
    """A record written two hours ago (its stream id then) is outside `since` one hour, inside three."""
    keys = fresh_keys()
    audit = ToolAudit(redis, keys, ToolsSettings())
    two_hours_ago = time.time() - 7200
    old = AuditRecord(ts=two_hours_ago, bot="assistant", user=ALICE, tool="rooms.list", kind="call",
                      arguments={"n": 0}, outcome="error", duration_ms=3)
    await redis.xadd(keys.tools_audit, encode(old), id=f"{int(two_hours_ago * 1000)}-0")
    await audit.record(call(ALICE, 1))

    assert [r.arguments["n"] for r in await audit.read(since_s=3600)] == [1]
    assert [r.arguments["n"] for r in await audit.read(user=ALICE, since_s=3 * 3600)] == [0, 1]
    [back] = (await audit.read())[:1]
    assert back == old


async def test_records_past_the_retention_are_trimmed_and_never_shown(redis: Redis) -> None:
    """Trimming is approximate (whole stream nodes, 100 entries each by default): most old records go at the
    next write, and those left in a node with newer ones are still not read."""
    keys = fresh_keys()
    audit = ToolAudit(redis, keys, ToolsSettings(audit_retention_days=1))
    two_days_ago_ms = int((time.time() - 2 * 86400) * 1000)
    for n in range(250):
        old = AuditRecord(ts=two_days_ago_ms / 1000, bot="b", user=ALICE, tool="rooms.list", kind="call",
                          arguments={"n": -n})
        await redis.xadd(keys.tools_audit, encode(old), id=f"{two_days_ago_ms + n}-0")
    assert await redis.xlen(keys.tools_audit) == 250

    await audit.record(call(ALICE, 1))
    left = await redis.xlen(keys.tools_audit)
    assert left <= 100, f"{left} entries: the old nodes were not trimmed"
    assert [r.arguments["n"] for r in await audit.read()] == [1]


async def test_the_trail_is_cut_to_about_audit_max_records(redis: Redis) -> None:
    keys = fresh_keys()
    audit = ToolAudit(redis, keys, ToolsSettings(audit_max_records=1000))
    for n in range(1300):
        await audit.record(call(BOB, n))
    length = await redis.xlen(keys.tools_audit)
    assert 1000 <= length < 1300, length
    newest = await audit.read(limit=10)
    assert [r.arguments["n"] for r in newest] == list(range(1290, 1300))


async def test_the_trail_works_on_a_redis_cluster(redis_cluster_url: str) -> None:
    client = open_redis(redis_cluster_url)
    try:
        audit = ToolAudit(client, fresh_keys(), ToolsSettings())
        for n in range(3):
            await audit.record(call(ALICE if n != 1 else BOB, n, token="tok-cluster"))
        shown = await audit.read(user=ALICE)
        assert [(r.arguments["n"], r.arguments["token"]) for r in shown] == [(0, "***"), (2, "***")]
    finally:
        await client.aclose()


@pytest.mark.parametrize(("text", "seconds"), [("90s", 90), ("30m", 1800), ("12h", 43200), ("7d", 604800),
                                               ("45", 45), ("1.5h", 5400)])
def test_durations_in_the_forms_operators_write(text: str, seconds: float) -> None:
    assert parse_duration(text) == seconds


@pytest.mark.parametrize("text", ["", "soon", "-5", "0", "5w", "1h30m", "1" * 400])
def test_a_bad_duration_names_the_forms(text: str) -> None:
    with pytest.raises(ValueError, match="90s, 30m, 12h, 7d or bare seconds"):
        parse_duration(text)
