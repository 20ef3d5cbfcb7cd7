"""Pulled channels (微信客服) in the worker: the pull itself, and the items it queues besides messages.

A callback only says "pull" (a `pull` entry in the account's lane, so one puller per account runs at a
time under its lease). The pull loops the platform's log until it says nothing more is waiting, and
enqueues every item (deduplicated on its id) **before** it saves the cursor: a crash between the two
repeats a page, whose items are then recognised, and loses nothing. Items become:

- `chat`: the person's message, answered in the normal pipeline (a burst within the adapter's merge window
  is answered together: `merge`), once the bot's allow and deny lists admit its sender (bots.audience: pulled
  messages never pass the gateway's ingest, which checks them for callbacks);
- `agent`: a human agent wrote; remembered as the assistant's turn, and the bot stays quiet;
- `event`: the adapter says what it means (a welcome to send, a new holder, a failure to count).
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable

from redis.asyncio import Redis
from redis.exceptions import NoScriptError

from bots.audience import Audiences
from bots.base import (
    ConversationTaken,
    CursorRefused,
    EventEffect,
    InboundMessage,
    PermanentSendError,
    PulledItem,
    PulledPage,
)
from bots.channels import Channel, HumanSessions, PulledChannel
from bots.text import utf8_len
from gateway import metrics
from gateway.config import Settings
from gateway.queue.entry import EntryKind, QueueEntry
from gateway.queue.scheduler import Lease, Scheduler
from gateway.state.conversations import Conversations
from gateway.state.keys import Keys
from gateway.state.memory import Scope, Turn
from gateway.state.redis_text import as_text
from gateway.state.reply_record import Fence, FencedValues, ReplyRecord, ReplyRecords

log = logging.getLogger(__name__)

HISTORY_GRACE_S = 60.0  # on a first start, messages sent this long before the callback still count as new
MERGE_GRACE_S = 1.5  # beyond the window: a burst's last message still has to be called back and pulled
MAX_PAGES = 10_000  # a pull that never ends is a platform bug, not a reason to loop forever
MAX_MERGED = 20
# A callback's Token pulls for 10 minutes (wecom-kf.md §2): a pull retried later goes without it from the start
# rather than being refused with it first (sync_msg without a Token is rate-limited: each call counts).
PULL_TOKEN_TTL_S = 600.0
# A first pull failing longer than this: its successors start history anew (the platform refuses replies after
# 48 hours anyway); and a key left behind (a crash between the cursor's save and the key's removal) outlives no
# more than that.
FIRST_PULL_KEPT_S = 48 * 3600
ITEM_KINDS = {"message": EntryKind.CHAT, "agent": EntryKind.AGENT, "event": EntryKind.EVENT}


class PulledWork:
    """What the worker does with `pull`, `agent`, `event` and `handoff` entries, and the merge of a burst."""

    def __init__(self, redis: Redis, keys: Keys, scheduler: Scheduler, settings: Settings) -> None:
        self._redis = redis
        self._keys = keys
        self._scheduler = scheduler
        self._settings = settings
        self._dedup_ttl_s = settings.effective_dedup_ttl_s()
        self.conversations = Conversations(redis, keys, settings.memory.group)
        self._values = FencedValues(redis)
        self._records = ReplyRecords(redis, keys, self._dedup_ttl_s)
        self._audiences = Audiences(settings.bots, metrics.count_ignored)

    # -- the pull ------------------------------------------------------------------------------

    async def pull(
        self, adapter: PulledChannel, request: InboundMessage, requested_at: float, fence: Fence | None = None
    ) -> str:
        """Pull account `request.conversation_id` until nothing more is waiting; returns a summary. The cursor is
        saved under the pull's lease, so a puller that stalled cannot move it back after its successor."""
        channel, token = request.conversation_id, request.text
        if time.time() - request.received_at > PULL_TOKEN_TTL_S:
            token = ""
        cursor_key = self._keys.pull_cursor(request.bot_id, channel)
        saved = await self._redis.get(cursor_key)
        if saved is None:
            saved = await self._redis.get(self._keys.legacy_pull_cursor(request.bot_id, channel))
        cursor = as_text(saved) if saved is not None else ""
        first_key = self._keys.first_pull(request.bot_id, channel)
        # First start: what was written before the bot was configured is history, not questions to answer.
        since = await self._history_before(first_key, requested_at) if saved is None and adapter.skip_history else 0.0
        queued = skipped = pages = 0
        newest: PulledItem | None = None  # the log's latest item so far, if it is a customer's message
        while pages < MAX_PAGES:
            pages += 1
            try:
                page = await self._page(adapter, channel, cursor, token)
            except CursorRefused as exc:
                if not cursor:
                    raise
                # The platform no longer knows the cursor (its log was reset, a Redis restored from elsewhere): a
                # cursor it refuses is refused for ever, so start again without one, as on a first start.
                log.warning("the platform refused the saved cursor; pulling again from the start",
                            extra={"bot_id": request.bot_id, "channel": channel, "error": str(exc)})  # fmt: skip
                metrics.KF_CURSOR_RESETS.labels(request.bot_id).inc()
                await self._values.set(fence, cursor_key, "")
                cursor, pages = "", pages - 1
                # from this pull's time, never a first pull's kept from long ago; kept for a retry after a crash
                await self._redis.set(first_key, f"{requested_at:.6f}", ex=FIRST_PULL_KEPT_S)
                since = requested_at - HISTORY_GRACE_S if adapter.skip_history else 0.0
                continue
            fresh = [item for item in page.items if item.message.received_at >= since]
            skipped += len(page.items) - len(fresh)
            if page.items:
                last = page.items[-1]  # the log's latest item: what made WeCom call back
                newest = last if last.kind == "message" else None
            if since and not page.has_more and newest is not None and newest.message.received_at < since:
                # The customer message that made WeCom call back is never history, however late the callback
                # came (an event or a human agent's message that came last makes no older message its cause).
                fresh, skipped = [*fresh, newest], skipped - 1
            queued += await self._enqueue(self._admitted(fresh))
            if page.next_cursor:
                await self._values.set(fence, cursor_key, page.next_cursor)  # only now: every item is queued
                if not cursor:
                    await self._redis.delete(first_key)  # history is behind the cursor from now on
                cursor = page.next_cursor
            if not page.has_more:
                break
        if skipped:
            log.info("first pull: skipped history", extra={"bot_id": request.bot_id, "skipped": skipped})
        return f"pulled {queued} in {pages} page(s)"

    async def _history_before(self, first_key: str, requested_at: float) -> float:
        """The time before which a cursorless pull's items are history: a minute before the first pull that found
        no cursor was asked for. Kept in Redis until a cursor is saved, so that a later pull taking over from a
        failing first one (the trusted IP not yet set up, say) does not make the first customers' messages history."""
        async with self._redis.pipeline(transaction=False) as pipe:  # one key: a Cluster takes it too
            pipe.set(first_key, f"{requested_at:.6f}", nx=True, ex=FIRST_PULL_KEPT_S)
            pipe.get(first_key)
            _, first = await pipe.execute()
        first_at = float(as_text(first)) if first is not None else requested_at  # None: a cursor came meanwhile
        return min(requested_at, first_at) - HISTORY_GRACE_S

    async def _page(self, adapter: PulledChannel, channel: str, cursor: str, token: str) -> PulledPage:
        try:
            return await adapter.pull_page(channel, cursor, token)
        except CursorRefused:
            raise  # the cursor, not the token (the adapter asked the platform with the token): never an untokened retry
        except PermanentSendError:
            if not token:
                raise
            # The callback's token lasts 10 minutes; a pull that waited longer goes on without it (slower).
            log.warning("pull token refused; pulling without it", extra={"channel": channel})
            return await adapter.pull_page(channel, cursor, "")

    def _admitted(self, items: list[PulledItem]) -> list[PulledItem]:
        """The items to queue: a person's message only when their bot answers them (bots.audience); a refused one
        is counted and dropped (its cursor still moves past it). A human agent's messages and events always pass."""
        kept: list[PulledItem] = []
        for item in items:
            if item.kind != "message":
                kept.append(item)
            elif (admitted := self._audiences.admit(item.message)) is not None:
                kept.append(item if admitted is item.message else item.model_copy(update={"message": admitted}))
        return kept

    async def _enqueue(self, items: list[PulledItem]) -> int:
        """Queue every item in its conversation's lane, each once (dedup on its id), in one round trip. A Redis that
        restarted (its AOF kept the queue, not the scripts) refuses the pipeline's EVALSHA: the scripts are loaded
        again and what was refused is sent once more (a refused script ran nothing, so nothing is doubled)."""
        if not items:
            return 0
        results = await self._enqueue_round(items)
        refused = [at for at, result in enumerate(results) if isinstance(result, NoScriptError)]
        if refused:
            await self._scheduler.load_scripts()
            again = await self._enqueue_round([items[at] for at in refused])
            for at, result in zip(refused, again, strict=True):
                results[at] = result
        if errors := [result for result in results if isinstance(result, Exception)]:
            raise errors[0]
        for item, result in zip(items, results, strict=True):
            metrics.PULLED.labels(item.message.platform, item.kind, "queued" if result else "duplicate").inc()
        return sum(1 for result in results if result)

    async def _enqueue_round(self, items: list[PulledItem]) -> list:
        """One pipeline of the enqueue script for `items`; each result, or the error it met, in order."""
        pipe = self._redis.pipeline(transaction=False)
        for item in items:
            message = item.message
            scope = Scope.of(message, self._settings.memory.group)
            event = json.dumps(item.event, ensure_ascii=False) if item.event else None
            entry = QueueEntry(owner=scope.owner, kind=ITEM_KINDS[item.kind], message=message, event=event)
            weight = self._settings.worker.weight(message.bot_id)
            dedup = self._keys.dedup(message.dedup_key)
            self._scheduler.queue_enqueue(pipe, scope.lane, entry, dedup, self._dedup_ttl_s, weight)
        return list(await pipe.execute(raise_on_error=False))

    # -- the other kinds -----------------------------------------------------------------------

    async def agent_turn(self, message: InboundMessage, record: ReplyRecord, memory_key: str) -> str:
        """A human agent wrote: their words become the assistant's turn, and the bot keeps quiet."""
        await self.conversations.set_owner(message, "human", record.fence)
        turn = Turn("assistant", message.text, utf8_len(message.text))
        await record.commit("", f"{time.time():.3f}", memory_key, (turn,), *self._memory_limits())
        return "remembered"

    async def remember_withheld(self, message: InboundMessage, record: ReplyRecord, memory_key: str) -> None:
        """The person wrote while a human holds the conversation: keep it for when the bot speaks again."""
        turn = Turn("user", message.text, utf8_len(message.text))
        await record.commit("", f"{time.time():.3f}", memory_key, (turn,), *self._memory_limits())

    def _memory_limits(self) -> tuple[int, int]:
        memory = self._settings.memory
        return memory.ttl_s, memory.max_turns * 2

    async def event(self, adapter: Channel, message: InboundMessage, event: dict, record: ReplyRecord) -> str:
        sessions = _sessions_of(adapter)
        effect = sessions.on_event(event, message.reply_to)
        metrics.PLATFORM_EVENTS.labels(message.platform, effect.label).inc()
        if effect.owner is not None:
            await self.conversations.set_owner(message, effect.owner, record.fence)
            await self.conversations.handoffs.changed(message, event, record.fence)  # the console's register
        if effect.failed_msgid:
            await self._delivery_failed(adapter, message, effect, record)
        if effect.welcome_code and effect.welcome_text:
            await self._welcome(adapter, message, effect, record)
        return effect.label

    async def _welcome(
        self, adapter: Channel, message: InboundMessage, effect: EventEffect, record: ReplyRecord
    ) -> None:
        """Send the welcome once: marked begun before the send (with its quota slot) and sent after it, so that a
        failed send is tried again (with the same msgid) instead of being taken for done."""
        state = await record.load()
        if state.welcome_sent:
            return
        resend = bool(state.welcome_started)
        quota, at = adapter.reply_quota, time.time()
        if not resend and quota is None:
            await record.mark(welcome_started="1")
        elif not resend and not await self.conversations.take_slot(
            message, quota, record, {"welcome_started": "1"}, outside_window_ok=True, at=at
        ):  # the welcome counts like any message (the simulator's reading: UNCONFIRMED); never the handoff's slot
            log.info("no message left in the person's allowance for the welcome")
            return
        try:
            await _sessions_of(adapter).send_notice(
                message.reply_to, effect.welcome_code, effect.welcome_text, f"welcome:{message.dedup_key}",
                resend=resend,
            )  # fmt: skip
        except ConversationTaken as exc:
            log.info("welcome not sent", extra={"reason": str(exc)})
        except PermanentSendError as exc:
            # The first attempt refused outright (its code expired, 20 s after the event, while the lane waited):
            # nothing reached the person, so the slot is theirs again, or it withholds the answer to a question
            # (model seed 219). A resend's refusal may be the code spent by the earlier attempt: its slot stays.
            if not resend and quota is not None:
                await self.conversations.return_slot(message, at)
            # A welcome is a courtesy whose code lives 20 s: a dead letter and an alert for each customer who came
            # in during a short backlog would tell the operators nothing they can do (a configuration error shows
            # on the answers too, which are dead-lettered and alerted).
            log.warning("the welcome was refused; the conversation goes on without it", extra={"code": exc.code})
            await record.mark(welcome_sent="refused")
            return
        await record.mark(welcome_sent="1")

    async def _delivery_failed(
        self, adapter: Channel, message: InboundMessage, effect: EventEffect, record: ReplyRecord
    ) -> None:
        """The platform accepted a message and later said the person did not get it (微信客服 msg_send_fail):
        recorded against the reply it belonged to, its quota slot given back where the platform did not count
        it, and kept as a dead letter for an operator where one should look. The event's own record (`record`)
        makes the refund once: a retried or taken-over event gave the slot back twice, and botgw could then send
        past WeCom's 5 (found by a review). Claimed before the refund: a crash between gives back none, never
        one too many. The letter is marked after it is kept (a second one of a message replays once)."""
        metrics.KF_SEND_FAILED.labels(message.bot_id, effect.fail_type or "unknown").inc()
        raw = await self._redis.get(self._keys.sent_piece(message.bot_id, effect.failed_msgid))
        sent = json.loads(raw) if raw else {}
        reason = f"the platform could not deliver a sent message (msg_send_fail, fail_type {effect.fail_type})"
        log.warning(reason, extra={"bot_id": message.bot_id, "reply": sent.get("dedup_key", "unknown")})
        if sent.get("dedup_key"):
            await self._records.open(str(sent["dedup_key"])).mark(send_failed=f"{effect.fail_type}:{sent.get('piece')}")
        if effect.quota_refund and adapter.reply_quota is not None and await record.claim("quota_refunded"):
            await self.conversations.give_back(message, adapter.reply_quota, effect.quota_refund)
        if effect.dead_letter and (await record.load()).letter_kept:
            return
        if effect.dead_letter and not sent.get("message"):
            # Not a piece of an answer (a welcome, a notice): no question of the person's to replay, and a letter of
            # the event itself would be answered as a chat of theirs (found by a review). The log line says it.
            log.warning("the undelivered message was not an answer's piece; nothing to replay",
                        extra={"bot_id": message.bot_id, "msgid": effect.failed_msgid})  # fmt: skip
        elif effect.dead_letter:
            original = InboundMessage.model_validate(sent["message"])
            owner = Scope.of(original, self._settings.memory.group).owner
            entry = QueueEntry(entry_id=effect.failed_msgid, owner=owner, message=original)
            letter = json.dumps({"reason": reason, "entry": entry.wire()}, ensure_ascii=False)
            await self._redis.xadd(self._keys.dead_letters, {"entry": letter}, maxlen=10_000, approximate=True)
            await record.mark(letter_kept="1")

    # -- a burst -------------------------------------------------------------------------------

    async def merge(
        self, lease: Lease, message: InboundMessage, window_s: float, alone: Callable[[str], bool]
    ) -> tuple[QueueEntry | None, float]:
        """Absorb the person's messages queued right behind this one within `window_s` of each other; a message
        that `alone` says must be answered on its own (a handoff keyword, a command) is neither merged nor
        absorbed, so "q\n转人工" is never answered as a question.

        Returns (the merged entry or None, seconds to wait first): a burst still arriving is waited for by
        handing the lane back with that delay, never by holding a slot."""
        if message.msg_type == "text" and alone(message.text):
            return None, 0.0
        behind = await self._scheduler.following(lease, MAX_MERGED)
        absorbed: list[QueueEntry] = []
        last = message.received_at
        for entry in behind:
            other = entry.message
            same_person = entry.kind == EntryKind.CHAT and other.sender_id == message.sender_id
            if not same_person or other.received_at - last > window_s:
                break
            if other.msg_type == "text" and alone(other.text):
                break
            absorbed.append(entry)
            last = other.received_at
        wait = last + window_s + MERGE_GRACE_S - time.time()
        if wait > 0:
            return None, wait
        if not absorbed:
            return None, 0.0
        merged = lease.entry.model_copy(
            update={
                "message": merged_message(lease.entry.message, [entry.message for entry in absorbed]),
                "merged": [entry.message.msg_id for entry in absorbed],
            }
        )
        if not await self._scheduler.absorb(lease, merged, absorbed):
            return None, 0.0  # the lane changed under us (lease lost): answer what we hold
        return merged, 0.0


def merged_message(head: InboundMessage, behind: list[InboundMessage]) -> InboundMessage:
    """One message for a burst: every message's text joined in order, and every message's parts (a photo, a
    voice, a file) kept in order, so that a photo followed by "这是什么问题？" reaches the engine as the picture
    and its question; received with the last one. Its type is text when anyone typed something (the question is
    what is answered), else the first message's."""
    burst = [head, *behind]
    texts = [message.text for message in burst if message.text.strip()]
    parts = tuple(part for message in burst for part in message.parts)
    msg_type = "text" if texts else head.msg_type
    update = {"msg_type": msg_type, "text": "\n".join(texts), "parts": parts, "received_at": burst[-1].received_at}
    return head.model_copy(update=update)


def _sessions_of(adapter: Channel) -> HumanSessions:
    """A pulled channel's events and welcomes are its human sessions' business: only such a channel has them."""
    if adapter.sessions is None:
        raise TypeError(f"bot {adapter.bot_id!r} got a platform event but has no sessions to apply it to")
    return adapter.sessions
