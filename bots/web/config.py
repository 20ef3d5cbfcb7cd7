"""Configuration of the web chat page: who may sign in, and the key the page uses to call the gateway."""

from __future__ import annotations

import base64
import binascii
import functools
import hashlib
import hmac
import ipaddress
import re
import secrets
from collections.abc import Sequence
from typing import Literal

from limits import parse_many
from pydantic import BaseModel, ConfigDict, Field, SecretStr, ValidationInfo, field_validator

from bots.base import BotSettings, Identity
from knowledge.config import KnowledgeUse

PRESETS = {"code and documents": 0.1, "creative writing": 0.7, "logic and maths": 0.0}


SCRYPT_N, SCRYPT_R, SCRYPT_P = 2**14, 8, 1  # about 50 ms and 16 MiB per check: slow for a guesser, fine here
SCRYPT_MAXMEM = 32 * 1024 * 1024  # what hashlib (OpenSSL) lets one scrypt take by default: more fails every check
MAX_P = 16
MAKE_ONE = "make one with `botgw web-password` (it reads the password and prints the hash)"


def hash_password(password: str) -> str:
    """A salted, slow hash for `password_hash` (hashlib's scrypt): `scrypt$N$r$p$salt$hash`, base64 parts."""
    salt = secrets.token_bytes(16)
    digest = hashlib.scrypt(password.encode(), salt=salt, n=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P, dklen=32)
    encode = base64.b64encode
    return f"scrypt${SCRYPT_N}${SCRYPT_R}${SCRYPT_P}${encode(salt).decode()}${encode(digest).decode()}"


def _check_hash(password: str, stored: str) -> bool:
    _, n, r, p, salt, digest = stored.split("$")
    expected = base64.b64decode(digest)
    given = hashlib.scrypt(
        password.encode(), salt=base64.b64decode(salt), n=int(n), r=int(r), p=int(p), dklen=len(expected)
    )
    return hmac.compare_digest(given, expected)


def _base64(text: str) -> bytes:
    """Strict: the alphabet, the padding, nothing else (b64decode lets through what the check would choke on)."""
    return binascii.a2b_base64(text.encode("ascii"), strict_mode=True)


def hash_problem(stored: str) -> str | None:
    """What is wrong with a `password_hash`, in words that never quote it (None: it can be checked). Everything
    `_check_hash` needs is tested here, so that a hash accepted at start cannot fail at every sign-in."""
    parts = stored.split("$")
    if len(parts) != 6 or parts[0] != "scrypt":
        return "not a scrypt$N$r$p$salt$hash value"
    if not all(part.isascii() and part.isdigit() for part in parts[1:4]):
        return "its N, r and p are not whole numbers"
    n, r, p = (int(part) for part in parts[1:4])
    if n < 2 or n & (n - 1) or r < 1 or not 1 <= p <= MAX_P:
        return f"its parameters are out of range (N a power of two, r at least 1, p from 1 to {MAX_P})"
    if 128 * r * (n + p + 2) > SCRYPT_MAXMEM:
        return f"its N and r need more than the {SCRYPT_MAXMEM // 2**20} MiB one check may take"
    try:
        salt, digest = _base64(parts[4]), _base64(parts[5])
    except (binascii.Error, UnicodeEncodeError):
        return "its salt or hash is not base64 (still a placeholder?)"
    if not 8 <= len(salt) <= 64 or not 16 <= len(digest) <= 64:
        return "its salt or hash is too short or too long (still a placeholder?)"
    return None


@functools.lru_cache(maxsize=8)
def _dummy_hash(n: int = SCRYPT_N, r: int = SCRYPT_R, p: int = SCRYPT_P) -> str:
    """A hash of a random password, checked when there is no hash to check: an unknown name, or a user with a
    plain `password`, costs one scrypt like a known name does, so that the time of an answer says nothing."""
    salt, digest = secrets.token_bytes(16), secrets.token_bytes(32)
    encode = base64.b64encode
    return f"scrypt${n}${r}${p}${encode(salt).decode()}${encode(digest).decode()}"


def _params(stored: str) -> tuple[int, int, int]:
    _, n, r, p, *_ = stored.split("$")
    return int(n), int(r), int(p)


