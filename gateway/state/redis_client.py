"""One way to open Redis for every process: a single server, or a Redis Cluster.

`redis_url` takes the forms redis-py and the `limits` library take: `redis://[:password@]host:port/db`
(or `rediss://`, `unix://`) for one server; `redis+cluster://[:password@]host:port[,host:port...]` (or
`rediss+cluster://`) for a cluster, the seed nodes comma-separated; and
`redis+sentinel://[:password@]host:port[,host:port...]/service_name[/db]` for a primary that Sentinel
watches (the password is the primary's; `?sentinel_password=` if the sentinels ask for one too), followed
through failovers. Whatever the form, the keys that one script touches share a hash slot (gateway/state/keys.py),
so every script runs on a cluster.

At start, `check_redis` refuses a plain URL that points at a cluster node (every other key would answer
MOVED) and warns when the server can lose queued messages: an eviction policy other than `noeviction`
drops keys under memory pressure, and without AOF or snapshots a restart forgets the queue.
"""

from __future__ import annotations

import asyncio
import logging
import re
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from urllib.parse import parse_qs, unquote, urlsplit

from redis.asyncio import Redis
from redis.asyncio.cluster import ClusterNode, RedisCluster
from redis.asyncio.sentinel import MasterNotFoundError, Sentinel
from redis.exceptions import AuthenticationError, RedisClusterException, RedisError, ResponseError

from bots.urls import redact_url
from gateway.state import redis_wire

log = logging.getLogger(__name__)
CLUSTER_SCHEMES = {"redis+cluster": "redis", "rediss+cluster": "rediss"}
SENTINEL_SCHEME = "redis+sentinel"
SCHEMES = ("redis", "rediss", "unix", *CLUSTER_SCHEMES, SENTINEL_SCHEME)  # every form open_redis takes
STARTUP_WAIT_S = 30.0  # how long a process waits at start for a Redis that is not up yet


class RedisConfigError(ValueError):
    """The Redis that `redis_url` names cannot serve botgw (the message says why and what to write)."""


class RedisUnavailable(Exception):
    """Redis is down, unreachable, or refuses botgw's credentials: a dependency, not the configuration."""


def redis_address(url: str) -> str:
    """Where `url` points, for messages: host:port (each seed of a cluster or sentinel URL) or a socket path,
    never the user name or password."""
    shown = redact_url(url)
    scheme, _, rest = shown.partition("://")
    if rest.startswith("(address hidden"):
        return "the address in redis_url (hidden: its password holds / ? # or @)"
    if scheme.lower() == "unix":
        return rest.partition("?")[0] or "a unix socket"
    hosts = re.split(r"[/?]", rest, maxsplit=1)[0].rpartition("@")[2]
    seeds = [seed if ":" in seed.rsplit("]", 1)[-1] else f"{seed}:6379" for seed in hosts.split(",") if seed]
    return ",".join(seeds) or "localhost:6379"


def is_cluster_url(url: str) -> bool:
    return urlsplit(url).scheme.lower() in CLUSTER_SCHEMES


def _hosts_and_credentials(url: str, kind: str) -> tuple[list[tuple[str, int]], str | None, str | None]:
    """The comma-separated host:port list of a cluster or sentinel URL, and its user name and password."""
    userinfo, _, hosts = urlsplit(url).netloc.rpartition("@")
    nodes = []
    for seed in filter(None, hosts.split(",")):
        host, _, port = seed.rpartition(":")
        if not host or not port.isdigit():
            raise RedisConfigError(f"redis_url: a {kind} address must be host:port, not {seed!r}")
        nodes.append((host.strip("[]"), int(port)))
    if not nodes:
        raise RedisConfigError(f"redis_url: the {kind} URL names no host:port")
    username, _, password = userinfo.partition(":") if userinfo else ("", "", "")
    return nodes, unquote(username) or None, unquote(password) or None


def _cluster_client(url: str, **options: float) -> RedisCluster:
    parts = urlsplit(url)
    nodes, username, password = _hosts_and_credentials(url, "cluster seed")
    if parts.path.strip("/") not in ("", "0"):
        raise RedisConfigError("redis_url: a Redis Cluster has only database 0; drop the /<db> from the URL")
    return RedisCluster(
        startup_nodes=[ClusterNode(host, port) for host, port in nodes],
        username=username,
        password=password,
        ssl=CLUSTER_SCHEMES[parts.scheme.lower()] == "rediss",
        **options,
    )


def _sentinel_client(url: str, **options: float) -> Redis:
    parts = urlsplit(url)
    sentinels, username, password = _hosts_and_credentials(url, "sentinel")
    path = [segment for segment in parts.path.split("/") if segment]
    if not path or len(path) > 2 or (len(path) == 2 and not path[1].isdigit()):
        raise RedisConfigError(
            "redis_url: a Sentinel URL is redis+sentinel://host:port[,host:port...]/service_name[/db] "
            "(service_name is the primary's name in the sentinels' `sentinel monitor` line)"
        )
    query = parse_qs(parts.query)
    sentinel_kwargs = {key: value for key, value in options.items() if key.startswith("socket_")}
    if query.get("sentinel_password"):
        sentinel_kwargs["password"] = query["sentinel_password"][0]  # type: ignore[assignment]
    sentinel = Sentinel(sentinels, sentinel_kwargs=sentinel_kwargs)
    db = int(path[1]) if len(path) == 2 else 0
    return sentinel.master_for(path[0], username=username, password=password, db=db, **options)


