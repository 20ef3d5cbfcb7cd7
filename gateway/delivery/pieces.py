"""The pieces style (WeCom app, group robot, DingTalk text, 微信客服): the answer split to the byte cap, paced to
the platform's allowances (shared in Redis), sent piece by piece with progress in the reply record, so that a
takeover resumes instead of repeating; a piece whose outcome is unknown is resent with the platform's duplicate
check on. A send that must wait for its allowance raises `Paced`, and the worker hands the message back with
that delay instead of holding a slot."""

from __future__ import annotations

import hashlib
import json
import logging
import math

from bots.base import ConversationTaken, SendError
from bots.channels import PiecesChannel
from bots.markdown import to_text
from bots.text import split_utf8, utf8_len, utf8_prefix
from gateway import texts
from gateway.delivery.base import HandedBack, Paced, Presenter
from gateway.state.limits import window
from gateway.state.reply_record import ReplyState

log = logging.getLogger(__name__)
SENT_PIECE_TTL_S = 72 * 3600  # a report that an accepted message was not delivered comes within its 48 h window
# Invisible characters (zero-width space, non-joiner, word joiner, joiner) whose sequences number the repeats
# of one piece, so that its content differs each time; five of them (15 bytes) count 1,364 repeats.
UNIQUE_MARKS = "\u200b\u200c\u2060\u200d"
MAX_MARKS_LEN = 5
MARKS_ROOM_BYTES = 3 * MAX_MARKS_LEN
MAX_REPEATS = sum(len(UNIQUE_MARKS) ** n for n in range(1, MAX_MARKS_LEN + 1))


def repeat_marks(repeat: int) -> str:
    """The invisible suffix of a piece's `repeat`-th repeat ('' for the first send): bijective base 4."""
    marks = ""
    while repeat > 0:
        repeat, digit = divmod(repeat - 1, len(UNIQUE_MARKS))
        marks = UNIQUE_MARKS[digit] + marks
    return marks