class WebUser(BaseModel):
    """A person allowed to sign in: the password as a salted scrypt hash (`botgw web-password`), or as plain
    text from the environment (`password: ${ENV}`)."""

    model_config = ConfigDict(extra="forbid")

    name: str = Field(pattern=r"^[A-Za-z0-9_.@-]{1,64}$")
    password_hash: str = ""
    password: SecretStr | None = None
    password_sha256: str = Field(default="", description="refused: unsalted; kept only to say so clearly")

    @field_validator("password_sha256")
    @classmethod
    def _unsalted_refused(cls, value: str) -> str:
        if value:
            raise ValueError(
                "password_sha256 (unsalted SHA-256) is no longer accepted: "
                "make a password_hash with `botgw web-password` and use that instead"
            )
        return value

    @field_validator("password_hash")
    @classmethod
    def _hash_form(cls, value: str, info: ValidationInfo) -> str:
        """Refused at start, whole (like .env.example's placeholder): otherwise every sign-in of the user fails."""
        problem = hash_problem(value) if value else None
        if problem:
            who = f" (user {info.data['name']})" if "name" in info.data else ""
            raise ValueError(f"not a usable password hash{who}: {problem}; {MAKE_ONE}")
        return value

    def check(self, password: str, dummy: str | None = None) -> bool:
        """Exactly one scrypt, whatever the user holds (`dummy`: the hash checked when it is not its own)."""
        if self.password is None and self.password_hash:
            return _check_hash(password, self.password_hash)
        _check_hash(password, dummy or _dummy_hash())
        if self.password is None:
            return False
        plain = self.password.get_secret_value()
        given, expected = (hashlib.sha256(text.encode()).digest() for text in (password, plain))
        return hmac.compare_digest(given, expected)


class LoginThrough(BaseModel):
    """Sign-in on the page through a platform's own login (OAuth), with the credentials of one of its bots."""

    model_config = ConfigDict(extra="forbid")

    bot: str = Field(description="the id of the wecom app (or dingtalk bot) whose credentials and members it uses")


class WebLogin(BaseModel):
    """Which company logins the page offers besides passwords: a person signed in through WeCom is that WeCom
    member (the same identity, memory and limits as in the WeCom app), likewise DingTalk."""

    model_config = ConfigDict(extra="forbid")

    wecom: LoginThrough | None = None
    dingtalk: LoginThrough | None = None

    def check(self, where: str, bots: Sequence[BotSettings]) -> None:
        """Each login names a bot whose credentials sign people in: a WeCom app (an AI bot has no secret to
        call auth/getuserinfo with), or a DingTalk bot with its corp_id (a staffId is the corp's). `where` is the
        key this login was written under (`bots.web.web_login`, `console.login`), for the error."""
        by_id = {bot.id: bot for bot in bots}
        for via in ("wecom", "dingtalk"):  # the login's field, and the platform of the bot it names
            through = getattr(self, via)
            if through is None:
                continue
            named = by_id.get(through.bot)
            if named is None or named.platform != via:
                found = f"a {named.platform!r} bot" if named else "no such bot"
                raise ValueError(f"{where}.{via}.bot must name a {via!r} bot (found {found} {through.bot!r})")
            if via == "dingtalk" and not getattr(named, "corp_id", ""):
                raise ValueError(f"{where}.dingtalk: bots.{named.id}.corp_id must be set "
                                 "(a staffId names a person only within its organisation)")


class LoginGuard(BaseModel):
    """How many wrong passwords the page takes before it asks a name, or an address, to wait."""

    model_config = ConfigDict(extra="forbid")

    per_name: str = Field(default="5/minute;20/hour", description="failed sign-ins per user name")
    per_address: str = Field(default="20/minute;100/hour", description="failed sign-ins per client address")


def _network(value: str) -> str:
    try:
        ipaddress.ip_network(value.strip(), strict=False)
    except ValueError as exc:
        raise ValueError(f"trusted_proxies: {value!r} is not an IP address or CIDR (like 10.0.0.0/8)") from exc
    return value.strip()


