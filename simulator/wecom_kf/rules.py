"""What the documents say 微信客服 does: limits, errcodes, session states (simulator/wecom_kf/api.py plays them).

Errcodes. Real, with a public source:
  40014 / 42001  access_token invalid / expired (silenceper/wechat work/kf/error.go; as simulator/wecom/api.py answers)
  45009          api freq out of limit (silenceper/wechat work/kf/error.go)
  95000 / 95004  invalid open_kfid / open_kfid does not exist (ooiai/wxkefu-rs src/errors.rs)
  95001          over the 5-message limit (wxkefu-rs src/errors.rs; "给该客户发送的消息数量已达上限" in a public TS map)
  95002          past the 48-hour window (wxkefu-rs src/errors.rs)
  95007          invalid or expired msgtoken, i.e. the callback Token of sync_msg (wxkefu-rs; "95007 不合法的msgtoken"
                 in a public C# client, NetCoreTemp WXKF)
  95013          the session has ended (the same C# client, around service_state/trans)
  95018          "send msg session status invalid" (LangBot issues #1546, #1547, #2068, answers copied verbatim)
  40008          invalid message type (WeCom global; wxkefu-rs src/errors.rs)
UNCONFIRMED (chosen here; a gateway must not depend on more than "refused"):
  95016          a trans move the state machine forbids (recalled from WeCom's global errcode page,
                 "不允许这种状态转换"; not found in the searchable sources)
  95014          trans to 3 without a servicer_userid (recalled: "用户不是接待人员")
  40058          a repeated msgid (LangBot #1687 reports "MSG_ID重复" as a refusal, without the number: UNCONFIRMED,
                 answered with the generic invalid-parameter code so that nothing can build on a guessed one)
  40058          a malformed parameter: msgid, cursor, limit, text over 2048 bytes (40058 is what WeCom's robots answer
                 for an over-long text), and an unknown, used or expired welcome_code/msg_code — the three are one
                 answer here, on purpose: a caller cannot tell them apart
  44004          empty text content (recalled WeCom global errcode)
"""

from __future__ import annotations

import re
from typing import Literal

SYNC_LIMIT_MAX = 1000  # "默认值和最大值都为1000" (silenceper/wechat work/kf/syncmsg.go)
CURSOR_MAX_BYTES = 64  # "不多于64字节" (syncmsg.go)
SYNC_TOKEN_MAX_BYTES = 128  # "不多于128字节" (syncmsg.go)
CALLBACK_TOKEN_TTL_S = 600.0  # "10分钟内有效" (syncmsg.go)
# Without a callback Token "接口有严格的频率限制" (syncmsg.go); the numbers are UNCONFIRMED. Played: at most 2
# calls without a Token in any 60 s (whole simulator), then 45009: only a puller that passes the Token pages freely.
UNTOKENED_SYNC_ALLOWANCE = (60.0, 2)
SEND_QUOTA = 5  # "最多可发送5条消息" after the customer's message, renewed when they write again (sendmsg.go)
QUOTA_WINDOW_S = 48 * 3600.0  # "48小时内" (sendmsg.go)
# "一个微信用户向一个客服帐号发起咨询后，在48h内，或主动结束会话前…都算是一次会话" (servicestate.go). Whether the 48 h
# run from the session's first or the customer's last message is UNCONFIRMED; played: from the first (harsher), after
# which the session reads as ended (4) and the customer's next message starts a new one.
SESSION_LIFETIME_S = 48 * 3600.0
WELCOME_CODE_TTL_S = 20.0  # "仅可在收到相关事件后20秒内调用，且只可调用一次" (sendmsgonevent.go)
# A msg_code (from trans or session_status_change): once, and within 20 s. The reference gives the 20 s only for the
# end-of-session code; for the others the window is UNCONFIRMED and the same 20 s is played (harsher).
MSG_CODE_TTL_S = 20.0
# A welcome_code comes only if the customer "在过去48小时里未收过欢迎语，且未向该用户发过消息" (sendmsgonevent.go).
WELCOME_QUIET_S = 48 * 3600.0
# The Kefu text cap is UNCONFIRMED ([ref §4]: bots split at WeCom's 2048 bytes). Played: a text over 2048 bytes is
# refused whole (40058) rather than cut — nothing reaches the customer, so only a sender that splits gets through.
TEXT_MAX_BYTES = 2048
MSGID_MAX_BYTES = 32  # "不多于32字节, 字符串取值范围(正则表达式)：[0-9a-zA-Z_-]*" (sendmsg.go)
MSGID_PATTERN = re.compile(r"[0-9a-zA-Z_-]+")
ACCOUNT_LIST_MAX = 100  # account/list limit range [1, 100] (UNCONFIRMED: past it, 40058)

ERR_BAD_JSON = 47001
ERR_TOKEN_INVALID = 40014
ERR_TOKEN_EXPIRED = 42001
ERR_MSGTYPE = 40008
ERR_FREQ = 45009
ERR_INVALID_PARAM = 40058  # UNCONFIRMED uses, see the module docstring
ERR_EMPTY_CONTENT = 44004  # UNCONFIRMED
ERR_OPEN_KFID_INVALID = 95000
ERR_QUOTA = 95001
ERR_WINDOW = 95002
ERR_OPEN_KFID_UNKNOWN = 95004
ERR_SYNC_TOKEN = 95007
ERR_SESSION_ENDED = 95013
ERR_NOT_SERVICER = 95014  # UNCONFIRMED
ERR_BAD_TRANSITION = 95016  # UNCONFIRMED
ERR_SESSION_STATE = 95018
# UNCONFIRMED: the documents say only that a repeated msgid is refused. The simulator answers the generic
# invalid-parameter code, which botgw does not special-case: the harsher reading (no code to recognise).
ERR_MSGID_REPEATED = 40058
FAIL_REFUSED = 10  # msg_send_fail's fail_type: the customer refused the message

# Session states (servicestate.go): 0 new, 1 the API's smart assistant, 2 the pool, 3 a human agent, 4 ended.
NEW, ASSISTANT, POOL, HUMAN, ENDED = 0, 1, 2, 3, 4
# [ref §6]; 4 is final and left only by a customer's new message, never by the API. 0→4 is refused: the official
# trans page lists 1/2/3 as the moves out of 0 (as checked for issue 18), while the reference's K1 summary lists 4
# too; the harsher reading is played.
ALLOWED_MOVES: dict[int, frozenset[int]] = {
    NEW: frozenset({1, 2, 3}),
    ASSISTANT: frozenset({1, 2, 3, 4}),
    POOL: frozenset({2, 3, 4}),
    HUMAN: frozenset({3, 4}),
    ENDED: frozenset(),
}
SENDABLE_STATES = frozenset({NEW, ASSISTANT})

Endpoint = Literal[
    "sync_msg", "send_msg", "send_msg_on_event", "service_state_get", "service_state_trans", "account_list"
]

# What a customer can send that sync_msg names by media_id (silenceper/wechat work/kf/syncmsg/message.go: image,
# voice, video, file each carry `media_id` alone; wecom-kf.md §2).
MEDIA_MSGTYPES = ("image", "voice", "video", "file")
