"""The page's uploads kept in Redis until the worker reads them (bots/web/uploads.py's `UploadStore`).

One hash per upload, named by its bot, its owner and its ref, with a TTL: the worker of any replica finds it,
another user's name finds nothing, and an upload nobody asked about is gone by itself.
"""

from __future__ import annotations

from redis.asyncio import Redis

from bots.parts import Downloaded
from bots.web.uploads import Upload, UploadInfo
from gateway.state.keys import Keys


class RedisUploadStore:
    def __init__(self, redis: Redis, keys: Keys) -> None:
        self._redis = redis
        self._keys = keys

    async def put(self, bot_id: str, owner: str, ref: str, upload: Upload, ttl_s: int) -> None:
        key = self._keys.web_upload(bot_id, owner, ref)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hset(key, mapping={"data": upload.data, "mime": upload.mime, "name": upload.name})
            pipe.expire(key, ttl_s)
            await pipe.execute()

    async def info(self, bot_id: str, owner: str, ref: str) -> UploadInfo | None:
        key = self._keys.web_upload(bot_id, owner, ref)
        async with self._redis.pipeline(transaction=True) as pipe:
            pipe.hmget(key, "mime", "name")
            pipe.hstrlen(key, "data")
            (mime, name), size = await pipe.execute()
        if mime is None:
            return None
        return UploadInfo(mime.decode(), (name or b"").decode(), int(size))

    async def get(self, bot_id: str, owner: str, ref: str) -> Downloaded | None:
        data, mime, name = await self._redis.hmget(self._keys.web_upload(bot_id, owner, ref), "data", "mime", "name")
        if data is None or mime is None:
            return None
        return Downloaded(data, mime.decode(), (name or b"").decode())