class WebBotConfig(BotSettings):
    """The chat page (Chainlit), talking to the gateway's /web endpoints with `api_key`."""

    id: str = Field(pattern=r"^[A-Za-z0-9_-]{1,64}$")
    platform: Literal["web"] = "web"
    title: str = Field(default="botgw", description="the page's name: its browser tab, header and sign-in page")
    api_key: SecretStr
    users: list[WebUser] = Field(default_factory=list)
    trusted_header: str | None = Field(default=None, description="behind an SSO proxy: the header naming the user")
    trusted_proxies: list[str] = Field(
        default_factory=list,
        description="addresses or CIDRs of the proxies whose trusted_header is believed; none: nobody",
    )
    trusted_header_secret: SecretStr | None = Field(
        default=None, description="if set, the proxy must also send it in trusted_header_secret_header"
    )
    trusted_header_secret_header: str = "X-Botgw-Proxy-Secret"
    allow_unlisted: bool = Field(default=False, description="trusted_header: accept names not in `users`")
    web_login: WebLogin = Field(default_factory=WebLogin)
    login_guard: LoginGuard = Field(default_factory=LoginGuard)
    gateway_url: str = "http://127.0.0.1:8080"
    auth_secret: SecretStr | None = Field(default=None, description="Chainlit's session signing secret")
    answer_timeout_s: float = Field(default=300.0, gt=0)
    knowledge: KnowledgeUse | None = Field(default=None, description="the knowledge bases it answers from")
    uploads_per_user: str = Field(
        default="10/minute;100/day",
        description="files a page user may attach (each at most max_media_bytes), in moving windows",
    )
    upload_ttl_s: int = Field(default=3600, ge=60, le=86400, description="how long an attached file is kept")

    @field_validator("uploads_per_user")
    @classmethod
    def _upload_windows(cls, value: str) -> str:
        try:
            parse_many(value)
        except ValueError as exc:
            raise ValueError(f"uploads_per_user: {value!r} is not like '10/minute;100/day'") from exc
        return value

    def check_peers(self, bots: Sequence[BotSettings]) -> None:
        self.web_login.check(f"bots.{self.id}.web_login", bots)

    @field_validator("title")
    @classmethod
    def _title_plain(cls, value: str) -> str:
        """Chainlit writes the title into the page's HTML unescaped."""
        if not 1 <= len(value) <= 64 or re.search(r"[<>&\"'\x00-\x1f\x7f]", value):
            raise ValueError("the page's title: 1 to 64 characters, without < > & \" ' or control characters")
        return value

    @field_validator("trusted_proxies")
    @classmethod
    def _proxies_parse(cls, value: list[str]) -> list[str]:
        return [_network(item) for item in value]

    def trusts_proxy(self, address: str) -> bool:
        """Whether a TCP peer is one of the trusted proxies (never decided by a forwarded header). An IPv4 address
        and its IPv4-mapped IPv6 form (`::ffff:10.0.0.5`, what a dual-stack socket reports) are the same peer,
        whichever of the two the peer or the entry in `trusted_proxies` is written as."""
        try:
            peer = ipaddress.ip_address(address)
        except ValueError:
            return False
        forms: set[ipaddress.IPv4Address | ipaddress.IPv6Address] = {peer}
        if isinstance(peer, ipaddress.IPv6Address) and peer.ipv4_mapped is not None:
            forms.add(peer.ipv4_mapped)
        elif isinstance(peer, ipaddress.IPv4Address):
            forms.add(ipaddress.IPv6Address(f"::ffff:{peer}"))
        networks = [ipaddress.ip_network(net, strict=False) for net in self.trusted_proxies]
        return any(form in network for form in forms for network in networks)

    @property
    def identity(self) -> Identity:
        """The page's own users (password or proxy header): `web:<bot>:<name>`."""
        return Identity("web", self.id)

    def listed(self, name: str) -> bool:
        return any(user.name == name for user in self.users)

    def user(self, name: str, password: str) -> WebUser | None:
        """The user, if the password is theirs. Slow (one scrypt, about 50 ms of CPU) and as slow for a name
        that is not listed: run it off the event loop (webchat/passwords.py)."""
        hashes = [user.password_hash for user in self.users if user.password_hash and user.password is None]
        dummy = _dummy_hash(*_params(hashes[0])) if hashes else _dummy_hash()
        user = next((user for user in self.users if user.name == name), None)
        if user is None:
            _check_hash(password, dummy)
            return None
        return user if user.check(password, dummy) else None
