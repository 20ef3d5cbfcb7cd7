"""Who a bot answers: its allow and deny lists of senders and groups, and the prefix a group message needs.

Checked where a message enters (the gateway's ingest, the pulled channel's log), before it is queued: a
refused message gets nothing back and costs nothing but the count (botgw_messages_ignored_total). Names are
the platform's own ids as the callback gives them (a WeCom userid, a DingTalk staffId or senderId, a 微信客服
external_userid; a chat id for groups), so an operator copies them from the console or from the logs.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence

from bots.base import BotSettings, InboundMessage

LEADING_MENTION = re.compile(r"^@\S+\s+")  # WeCom doc 100719's group example: "@RobotA hello robot"


def admit(settings: BotSettings, message: InboundMessage) -> tuple[InboundMessage | None, str]:
    """The message to answer (a group prefix taken off), or None with the reason it is not answered."""
    if message.sender_id in settings.deny_users:
        return None, "denied_user"
    if settings.allow_users and message.sender_id not in settings.allow_users:
        return None, "not_allowed_user"
    group = message.group_id
    if group:
        if group in settings.deny_groups:
            return None, "denied_group"
        if settings.allow_groups and group not in settings.allow_groups:
            return None, "not_allowed_group"
        prefix = settings.group_prefix
        if prefix and message.tap is None:  # a tap answers botgw's own question: it carries no prefix
            text = LEADING_MENTION.sub("", message.text.lstrip())  # the AI bot's group text starts "@bot …"
            if not text.startswith(prefix):
                return None, "no_prefix"
            return message.model_copy(update={"text": text[len(prefix) :].lstrip()}), ""
    return message, ""


def restricts(settings: BotSettings) -> bool:
    """Whether the bot answers anyone less than everyone (the check can be skipped when not)."""
    return bool(
        settings.allow_users or settings.deny_users or settings.allow_groups or settings.deny_groups
        or settings.group_prefix
    )


class Audiences:
    """Every bot's lists, for where messages enter (the gateway's ingest, the pulled channel): `admit` gives the
    message to answer, or None after `count(platform, reason)` was told why not."""

    def __init__(self, bots: Sequence[BotSettings], count: Callable[[str, str], None]) -> None:
        self._restricted = {bot.id: bot for bot in bots if restricts(bot)}
        self._count = count

    def admit(self, message: InboundMessage) -> InboundMessage | None:
        audience = self._restricted.get(message.bot_id)
        if audience is None:
            return message
        admitted, reason = admit(audience, message)
        if admitted is None:
            self._count(message.platform, reason)
        return admitted
