"""Faults on demand, one mechanism for every simulated platform: what the next calls of an endpoint answer instead
of success.

A test or a script posts a fault to `POST /__sim__/<platform>/faults` (answered `{"pending_faults": n}`); the
platform's API takes the first pending fault of the endpoint it serves on each call (`FaultQueue.take`), once its
`after` calls have passed, and the fault is used up after `times` calls. What each platform honours of a fault:

- WeCom app API (/__sim__/wecom): endpoint `send` (message/send, the default) honours delay_s, hold, http_status
  and errcode/errmsg; `gettoken` delay_s and errcode/errmsg; `getuserinfo` (web sign-in, simulator/web_login.py)
  errcode/errmsg. `after` and `times` everywhere. `touser` on `send`: only sends to that member meet the fault
  (the others pass as if it were not there), so that a test's fault is not spent on another test's sends to the
  same simulator.
- 微信客服 (/__sim__/kf): endpoint required, one of sync_msg, send_msg, send_msg_on_event, service_state_get,
  service_state_trans, account_list (any other is refused, 422); each honours delay_s, http_status and
  errcode/errmsg; the two sends `deliver`; sync_msg `empty_page` and `max_items`. `after` and `times` everywhere.
- DingTalk (/__sim__/dingtalk): endpoint `send` (sessionWebhook, group and one-to-one OpenAPI sends; the default)
  honours delay_s, http_status and errcode/errmsg; `card.<op>` (op: create, deliver, status, stream) honours
  http_status, and `after`, which is DingTalk's route's name for `deliver` (the card call takes effect, then
  fails). `times` everywhere; a count of calls to let through first is not played there.

A token errcode (40014, 42001) given as a fault of WeCom's send or of any Kefu call also drops the caller's token,
as the platform would have. Every platform answers the default errmsg it always has when the fault names none.
"""

# No `from __future__ import annotations`: `faults_route` annotates its route with the platform's model class at
# run time, and FastAPI reads that annotation to validate the posted fault.

from fastapi import APIRouter, HTTPException
from pydantic import BaseModel, Field


class Fault(BaseModel):
    """What the next `times` calls of `endpoint` answer instead of success (the union of what the platforms play;
    each takes what the table above says and ignores the rest)."""

    endpoint: str = "send"
    times: int = 1
    after: int = 0  # let this many calls of the endpoint through first (hold the second send: after=1)
    errcode: int | None = None
    errmsg: str | None = None  # None: the platform's own default text
    http_status: int | None = None
    delay_s: float = 0.0  # slow: the call waits this long, then answers as the rest of the fault says (or succeeds)
    hold: bool = False  # WeCom send: wait until `POST /__sim__/wecom/release`
    # The call's effect happens (the message is delivered), then it answers the fault: a lost answer.
    deliver: bool = False
    # Kefu sync_msg: an empty msg_list with has_more=1, as the platform may answer (wecom-kf.md §2).
    empty_page: bool = False
    max_items: int | None = Field(default=None, ge=0)  # Kefu sync_msg: fewer items than asked, has_more=1
    touser: str | None = None  # WeCom send: only sends to this member meet it (None: every send)


class FaultQueue:
    """A platform's pending faults, oldest first."""

    def __init__(self) -> None:
        self._faults: list[Fault] = []

    def add(self, fault: Fault) -> int:
        self._faults.append(fault)
        return self.pending

    def take(self, endpoint: str, touser: str | None = None) -> Fault | None:
        """The fault that applies to this call of `endpoint` (to `touser`, where the call names one), if any: the
        first pending one, once its `after` calls have passed; it is used up after `times` calls."""
        for fault in self._faults:
            if fault.endpoint == endpoint and fault.touser in (None, touser):
                if fault.after > 0:
                    fault.after -= 1
                    return None
                fault.times -= 1
                if fault.times <= 0:
                    self._faults.remove(fault)
                return fault
        return None

    def clear(self) -> None:
        self._faults.clear()

    @property
    def pending(self) -> int:
        return len(self._faults)

    def __len__(self) -> int:
        return self.pending


def faults_route(router: APIRouter, platform: str, queue: FaultQueue, model: type[Fault] = Fault,
                 aimed: frozenset[str] = frozenset()) -> None:
    """`POST /__sim__/<platform>/faults`: a fault as `model` reads it, queued; the number now pending comes back.
    `aimed`: the endpoints whose calls name a `touser` (any other refuses a fault that names one: it would never
    be met, and stay pending)."""

    async def add_fault(fault: model) -> dict[str, int]:  # type: ignore[valid-type]
        if fault.touser is not None and fault.endpoint not in aimed:
            raise HTTPException(422, f"touser is honoured only by {sorted(aimed)} here, not by {fault.endpoint!r}")
        return {"pending_faults": queue.add(fault)}

    router.add_api_route(f"/__sim__/{platform}/faults", add_fault, methods=["POST"])
