"""Which configured bot a simulated user talks to (`botgw sim <platform> --bot ID`)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Protocol, TypeVar


class _Bot(Protocol):
    @property
    def id(self) -> str: ...

    @property
    def platform(self) -> str: ...


BotT = TypeVar("BotT", bound=_Bot)


def choose_bot(bots: Sequence[BotT], bot_id: str, platform: str) -> tuple[BotT | None, str]:
    """The bot `bot_id` if it is of `platform`, else None and one line naming the bots that would do.

    Checked before anything is signed or posted: a bot of another platform used to be handed to the wrong signer
    and ended in a traceback after part of the exchange had happened."""
    bot = next((candidate for candidate in bots if candidate.id == bot_id), None)
    if bot is not None and bot.platform == platform:
        return bot, ""
    fitting = [candidate.id for candidate in bots if candidate.platform == platform]
    what = f"is a {bot.platform} bot" if bot is not None else "is not in the configuration"
    choice = f"its {platform} bots: {', '.join(fitting)}" if fitting else f"it has no {platform} bot"
    return None, f"bot {bot_id!r} {what}; {choice}"