def open_redis(url: str, **options: float) -> Redis:
    """A client for `url`: `RedisCluster` for a `redis+cluster://` URL (it has the same commands), a client that
    follows Sentinel's primary for `redis+sentinel://`, else `Redis`."""
    redis_wire.install()
    scheme = urlsplit(url).scheme.lower()
    if scheme in CLUSTER_SCHEMES:
        return _cluster_client(url, **options)  # type: ignore[return-value]
    if scheme == SENTINEL_SCHEME:
        return _sentinel_client(url, **options)
    return Redis.from_url(url, **options)


def limits_storage(url: str) -> tuple[str, dict[str, object]]:
    """The `limits` library's name of the same storage (`async+redis://…`, `async+redis+cluster://…`,
    `async+redis+sentinel://…`) and the options that go with it."""
    scheme = urlsplit(url).scheme.lower()
    if scheme.startswith("async+"):
        return url, {}
    if scheme == "rediss+cluster":  # the limits library spells TLS as an option, not a scheme, for clusters
        return "async+redis+cluster" + url[len(scheme) :], {"ssl": True}
    if scheme == SENTINEL_SCHEME:  # counters are read back at once: from the primary, never a lagging replica
        parts = urlsplit(url)
        service, _, db = parts.path.strip("/").partition("/")  # limits reads the whole path as the service name
        options: dict[str, object] = {"use_replicas": False, "db": int(db or 0)}
        sentinel_password = parse_qs(parts.query).get("sentinel_password")
        if sentinel_password:
            options["sentinel_kwargs"] = {"password": sentinel_password[0]}
        return f"async+{SENTINEL_SCHEME}://{parts.netloc}/{service}", options
    return f"async+{url}", {}


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


async def _wait_for_redis(redis: Redis, url: str, wait_s: float) -> None:
    """Redis started beside botgw (compose, a pod) may come up a little later: wait for it (saying where, every
    10 s), then say plainly what failed, where, and what to do."""
    where = redis_address(url)
    deadline = time.monotonic() + wait_s
    delay, said = 0.2, 0.0
    while True:
        try:
            await redis.ping()
            return
        except AuthenticationError:
            raise RedisUnavailable(
                f"Redis at {where} refused the credentials in redis_url (no password where one is required, or a "
                "wrong one): correct the password in redis_url"
            ) from None
        except ResponseError as exc:
            if "NOAUTH" in str(exc) or "WRONGPASS" in str(exc):
                raise RedisUnavailable(f"Redis at {where} asks for a password: put it in redis_url") from None
            return  # it answers; what it refuses surfaces on the next call, in Redis's own words
        except (RedisError, RedisClusterException) as exc:  # the cluster client's own errors are no RedisError
            if time.monotonic() + delay > deadline:
                if isinstance(exc, MasterNotFoundError) and " : " not in str(exc):  # the sentinels answered: it read
                    # as "timed out" (a review); a primary down or failing over reads the same as a wrong name
                    raise RedisUnavailable(
                        f"the sentinels at {where} gave no primary for the service name in redis_url for {wait_s:g} s "
                        "(a wrong name, or the primary is down): check the name, then the primary"
                    ) from None
                waited = f" for {wait_s:g} s" if wait_s >= 1 else ""
                raise RedisUnavailable(
                    f"Redis at {where} did not answer{waited} ({_why(exc)}): start it, or correct redis_url"
                ) from None
            if time.monotonic() - said >= 10.0:
                log.warning("waiting for Redis at %s (%s; up to %g s)", where, _why(exc), wait_s)
                said = time.monotonic()
            await asyncio.sleep(delay)
            delay = min(delay * 2, 2.0)


def _why(exc: BaseException) -> str:
    """A Redis failure in a few words (redis-py's messages carry the address, never the password)."""
    text = str(exc).lower()
    if "refused" in text or "error 111 " in text:
        return "connection refused"
    if "timeout" in text or "timed out" in text:
        return "timed out"
    if "name or service not known" in text or "nodename" in text or "resolution" in text:
        return "host name not found"
    return "not reachable"


@asynccontextmanager
async def connected(url: str, wait_s: float = 0.0, **options: float) -> AsyncIterator[Redis]:
    """Redis for a one-shot command: reached (or RedisUnavailable, naming where) before the command's first
    call, and closed after it."""
    redis = open_redis(url, **options)
    try:
        await _wait_for_redis(redis, url, wait_s)
        yield redis
    finally:
        await redis.aclose()


async def check_redis(redis: Redis, url: str, wait_s: float = STARTUP_WAIT_S) -> list[str]:
    """Wait for Redis, refuse a plain URL at a cluster node; return (and log) warnings about settings that can
    lose messages.

    In a cluster, one node answers for all: they are meant to be configured alike."""
    await _wait_for_redis(redis, url, wait_s)
    try:
        cluster_enabled = str((await redis.info("cluster")).get("cluster_enabled", 0)) == "1"
        settings = await _server_settings(redis)
    except ResponseError as exc:
        log.info("could not read the Redis server's settings (%s); eviction and persistence not checked", exc)
        return []
    except RedisError as exc:  # it answered a moment ago: the calls that follow retry or fail on their own
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