class PiecesPresenter(Presenter):
    """Where the platform has a duplicate check (WeCom), every piece is sent with it from the first attempt:
    whether WeCom matches a flagged resend against an unflagged original is UNCONFIRMED, so none is
    unflagged. The check matches on content, so a new piece that repeats one sent to the same person within
    the window ("好的" twice) gets invisible marks that make it unique; which repeat it is gets recorded before
    the send, so a resend of that piece is byte for byte the first and is the one dropped."""

    adapter: PiecesChannel

    async def finish(self, text: str, state: ReplyState) -> None:
        if state.question and not state.buttons_sent:  # the buttons follow the text, then it is done
            await super().finish(text, state)
            return
        # the last piece's mark says done, and goes with the release of the lease: two writes fewer
        await self.deliver(text, state, done_with_last=True)

    async def deliver(self, text: str, state: ReplyState, done_with_last: bool = False) -> None:
        target = self.message.reply_to
        if self.adapter.reply_format == "text":  # before splitting: the caps hold for what is sent
            text = to_text(text)
        checked = self.adapter.duplicate_check_window_s > 0
        cap = self.adapter.max_bytes_for(target) - (MARKS_ROOM_BYTES if checked else 0)
        pieces = await self._within_quota(split_utf8(text, cap), cap, state)
        if done_with_last and state.sent >= len(pieces):
            await self.record.mark(state="done")
        for index in range(state.sent, len(pieces)):
            if self.delivery.stopping.is_set():
                raise HandedBack()
            outcome_unknown = index < state.started
            piece, progress = pieces[index], {"started": index + 1}
            if self._in_one_step():
                repeat = await self._begin_at_once(piece, index, progress, state, checked=checked,
                                                   resend=outcome_unknown)
            else:
                await self._pace()
                if checked:
                    repeat = state.variants.get(index, 0) if outcome_unknown else await self._repeat_of(piece)
                    progress[f"v{index}"] = repeat
                await self._begin(progress, resend=outcome_unknown)  # fenced: a worker that lost it stops here
            if checked:
                piece += repeat_marks(repeat)
            piece_key = f"{self.message.dedup_key}:{index}"
            await self._remember_sent(piece_key, index)
            await self.delivery.send_with_resends(
                self.record, state, str(index),
                lambda resend, piece=piece, key=piece_key: self.adapter.send_piece(
                    target, piece, duplicate_check=checked or resend, piece_key=key
                ),
                started_before=outcome_unknown,
            )  # fmt: skip
            if done_with_last and index + 1 == len(pieces):
                self.record.mark_at_release(sent=index + 1, state="done")  # the worker releases at once
            else:
                await self.record.mark(sent=index + 1)

    async def _within_quota(self, pieces: list[str], cap: int, state: ReplyState) -> list[str]:
        """Where the platform allows a person only so many messages (微信客服: 5 per 48 h), the answer takes
        at most what is left; how many pieces that is gets recorded once, so a takeover splits alike, and
        a cut answer says so."""
        quota, conversations = self.adapter.reply_quota, self.delivery.conversations
        if quota is None or conversations is None:
            return pieces
        if not state.quota_pieces:
            left = await conversations.quota_left(self.message, quota)
            await self.record.claim("quota_pieces", str(min(len(pieces), left)))
            state.quota_pieces = (await self.record.load()).quota_pieces
        allowed = int(state.quota_pieces)
        if allowed >= len(pieces):
            return pieces
        if allowed == 0:
            raise ConversationTaken("the person's reply allowance is used up", code="quota")
        cut = utf8_prefix(pieces[allowed - 1], cap - utf8_len(texts.ANSWER_CUT_TEXT)) + texts.ANSWER_CUT_TEXT
        return [*pieces[: allowed - 1], cut]

    @property
    def begins_with_the_commit(self) -> bool:
        return self._in_one_step()

    def _in_one_step(self) -> bool:
        """A send's pacing, its repeat count and its mark go to Redis in one script where every key may share it
        (a single Redis) and no reply allowance takes a slot with the mark (微信客服's: conversations.take_slot)."""
        return self.delivery.single_slot and (self.adapter.reply_quota is None or self.delivery.conversations is None)

    async def _begin_at_once(self, piece: str, index: int, progress: dict[str, str | int], state: ReplyState, *,
                             checked: bool, resend: bool) -> int:
        """`_pace`, `_repeat_of` and `_begin` in one round trip (ReplyRecord.begin_send): the piece's repeat number
        (0 unchecked); Paced when an allowance is used up (nothing counted, nothing marked)."""
        windows = []
        for key, spec in self.adapter.pacing(self.message.reply_to):
            limit = window(spec)
            windows.append((self.delivery.pacer.window_key(key, limit), limit.amount, limit.get_expiry()))
        repeats = None
        if checked and resend:  # a resend is byte for byte the first: its number was recorded then
            progress[f"v{index}"] = state.variants.get(index, 0)
        elif checked:
            ttl = int(self.adapter.duplicate_check_window_s)
            repeats = (self._recent_key(piece), ttl, f"v{index}", MAX_REPEATS + 1)
        wait_s, count = await self.record.begin_send(windows, repeats, progress)
        if wait_s > 0:
            raise Paced(max(1, math.ceil(wait_s)))
        if repeats is None:
            return int(progress.get(f"v{index}", 0))
        if count > MAX_REPEATS:
            log.warning("a piece repeats too often within the duplicate-check window; the platform may drop it")
        return (count - 1) % (MAX_REPEATS + 1)

    async def _begin(self, progress: dict[str, str | int], *, resend: bool) -> None:
        """Mark a piece's send as begun; where the person has an allowance, a new piece takes its slot in the
        same step (a resend took its slot the first time), so a crash between the two can neither waste a
        slot nor send one uncounted."""
        quota, conversations = self.adapter.reply_quota, self.delivery.conversations
        if quota is None or conversations is None or resend:
            await self.record.mark(**progress)
            return
        if not await conversations.take_slot(self.message, quota, self.record, progress):
            raise ConversationTaken("the person's reply allowance is used up", code="quota")

    async def _remember_sent(self, piece_key: str, index: int) -> None:
        """Where the platform can report later that an accepted message was not delivered, keep which reply the
        platform's id of this piece belongs to (as long as such a report can come)."""
        message_id = self.adapter.platform_message_id(piece_key)
        if not message_id:
            return
        sent = {"dedup_key": self.message.dedup_key, "piece": index, "message": self.message.model_dump(mode="json")}
        key = self.delivery.keys.sent_piece(self.message.bot_id, message_id)
        await self.delivery.redis.set(key, json.dumps(sent, ensure_ascii=False), ex=SENT_PIECE_TTL_S)

    async def _repeat_of(self, piece: str) -> int:
        """How often `piece` went to this recipient within the platform's duplicate-check window before now
        (a counter in Redis, so every worker knows; it lives as long as the window after the last send)."""
        key = self._recent_key(piece)
        async with self.delivery.redis.pipeline(transaction=True) as pipe:
            pipe.incr(key)
            pipe.expire(key, int(self.adapter.duplicate_check_window_s))
            count, _ = await pipe.execute()
        if count > MAX_REPEATS:
            log.warning("a piece repeats too often within the duplicate-check window; the platform may drop it")
        return (int(count) - 1) % (MAX_REPEATS + 1)

    def _recent_key(self, piece: str) -> str:
        """The counter of `piece`'s sends to this recipient within the duplicate-check window."""
        recipient = self.message.reply_to.user_id or self.message.reply_to.chat_id
        digest = hashlib.sha256(f"{recipient}\0{piece}".encode()).hexdigest()[:32]
        return self.delivery.keys.recent_send(self.message.bot_id, digest)

    async def _pace(self) -> None:
        """Take one send from every allowance (a robot's, a member's, a conversation's), or raise Paced."""
        allowances = self.adapter.pacing(self.message.reply_to)
        if not allowances:
            return
        for key, spec in allowances:
            # Shortest window first: when a longer one refuses, a slot of a shorter one is spent unused, which
            # errs on the side of sending less than the platform allows, never more.
            decision = await self.delivery.pacer.hit(key, [window(spec)])
            if not decision.allowed:
                raise Paced(decision.retry_after_s)

    async def notice(self, text: str, once: str) -> bool:
        """Like every send: within the pacing and, where the person has an allowance, in a slot of it (taken
        with the once-mark, so the notice can never push the answer or the handoff notice out)."""
        if getattr(await self.record.load(), once, ""):
            return False
        try:
            await self._pace()
        except Paced:
            return False  # a notice is not worth waiting for: the answer is what the user waits for
        quota, conversations = self.adapter.reply_quota, self.delivery.conversations
        if quota is not None and conversations is not None:
            if not await conversations.take_slot(self.message, quota, self.record, {once: "1"}):
                return False
        elif not await self.record.claim(once):
            return False
        try:
            if self.adapter.duplicate_check_window_s > 0:  # counted, so that an answer repeating it is unique
                text += repeat_marks(await self._repeat_of(text))
            await self.adapter.send_piece(self.message.reply_to, text, duplicate_check=False)
        except SendError as exc:
            log.warning("could not send a notice", extra={"error": str(exc)})
            return False
        return True
