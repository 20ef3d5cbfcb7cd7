"""Streamed answers kept in Redis, so that any replica can answer any WeCom refresh callback.

A stream's visible text only ever grows: every update is checked, inside Redis, to extend
what was shown before, and a finished stream never changes again. That is what lets a
worker that takes over a dead worker's message, or a replica answering a refresh, never
show the user text going backwards.

A stream may also carry a question's buttons (the page's 确认/取消 under a tool call's question), stored before
it is finished, so that a reader of the finished stream sees them at once.
"""

from __future__ import annotations

import time
from dataclasses import dataclass

from redis.asyncio import Redis

from gateway.state.keys import Keys
from gateway.state.reply_record import Fence

# KEYS: stream hash, user's active set; ARGV: stream id, now, max age, limit, ttl
_OPEN = """
redis.call('ZREMRANGEBYSCORE', KEYS[2], '-inf', tonumber(ARGV[2]) - tonumber(ARGV[3]))
if redis.call('ZSCORE', KEYS[2], ARGV[1]) then return 1 end
-- A finished stream opened again (WeCom retrying its first callback late) is rejoined, not counted again.
if redis.call('HGET', KEYS[1], 'finish') == '1' then return 1 end
if redis.call('ZCARD', KEYS[2]) >= tonumber(ARGV[4]) then return 0 end
redis.call('ZADD', KEYS[2], ARGV[2], ARGV[1])
redis.call('EXPIRE', KEYS[2], ARGV[5])
redis.call('HSETNX', KEYS[1], 'created', ARGV[2])
redis.call('HSETNX', KEYS[1], 'content', '')
redis.call('HSETNX', KEYS[1], 'finish', '0')
redis.call('HSETNX', KEYS[1], 'active', KEYS[2])  -- its opener's for good: a forged first callback re-pointed it
redis.call('EXPIRE', KEYS[1], ARGV[5])
return 1
"""

# KEYS: stream hash, the writer's lease (the stream hash again when unfenced).
# ARGV: new content, finish ('1' or '0'), now, stream id, lease epoch ('' = unfenced), notification channel.
# Returns 1 if applied, 0 if refused (finished, or not extending what was shown), -1 if the lease is lost.
_UPDATE = """
if ARGV[5] ~= '' and redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[5] then return -1 end
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'finish') == '1' then return 0 end
local old = redis.call('HGET', KEYS[1], 'content') or ''
local new = ARGV[1]
if string.sub(new, 1, #old) ~= old then return 0 end
redis.call('HSET', KEYS[1], 'content', new, 'updated', ARGV[3])
if ARGV[2] ~= '0' then
  redis.call('HSET', KEYS[1], 'finish', '1')
  if ARGV[2] == 'timeout' then redis.call('HSET', KEYS[1], 'timed_out', '1') end
  local active = redis.call('HGET', KEYS[1], 'active')
  if active then redis.call('ZREM', active, ARGV[4]) end
end
redis.call('PUBLISH', ARGV[6], ARGV[2])
return 1
"""

# KEYS: stream hash, the writer's lease (the stream hash again when unfenced). ARGV: the question (JSON), lease epoch.
# Returns 1 if the stream carries the question (now, or already), 0 if it was finished without it, -1 if the lease
# is lost.
_QUESTION = """
if ARGV[2] ~= '' and redis.call('HGET', KEYS[2], 'epoch') ~= ARGV[2] then return -1 end
if redis.call('HGET', KEYS[1], 'question') == ARGV[1] then return 1 end
if redis.call('EXISTS', KEYS[1]) == 0 or redis.call('HGET', KEYS[1], 'finish') == '1' then return 0 end
redis.call('HSET', KEYS[1], 'question', ARGV[1])
return 1
"""


@dataclass(frozen=True)
class StreamState:
    """What the user has been shown of one streamed answer."""

    content: str
    finished: bool
    created: float
    question: str = ""  # the buttons the answer ends with (bots.buttons.Question as JSON; the page shows them)
    timed_out: bool = False  # finished by a refresh at the platform's time limit, not by its answer (close_late)
    owner: str = ""  # the opener's set of unfinished streams (Keys.active_streams): whose answer it is


class StreamStore:
    """Open, grow, finish and read streams; the limit of unfinished streams per user is kept here too."""

    def __init__(self, redis: Redis, keys: Keys, ttl_s: int = 3600) -> None:
        self._redis = redis
        self._keys = keys
        self._ttl_s = ttl_s
        self._open = redis.register_script(_OPEN)
        self._update = redis.register_script(_UPDATE)
        self._question = redis.register_script(_QUESTION)

    async def open(self, bot_id: str, user: str, stream_id: str, *, limit: int, max_age_s: float) -> bool:
        """Start (or rejoin) a stream; False when the user already has `limit` unfinished ones."""
        keys = [self._keys.stream(stream_id), self._keys.active_streams(bot_id, user)]
        args = [stream_id, f"{time.time():.3f}", max_age_s, limit, self._ttl_s]
        return bool(await self._open(keys=keys, args=args))

    def events_channel(self, stream_id: str) -> str:
        """The pub/sub channel on which every applied update of this stream is announced."""
        return self._keys.stream_events(stream_id)

    async def get(self, stream_id: str) -> StreamState | None:
        raw = await self._redis.hgetall(self._keys.stream(stream_id))
        if not raw:
            return None
        fields = {k.decode(): v.decode() for k, v in raw.items()}
        return StreamState(
            fields.get("content", ""),
            fields.get("finish") == "1",
            float(fields.get("created", 0)),
            fields.get("question", ""),
            fields.get("timed_out") == "1",
            fields.get("active", ""),
        )

    def belongs(self, state: StreamState, bot_id: str) -> bool:
        """Whether `state` is an answer of `bot_id`'s (the opener's set of streams names the bot)."""
        return state.owner.startswith(self._keys.active_streams(bot_id, ""))

    async def update(
        self, stream_id: str, content: str, *, finish: bool = False, fence: Fence | None = None
    ) -> bool | None:
        """Show `content` (which must extend what is shown); True if applied, None if `fence` is no longer held."""
        return await self._write(stream_id, content, "1" if finish else "0", fence)

    async def close_late(self, stream_id: str, content: str) -> bool:
        """Finish the stream with `content` at the platform's time limit, marked so (`timed_out`) in the same step:
        its answer, when it comes, knows the stream cannot show it (gateway/delivery/stream.py)."""
        return bool(await self._write(stream_id, content, "timeout", None))

    async def _write(self, stream_id: str, content: str, finish: str, fence: Fence | None) -> bool | None:
        stream_key = self._keys.stream(stream_id)
        lease_key, epoch = (fence.lease_key, fence.epoch) if fence else (stream_key, "")
        channel = self._keys.stream_events(stream_id)  # a channel, not a key: in ARGV (no cluster slot)
        args = [content, finish, f"{time.time():.3f}", stream_id, epoch, channel]
        result = int(await self._update(keys=[stream_key, lease_key], args=args))
        return None if result < 0 else bool(result)

    async def ask(self, stream_id: str, question: str, *, fence: Fence | None = None) -> bool | None:
        """Let the stream end with `question`'s buttons: stored before the stream is finished, so that whoever reads
        the finished stream sees them with it. True if it carries them, False if it was finished without them, None
        if `fence` is no longer held."""
        stream_key = self._keys.stream(stream_id)
        lease_key, epoch = (fence.lease_key, fence.epoch) if fence else (stream_key, "")
        result = int(await self._question(keys=[stream_key, lease_key], args=[question, epoch]))
        return None if result < 0 else bool(result)
