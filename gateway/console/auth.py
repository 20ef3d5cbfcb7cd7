"""Who is at the console: sessions in Redis (any gateway serves any sign-in), the admin token, and sign-in through
the company's WeCom or DingTalk identity (the calls of webchat/sso.py, with the token cache the workers share).

A session is a random cookie (`botgw_console`, HttpOnly, SameSite=Lax, Path=/console) whose SHA-256 names a Redis
hash {who, via, csrf} that expires after `console.session_hours`: signing out deletes it, so a copied cookie stops
working at once. The role is looked up again on every request (`console.roles`, the token: admin), so a role
taken out of the configuration is gone at the next restart of the gateway, not at the session's end; a session
opened with the admin token keeps a digest of it and ends when the token is changed.

A script sends `Authorization: Bearer <admin.token>` instead: role admin, no session, no CSRF token (a browser
never adds that header by itself, so no other site can make one send it).
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from urllib.parse import urlencode

from redis.asyncio import Redis

from bots.base import qualified
from gateway.config import Settings
from gateway.console.settings import ROLE_RANK, Role
from gateway.state.keys import Keys
from gateway.state.redis_text import as_text

SESSION_COOKIE = "botgw_console"
STATE_COOKIE = "botgw_console_state"
TOKEN_WHO = "admin-token"
CODE_SEEN_S = 600  # both platforms' sign-in codes live 5 minutes (webchat/sso.py): remembered twice as long


@dataclass(frozen=True)
class Operator:
    """Someone signed in: `who` (a qualified identity, or admin-token), their role, how they came in (token,
    bearer, wecom, dingtalk), and the CSRF token every change of theirs must carry ('' for bearer)."""

    who: str
    role: Role
    via: str
    csrf: str = ""

    def may(self, role: Role) -> bool:
        return ROLE_RANK[self.role] >= ROLE_RANK[role]


def digest(secret: str) -> str:
    return hashlib.sha256(secret.encode()).hexdigest()


def bearer_matches(settings: Settings, header: str) -> bool:
    token = settings.admin.token
    if token is None:
        return False
    return hmac.compare_digest(header.encode(), f"Bearer {token.get_secret_value()}".encode())


def token_matches(settings: Settings, typed: str) -> bool:
    token = settings.admin.token
    return token is not None and hmac.compare_digest(typed.strip().encode(), token.get_secret_value().encode())


def token_mark(settings: Settings) -> str:
    """What a session opened with the admin token keeps of it (a digest, never the token): a session whose mark is
    not the configured token's (the token was changed) is over."""
    token = settings.admin.token
    return digest(f"botgw-console-session:{token.get_secret_value()}") if token is not None else ""


def role_for(settings: Settings, who: str, via: str) -> Role | None:
    if via in ("token", "bearer"):
        return "admin" if settings.admin.token is not None else None
    return settings.console.role_of(who)


class Sessions:
    """The console's sign-ins, kept in Redis."""

    def __init__(self, redis: Redis, keys: Keys, settings: Settings) -> None:
        self._redis = redis
        self._keys = keys
        self._settings = settings

    async def open(self, who: str, via: str) -> str:
        """A new session for `who`; returns the cookie's value."""
        secret = secrets.token_urlsafe(32)
        key = self._keys.console_session(digest(secret))
        ttl = int(self._settings.console.session_hours * 3600)
        fields = {"who": who, "via": via, "csrf": secrets.token_urlsafe(24)}
        if via == "token":
            fields["token"] = token_mark(self._settings)
        async with self._redis.pipeline(transaction=True) as pipe:  # never a session without its end
            pipe.hset(key, mapping=fields)
            pipe.expire(key, ttl)
            await pipe.execute()
        return secret

    async def operator(self, cookie: str) -> Operator | None:
        """The person a session cookie names, with their role now; None for no, an ended or a role-less session."""
        if not cookie or len(cookie) > 100:
            return None
        fields = await self._redis.hgetall(self._keys.console_session(digest(cookie)))
        if not fields:
            return None
        values = {as_text(name): as_text(value) for name, value in fields.items()}
        role = role_for(self._settings, values.get("who", ""), values.get("via", ""))
        if role is None:
            return None
        mark = token_mark(self._settings).encode()
        if values.get("via") == "token" and not hmac.compare_digest(values.get("token", "").encode(), mark):
            return None  # opened with an admin token that is no longer the configured one
        return Operator(values.get("who", ""), role, values.get("via", ""), values.get("csrf", ""))

    async def close(self, cookie: str) -> None:
        if cookie and len(cookie) <= 100:
            await self._redis.delete(self._keys.console_session(digest(cookie)))

    async def first_use_of(self, login: str, code: str) -> bool:
        """True the first time this process group sees a sign-in code (the platforms refuse a used one too)."""
        key = self._keys.console_login_code(digest(f"{login}:{code}"))
        return bool(await self._redis.set(key, "1", nx=True, ex=CODE_SEEN_S))


def authorize_url(settings: Settings, login: str, redirect_uri: str, state: str) -> str:
    """Where the browser signs in with the platform (the URLs webchat/sso.py documents)."""
    through = getattr(settings.console.login, login)
    bot = settings.bot(through.bot)
    if login == "wecom":
        query = {"login_type": "CorpApp", "appid": bot.corp_id, "agentid": bot.agent_id,
                 "redirect_uri": redirect_uri, "state": state}  # fmt: skip
        return f"{bot.login_base}/wwlogin/sso/login?{urlencode(query)}"
    query = {"client_id": bot.app_key, "redirect_uri": redirect_uri, "state": state, "response_type": "code",
             "prompt": "consent", "scope": "openid"}  # fmt: skip
    return f"{bot.login_base}/oauth2/auth?{urlencode(query)}"


def identity_of(login: str, userid: str, tenant: str) -> str:
    return qualified(login, tenant, userid)
