"""A seeded model run of the answer path: moves by people of every platform, faults at every boundary, and
the invariants the README promises, checked after every move and once the faults stop.

The model knows what each person sent (every text carries a token such as `q7x`; the stub engine answers
"answer to: <text>", so a delivered answer names the tokens it answers), who holds each 微信客服 session,
and which messages may be withheld and why (a human holds the session, the message limit). A failing run is
shrunk by dropping moves and replaying the seed's fault plan.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import re
import secrets
import time
from collections import Counter
from dataclasses import dataclass, field

from gateway.texts import ENGINE_UNAVAILABLE_TEXT
from tests.model.faults import FaultPlan, Killed
from tests.model.world import (
    KFID,
    LIMIT,
    MERGE_WINDOW_S,
    WORKERS,
    Platforms,
    Services,
    WorkerHandle,
    engine_app,
    platforms,
    start_worker,
)

TOKEN = re.compile(r"q\d+x")
PEOPLE = {"app": 2, "ding": 2, "kf": 3}
HANDOFF_NOTICE = "正在为您转接人工客服，请稍候。"
ISOLATE_S = MERGE_WINDOW_S + 1.8  # beyond a merge window and its grace: a keyword is never merged with a question
SETTLE_S = 25.0
HANDOFF_WAIT_S = 10.0


@dataclass(frozen=True)
class Move:
    kind: str  # text reset burst image keyword operator agent end enter sendfail wait
    platform: str = ""
    person: int = 0
    arg: float = 0.0

    def __str__(self) -> str:
        if self.kind == "wait":
            return f"wait {self.arg:.1f}s"
        return f"{self.platform}#{self.person} {self.kind}"


@dataclass
class Sent:
    token: str
    platform: str
    user: str
    withhold: str = ""  # why it may go unanswered ('' = it must be answered)
    silent: bool = False  # a human held the session when it was sent: the bot must not answer it


@dataclass
class Outcome:
    seed: int
    moves: list[Move]
    steps: int = 0
    faults: int = 0
    injected: list[tuple[str, str]] = field(default_factory=list)
    violations: list[str] = field(default_factory=list)

    @property
    def kind(self) -> str:
        return self.violations[0].split(":")[0] if self.violations else ""


def generate(seed: int, steps: int) -> list[Move]:
    """The seed's moves. 微信客服 customers stay under the message limit (merges make their count fuzzy);
    WeCom and DingTalk users may pass it."""
    rng = random.Random(seed)
    moves: list[Move] = []
    kf_sent = Counter[int]()
    human: set[int] = set()
    for _ in range(steps):
        platform = rng.choice(["app", "ding", "kf", "kf", "kf"])
        person = rng.randrange(PEOPLE[platform])
        roll = rng.random()
        if roll < 0.15:
            moves.append(Move("wait", arg=round(rng.uniform(0.3, 2.5), 1)))
            continue
        if platform != "kf":
            moves.append(Move("reset" if roll < 0.22 else "text", platform, person))
            continue
        if person in human:
            kind = rng.choice(["text", "agent", "end", "end"])
        else:
            kind = rng.choice(["text", "text", "burst", "image", "reset", "keyword", "operator", "agent", "enter",
                               "sendfail"])  # fmt: skip
        cost = {"text": 1, "burst": 3, "image": 2, "reset": 1}.get(kind, 0)
        if person not in human and kf_sent[person] + cost >= LIMIT:
            kind, cost = "enter", 0
        kf_sent[person] += 0 if person in human else cost
        if kind in ("keyword", "operator", "agent"):
            human.add(person)
        elif kind == "end":
            human.discard(person)
        moves.append(Move(kind, platform, person))
    return moves


class Run:
    """One execution of a list of moves against fresh people, with a seeded fault plan."""

    def __init__(self, services: Services, world: Platforms, seed: int, moves: list[Move], rate: float) -> None:
        self.services, self.world, self.moves = services, world, moves
        self.plan = FaultPlan(seed, rate)
        self.outcome = Outcome(seed, moves)
        nonce = secrets.token_hex(3)
        self.users = {(p, i): f"{p[0]}{nonce}{i}" for p, n in PEOPLE.items() for i in range(n)}
        self.sent: list[Sent] = []
        self.taken = Counter[str]()  # agents who took a customer while a handoff they asked for was pending
        self.counted = Counter[str]()  # messages each WeCom/DingTalk user sent (for the message limit)
        self.human: set[str] = set()
        self.episodes = Counter[str]()  # handoffs asked for while the bot held the session
        self.welcomes = Counter[str]()  # enter_session events that carried a welcome_code
        self.workers: list[WorkerHandle] = []
        self._closing: set[asyncio.Task[None]] = set()
        self.engine = engine_app()
        self.token_index = 0
        self.refused_before: dict[str, int] = {}

    # -- workers ---------------------------------------------------------------------------------

    async def _supervise(self) -> None:
        """Replace every killed worker by a fresh one (its lease expires; the fresh one's sweep takes it over)."""
        while True:
            for index, handle in enumerate(self.workers):
                if handle.faults.dead:
                    self._closing.add(closing := asyncio.create_task(handle.close()))
                    closing.add_done_callback(self._closing.discard)
                    self.workers[index] = await self._worker()
            await asyncio.sleep(0.05)

    async def _worker(self) -> WorkerHandle:
        while True:  # a fault may kill a worker while it starts
            with contextlib.suppress(Killed, Exception):
                return await start_worker(self.services, self.plan, f"w{secrets.token_hex(3)}", self.engine)

    # -- moves -----------------------------------------------------------------------------------

    def _token(self) -> str:
        self.token_index += 1
        return f"q{self.token_index}x"

    async def _send(self, platform: str, user: str, text: str) -> None:
        if platform == "app":
            await self.world.app_text(user, text)
        elif platform == "ding":
            await self.world.ding_text(user, text)
        else:
            await self.world.kf_write(user, text)

    def _expect(self, platform: str, user: str, token: str) -> None:
        sent = Sent(token, platform, user)
        if platform == "kf" and user in self.human:
            sent.withhold, sent.silent = "a human holds the session", True
        if platform != "kf":
            self.counted[user] += 1
            if self.counted[user] > LIMIT:
                sent.withhold = "over the message limit"
        self.sent.append(sent)

    async def _undelivered_to_human(self, user: str) -> None:
        """A human agent took the session now: what the bot has not answered yet it may no longer answer."""
        answered = await self._answered("kf", user)
        for sent in self.sent:
            if sent.user == user and sent.token not in answered and not sent.withhold:
                sent.withhold = "a human took the session before it was answered"

    async def _held_by_human(self, user: str) -> bool:
        """Whether a human holds the session (2 queued, 3 taken), waiting HANDOFF_WAIT_S for a handoff to land."""
        deadline = time.monotonic() + HANDOFF_WAIT_S
        while (await self.world.kf_session(user))["service_state"] not in (2, 3):
            if time.monotonic() > deadline:
                return False
            await asyncio.sleep(0.2)
        return True

    async def apply(self, move: Move) -> None:
        if move.kind == "wait":
            await asyncio.sleep(move.arg)
            return
        user, platform = self.users[(move.platform, move.person)], move.platform
        if move.kind == "text":
            token = self._token()
            self._expect(platform, user, token)
            await self._send(platform, user, f"问题 {token}")
        elif move.kind == "reset":
            if platform != "kf":
                self.counted[user] += 1
            await self._send(platform, user, "/reset")
        elif move.kind == "burst":
            for _ in range(3):
                token = self._token()
                self._expect(platform, user, token)
                await self.world.kf_write(user, f"还有 {token}")
                await asyncio.sleep(0.15)
        elif move.kind == "image":  # a photo, then the question about it within the merge window
            await self.world.kf_write(user, "", image=True)
            await asyncio.sleep(0.2)
            token = self._token()
            self._expect(platform, user, token)
            await self.world.kf_write(user, f"这是什么问题 {token}")
        elif move.kind == "operator" and (await self.world.kf_session(user))["service_state"] not in (0, 1):
            return  # no session of the customer's to hand over (never wrote, or it ended)
        elif move.kind in ("keyword", "operator"):
            await asyncio.sleep(ISOLATE_S)
            if user not in self.human:
                self.episodes[user] += 1
            self.human.add(user)
            if move.kind == "keyword":
                await self.world.kf_write(user, "转人工")
            else:
                await self.world.kf_operator_handoff(user)
                # The operator's handoff goes straight into the customer's lane: it overtakes whatever of theirs the
                # pull has not queued yet (a pull held up by faults: seed 219). Once the session left the bot, what
                # it has not answered is the human's (the platform refuses the bot's sends in states 2 and 3).
                if await self._held_by_human(user):
                    await self._undelivered_to_human(user)
            await asyncio.sleep(ISOLATE_S)
        elif move.kind == "agent":
            await self._undelivered_to_human(user)
            if user in self.human:
                self.taken[user] += 1  # a handoff asked for may find an agent there first: no notice is owed then
            self.human.add(user)
            await self.world.kf_agent(user, "您好，我是小李")
        elif move.kind == "end" and await self._held_by_human(user):  # only the agent holding it can end it
            notices = sum(1 for item in await self.world.delivered("kf", user) if item["content"] == HANDOFF_NOTICE)
            if notices < self.episodes[user] - self.taken[user]:
                self.taken[user] += 1  # the agent ended the session before the notice could go: none is owed
            self.human.discard(user)
            await self.world.kf_event(user, "session_status_change", change_type=3)
        elif move.kind == "enter":
            if (await self.world.kf_event(user, "enter_session")).get("code"):
                self.welcomes[user] += 1
        elif move.kind == "sendfail":
            delivered = await self.world.delivered("kf", user)
            if delivered:
                await self.world.kf_event(user, "msg_send_fail", fail_msgid=delivered[-1]["msgid"], fail_type=4)

    # -- invariants ------------------------------------------------------------------------------

    async def _answered(self, platform: str, user: str) -> Counter[str]:
        """How often each token was answered in what the person saw."""
        counts = Counter[str]()
        for item in await self.world.delivered(platform, user):
            if item["content"].startswith("answer to:"):
                counts.update(set(TOKEN.findall(item["content"])))
        return counts

    def _unknown_outcomes(self) -> int:
        """DingTalk has no duplicate check: a piece whose send had an unknown outcome (its answer lost after the
        post, or the worker killed between the post and its mark) is sent again, at least once, never lost. The
        README says so; each such fault may add one repeat, and nothing else may. A kill at any boundary counts:
        the process dies with every coroutine in it, so one killed at a Redis call of another message's task (a
        BLPOP for the next turn) can catch a DingTalk post of this one between the post and its mark (seed 3)."""
        return sum(
            1
            for boundary, fault in self.plan.injected
            if (fault == "after" and "/robot/" in boundary) or fault == "kill"
        )

    def _lost_move_codes(self) -> int:
        """WeCom gives a move's msg_code only on the session's first move ("初次变更", servicestate.go): a `trans`
        that happened while its answer was lost (the fault after it), or whose worker was killed before the code
        was marked, leaves the retry a move without a code, so no notice can go. The README says so; each such
        fault may cost one notice, and nothing else may (a kill counts as for `_unknown_outcomes`)."""
        return sum(
            1
            for boundary, fault in self.plan.injected
            if (fault == "after" and "service_state/trans" in boundary) or fault == "kill"
        )

    async def check_safety(self) -> list[str]:
        """What must hold at every moment, faults or not."""
        found = []
        for (platform, _), user in self.users.items():
            answered = await self._answered(platform, user)
            for token, count in answered.items():
                if count > 1 + (self._unknown_outcomes() if platform == "ding" else 0):
                    found.append(f"answered twice: {platform} {user} {token} answered {count} times")
            for sent in self.sent:
                if sent.user == user and sent.silent and answered[sent.token]:
                    found.append(f"spoke over a human: {user} {sent.token} was answered while a human held it")
            if platform != "kf":
                continue
            delivered = await self.world.delivered("kf", user)
            notices = sum(1 for item in delivered if item["content"] == HANDOFF_NOTICE)
            if notices > self.episodes[user]:
                found.append(f"handoff notice twice: {user} got {notices} for {self.episodes[user]} handoffs")
            welcomes = sum(1 for item in delivered if item["content"] == "欢迎光临")
            if welcomes > self.welcomes[user]:
                found.append(f"welcome twice: {user} got {welcomes} for {self.welcomes[user]} welcome codes")
            session = await self.world.kf_session(user)
            since = [item for item in delivered if item["at"] >= session["last_customer_at"]]
            answers = sum(1 for item in since if item.get("via") == "send_msg")
            if session["sent_since_customer"] > 5 or answers > 4:
                found.append(f"kf quota: {user} sent {session['sent_since_customer']} since the customer wrote, "
                             f"{answers} of them answers (at most 5, the 5th kept for a handoff)")  # fmt: skip
        refused = await self.world.kf_refusals()
        if refused.get("95001", 0) > self.refused_before.get("95001", 0):
            found.append("kf quota: WeCom refused a send over the 5-message limit (95001)")
        return found

    async def settled(self) -> bool:
        """No lane of this run's people (nor the account's pull lane) queued or leased."""
        names = [*self.users.values(), KFID]
        for pattern in ("sched:lane:", "sched:lease:"):
            async for key in self.world.redis.scan_iter(match=f"{self.world.keys.core}:{pattern}*", count=1000):
                if any(name in key.decode() for name in names):
                    return False
        return True

    async def check_final(self) -> list[str]:
        """What must hold once the faults stopped and the work settled."""
        found = [] if await self.settled() else ["stuck lane: work still queued or leased after the faults stopped"]
        failed = await self._failed_visibly()
        for (platform, _), user in self.users.items():
            answered = await self._answered(platform, user)
            delivered = await self.world.delivered(platform, user)
            unavailable = sum(1 for item in delivered if item["content"] == ENGINE_UNAVAILABLE_TEXT)
            missing = [s.token for s in self.sent if s.user == user and not s.withhold and not answered[s.token]
                       and s.token not in failed]  # fmt: skip
            if len(missing) > unavailable:
                found.append(f"dropped: {platform} {user} never got an answer to {missing}")
            if platform == "kf":
                notices = sum(1 for item in delivered if item["content"] == HANDOFF_NOTICE)
                if notices < self.episodes[user] - self.taken[user] - self._lost_move_codes():
                    found.append(f"handoff without notice: {user} asked {self.episodes[user]} times, {notices} notices")
                state = (await self.world.kf_session(user))["service_state"]
                if user in self.human and self.episodes[user] and state not in (2, 3):
                    found.append(f"not handed off: {user} asked for a human; the session is in state {state}")
            else:
                found += await self._limit_counted(user, failed)
        found += await self._growth()
        return [f"{v} {await self._dead_letters_of(v)}".rstrip() for v in found]

    async def _dead_letters_of(self, violation: str) -> str:
        """Why the people named in a violation had messages dead-lettered: the first clue to its cause."""
        reasons = []
        for _, fields in await self.world.redis.xrange(self.world.keys.dead_letters):
            letter = fields.get(b"entry", b"").decode()
            if any(user in violation and user in letter for user in self.users.values()):
                reasons.append(letter.split('"entry"')[0][:200])
        return f"[dead letters: {reasons}]" if reasons else ""

    async def _failed_visibly(self) -> set[str]:
        """Tokens of messages that went to the dead letters (an operator sees them: not silently dropped)."""
        tokens: set[str] = set()
        for _, fields in await self.world.redis.xrange(self.world.keys.dead_letters):
            tokens.update(TOKEN.findall(fields.get(b"entry", b"").decode()))
        return tokens

    async def _limit_counted(self, user: str, failed: set[str]) -> list[str]:
        """The message windows count each admitted message once, however often it was tried."""
        hits = 0
        async for key in self.world.redis.scan_iter(match=f"*:win:user:*:{user}:*", count=1000):
            hits = max(hits, int(await self.world.redis.zcard(key)))
        expected = min(self.counted[user], LIMIT)
        if hits != expected:
            return [f"limit counter: {user} sent {self.counted[user]} messages, {expected} admitted, counted {hits}"]
        return []

    async def _growth(self) -> list[str]:
        """No key without a lifetime, and no unbounded collection without one, that holds a person's name."""
        found, names = [], [*self.users.values()]
        redis = self.world.redis
        async for raw in redis.scan_iter(match=f"*{self.services.settings.namespace}*", count=1000):
            key = raw.decode()
            if await redis.ttl(raw) != -1:
                continue
            if any(name in key for name in names):
                found.append(f"persistent key: {key} has no lifetime and is one per conversation")
                continue
            kind = (await redis.type(raw)).decode()
            members: list[bytes] = []
            if kind == "hash":
                members = list(await redis.hkeys(raw))
            elif kind == "set":
                members = list(await redis.smembers(raw))
            elif kind == "zset":
                members = list(await redis.zrange(raw, 0, -1))
            elif kind == "list":
                members = list(await redis.lrange(raw, 0, -1))
            held = [m.decode(errors="replace") for m in members if any(n.encode() in m for n in names)]
            if held:
                found.append(f"persistent collection: {key} ({kind}, no TTL) keeps {held[:2]} of the conversations")
        return found

    # -- the run ---------------------------------------------------------------------------------

    async def execute(self) -> Outcome:
        self.refused_before = await self.world.kf_refusals()
        self.workers = [await self._worker() for _ in range(WORKERS)]
        supervisor = asyncio.create_task(self._supervise())
        try:
            self.plan.armed = True
            for step, move in enumerate(self.moves, 1):
                await self.apply(move)
                self.outcome.steps = step
                if found := await self.check_safety():
                    self.outcome.violations = [f"{v} (after move {step}: {move})" for v in found]
                    return self.outcome
            self.plan.armed = False
            deadline = time.monotonic() + SETTLE_S
            while time.monotonic() < deadline and not await self.settled():
                await asyncio.sleep(0.3)
            await asyncio.sleep(1.0)  # a last send in flight lands
            self.outcome.violations = [*await self.check_safety(), *await self.check_final()]
            return self.outcome
        finally:
            self.outcome.faults = len(self.plan.injected)
            self.outcome.injected = list(self.plan.injected)
            supervisor.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await supervisor
            await asyncio.gather(*(handle.close() for handle in self.workers), return_exceptions=True)


def quiet_logs(services: Services) -> None:
    """The product's logs of a run go to a file next to the config: faults make them loud."""
    root = logging.getLogger()
    if not any(isinstance(h, logging.FileHandler) for h in root.handlers):
        for handler in list(root.handlers):
            root.removeHandler(handler)
        root.addHandler(logging.FileHandler(services.path.with_name("model-workers.log"), encoding="utf-8"))
        root.setLevel(logging.WARNING)


def _quiet_killed(loop: asyncio.AbstractEventLoop, context: dict) -> None:
    """A killed worker's tasks end with Killed: that is the fault, not news."""
    if isinstance(context.get("exception"), Killed):
        return
    loop.default_exception_handler(context)


async def run_moves(services: Services, seed: int, moves: list[Move], rate: float) -> Outcome:
    quiet_logs(services)
    asyncio.get_running_loop().set_exception_handler(_quiet_killed)
    async with platforms(services) as world:
        return await Run(services, world, seed, moves, rate).execute()


async def shrink(services: Services, failed: Outcome, rate: float, budget: int = 12) -> Outcome:
    """Drop chunks of moves (halves, then smaller) while the same kind of violation still shows; the seed's
    fault plan is replayed each time. Bounded by `budget` replays: timing makes a replay not always repeat."""
    best = failed
    moves = failed.moves[: failed.steps] if failed.steps else failed.moves
    chunk = max(1, len(moves) // 2)
    while chunk >= 1 and budget > 0:
        start = 0
        while start < len(moves) and budget > 0:
            candidate = moves[:start] + moves[start + chunk :]
            budget -= 1
            outcome = await run_moves(services, failed.seed, candidate, rate) if candidate else None
            if outcome is not None and outcome.kind == failed.kind:
                best = outcome
                moves = outcome.moves[: outcome.steps] if outcome.violations and outcome.steps < len(candidate) \
                    else candidate  # fmt: skip
            else:
                start += chunk
        chunk //= 2
    return best


def report(outcome: Outcome) -> str:
    lines = [f"seed {outcome.seed}: {len(outcome.violations)} violation(s) after {outcome.steps} moves, "
             f"{outcome.faults} faults"]  # fmt: skip
    lines += [f"  - {v}" for v in outcome.violations]
    lines += [f"  faults (the last {min(12, len(outcome.injected))}): " + ", ".join(
        f"{kind} {boundary}" for boundary, kind in outcome.injected[-12:])]  # fmt: skip
    lines += ["  moves:", *(f"    {i}. {m}" for i, m in enumerate(outcome.moves, 1))]
    return "\n".join(lines)
