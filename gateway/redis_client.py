"""One way to open Redis for every process: a single server, or a Redis Cluster.

`redis_url` takes the forms redis-py and the `limits` library take: `redis://[:password@]host:port/db`
(or `rediss://`, `unix://`) for one server, and `redis+cluster://[:password@]host:port[,host:port...]`
(or `rediss+cluster://`) for a cluster, the seed nodes comma-separated. Whatever the form, the keys that
one script touches share a hash slot (gateway/keys.py), so every script runs on a cluster.

At start, `check_redis` refuses a plain URL that points at a cluster node (every other key would answer
MOVED) and warns when the server can lose queued messages: an eviction policy other than `noeviction`
drops keys under memory pressure, and without AOF or snapshots a restart forgets the queue.
"""

from __future__ import annotations

import logging
from urllib.parse import unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.exceptions import RedisError, ResponseError

log = logging.getLogger(__name__)
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}


class RedisConfigError(ValueError):
    """The Redis that `redis_url` names cannot serve botgw (the message says why and what to write)."""


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def _cluster_client(url: str, **options: float) -> RedisCluster:
    parts = urlsplit(url)
    userinfo, _, hosts = parts.netloc.rpartition("@")
    nodes = []
    for seed in filter(None, hosts.split(",")):
        host, _, port = seed.rpartition(":")
        if not host or not port.isdigit():
            raise RedisConfigError(f"redis_url: a cluster seed must be host:port, not {seed!r}")
        nodes.append(ClusterNode(host.strip("[]"), int(port)))
    if not nodes:
        raise RedisConfigError("redis_url: a redis+cluster:// URL names no host:port")
    if parts.path.strip("/") not in ("", "0"):
        raise RedisConfigError("redis_url: a Redis Cluster has only database 0; drop the /<db> from the URL")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    return RedisCluster(
        startup_nodes=nodes,
        username=unquote(username) or None,
        password=unquote(password) or None,
        ssl=CLUSTER_SCHEMES[parts.scheme.lower()] == "rediss",
        **options,
    )


def open_redis(url: str, **options: float) -> Redis:
    """A client for `url`: `RedisCluster` for a `redis+cluster://` URL (it has the same commands), else `Redis`."""
    if is_cluster_url(url):
        return _cluster_client(url, **options)  # type: ignore[return-value]
    return Redis.from_url(url, **options)


def limits_uri(url: str) -> str:
    """The `limits` library's name of the same storage: `async+redis://…`, `async+redis+cluster://…`."""
    scheme = urlsplit(url).scheme.lower()
    if scheme.startswith("async+"):
        return url
    if scheme == "rediss+cluster":  # the limits library spells TLS as an option, not a scheme, for clusters
        return "async+redis+cluster" + url[len(scheme) :] + ("&" if "?" in url else "?") + "ssl=true"
    return f"async+{url}"


async def _server_settings(redis: Redis) -> dict[str, str]:
    """maxmemory-policy, appendonly and save, from CONFIG GET, else (a managed service refusing CONFIG) INFO."""
    try:
        settings: dict[str, str] = {}
        for name in ("maxmemory-policy", "appendonly", "save"):
            settings.update({str(k): str(v) for k, v in (await redis.config_get(name)).items()})
        return settings
    except ResponseError:
        memory, persistence = await redis.info("memory"), await redis.info("persistence")
        return {
            "maxmemory-policy": str(memory.get("maxmemory_policy", "noeviction")),
            "appendonly": "yes" if str(persistence.get("aof_enabled", 0)) == "1" else "no",
        }  # no `save`: INFO does not show the snapshot schedule


async def check_redis(redis: Redis, url: str) -> list[str]:
    """Refuse a plain URL at a cluster node; return (and log) warnings about settings that can lose messages.

    In a cluster, one node answers for all: they are meant to be configured alike."""
    try:
        cluster_enabled = str((await redis.info("cluster")).get("cluster_enabled", 0)) == "1"
        settings = await _server_settings(redis)
    except ResponseError as exc:
        log.info("could not read the Redis server's settings (%s); eviction and persistence not checked", exc)
        return []
    except RedisError as exc:  # Redis not up yet: the process retries its calls; nothing to check now
        log.warning("Redis did not answer at start (%s); eviction and persistence not checked", type(exc).__name__)
        return []
    if cluster_enabled and not is_cluster_url(url):
        raise RedisConfigError(
            "redis_url points at a Redis Cluster node, but names one server: write it as "
            "redis+cluster://host:port[,host:port...] so that botgw follows the cluster's slots"
        )
    warnings = []
    policy = settings.get("maxmemory-policy", "noeviction")
    if policy != "noeviction":
        warnings.append(
            f"Redis maxmemory-policy is {policy!r}: under memory pressure Redis deletes keys, queued messages "
            "and reply records among them; set maxmemory-policy noeviction"
        )
    if settings.get("appendonly") != "yes":
        if settings.get("save", "unknown").strip() == "":
            warnings.append(
                "Redis persistence is off (no AOF, no snapshots): a Redis restart forgets every queued message; "
                "set appendonly yes (appendfsync everysec)"
            )
        else:
            warnings.append(
                "Redis AOF is off: a crash loses what was queued since the last snapshot; set appendonly yes"
            )
    for warning in warnings:
        log.warning(warning)
    return warnings
