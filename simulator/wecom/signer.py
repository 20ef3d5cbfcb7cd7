"""WeCom's callback side: builds the signed, encrypted requests WeCom sends to a bot's URL (an app's; 微信客服's
signer, on the same envelope: simulator/wecom_kf/signer.py)."""

from __future__ import annotations

import secrets
import time
from dataclasses import dataclass
from xml.sax.saxutils import escape

from bots.wecom.config import WeComAppConfig
from bots.wecom.crypto import WeComCrypto


@dataclass(frozen=True)
class SignedCallback:
    """Query parameters and body of one callback, exactly as WeCom would POST them."""

    params: dict[str, str]
    body: bytes


def cdata(value: str) -> str:
    return "<![CDATA[" + value.replace("]]>", "]]]]><![CDATA[>") + "]]>"


def message_xml(
    bot: WeComAppConfig, user: str, msg_type: str, fields: dict[str, str], msg_id: str, create_time: int
) -> str:
    """The inner XML of a message from `user` to the app: the common fields, then the type's own (doc 96467 消息格式:
    text Content; image PicUrl, MediaId; voice MediaId, Format (and Recognition with 语音识别 on); video MediaId,
    ThumbMediaId; location Location_X, Location_Y, Scale, Label; link Title, Description, Url, PicUrl)."""
    own = "".join(f"<{name}>{cdata(value)}</{name}>" for name, value in fields.items())
    return (
        f"<xml><ToUserName>{cdata(bot.corp_id)}</ToUserName><FromUserName>{cdata(user)}</FromUserName>"
        f"<CreateTime>{create_time}</CreateTime><MsgType>{cdata(msg_type)}</MsgType>"
        f"{own}<MsgId>{escape(msg_id)}</MsgId><AgentID>{bot.agent_id}</AgentID></xml>"
    )


def text_message_xml(bot: WeComAppConfig, user: str, text: str, msg_id: str, create_time: int) -> str:
    """The inner XML of a text message from `user` to the app."""
    return message_xml(bot, user, "text", {"Content": text}, msg_id, create_time)


def event_xml(bot: WeComAppConfig, user: str, event: str, create_time: int) -> str:
    """The inner XML of an event such as enter_agent."""
    return (
        f"<xml><ToUserName>{cdata(bot.corp_id)}</ToUserName><FromUserName>{cdata(user)}</FromUserName>"
        f"<CreateTime>{create_time}</CreateTime><MsgType>{cdata('event')}</MsgType>"
        f"<Event>{cdata(event)}</Event><AgentID>{bot.agent_id}</AgentID></xml>"
    )


def card_event_xml(bot: WeComAppConfig, event: dict[str, str]) -> str:
    """The inner XML of a template-card event (doc 90240 模板卡片事件推送), from the fields the simulator's tap
    route answers (simulator/wecom/card_routes.py): the addressee first, then the event's own, in its order."""
    fields = "".join(
        f"<{name}>{escape(value) if name in ('CreateTime', 'AgentID') else cdata(value)}</{name}>"
        for name, value in event.items()
    )
    return f"<xml><ToUserName>{cdata(bot.corp_id)}</ToUserName>{fields}</xml>"


class EnvelopeSigner:
    """Signs and encrypts WeCom callbacks (receiver id: the corp id) as WeCom does; `agent_id` is in the
    envelope of an app's callbacks, absent from 微信客服's."""

    def __init__(self, token: str, encoding_aes_key: str, corp_id: str, agent_id: int | None = None) -> None:
        self.crypto = WeComCrypto(token, encoding_aes_key, corp_id)
        self._corp_id = corp_id
        self._agent_id = agent_id

    def sign_plaintext(self, plaintext: str, timestamp: int | None = None, nonce: str | None = None) -> SignedCallback:
        ts = str(timestamp if timestamp is not None else int(time.time()))
        nonce = nonce or str(secrets.randbelow(10**9))
        encrypted, signature = self.crypto.signed_envelope(plaintext, ts, nonce)
        agent = "" if self._agent_id is None else f"<AgentID>{cdata(str(self._agent_id))}</AgentID>"
        to_user = f"<ToUserName>{cdata(self._corp_id)}</ToUserName>"
        body = f"<xml>{to_user}{agent}<Encrypt>{cdata(encrypted)}</Encrypt></xml>"
        params = {"msg_signature": signature, "timestamp": ts, "nonce": nonce}
        return SignedCallback(params, body.encode("utf-8"))

    def url_verification(self, echo: str, timestamp: int | None = None) -> dict[str, str]:
        """Query of the GET WeCom sends when the operator saves the callback URL."""
        ts = str(timestamp if timestamp is not None else int(time.time()))
        nonce = str(secrets.randbelow(10**9))
        encrypted, signature = self.crypto.signed_envelope(echo, ts, nonce)
        return {"msg_signature": signature, "timestamp": ts, "nonce": nonce, "echostr": encrypted}


class WeComCallbackSigner(EnvelopeSigner):
    """Signs and encrypts callbacks with one app's token and AES key, as WeCom does."""

    def __init__(self, bot: WeComAppConfig) -> None:
        super().__init__(
            bot.token.get_secret_value(), bot.encoding_aes_key.get_secret_value(), bot.corp_id, bot.agent_id
        )
        self.bot = bot

    def text(self, user: str, text: str, msg_id: str | None = None, timestamp: int | None = None) -> SignedCallback:
        return self.message(user, "text", {"Content": text}, msg_id, timestamp)

    def message(
        self, user: str, msg_type: str, fields: dict[str, str], msg_id: str | None = None, timestamp: int | None = None
    ) -> SignedCallback:
        """A message of any type (message_xml's fields), signed and encrypted."""
        ts = timestamp if timestamp is not None else int(time.time())
        msg_id = msg_id or str(secrets.randbits(63))
        return self.sign_plaintext(message_xml(self.bot, user, msg_type, fields, msg_id, ts), timestamp=ts)

    def card_event(self, event: dict[str, str]) -> SignedCallback:
        """A tap on a card's button, as the simulator's tap route described it, signed and encrypted."""
        return self.sign_plaintext(card_event_xml(self.bot, event), timestamp=int(event["CreateTime"]))

    def image(self, user: str, media_id: str, pic_url: str) -> SignedCallback:
        return self.message(user, "image", {"PicUrl": pic_url, "MediaId": media_id})

    def voice(self, user: str, media_id: str, audio_format: str, recognition: str | None = None) -> SignedCallback:
        """A voice message; `recognition` is what WeCom heard, present only where 语音识别 is on."""
        fields = {"MediaId": media_id, "Format": audio_format}
        return self.message(user, "voice", fields if recognition is None else {**fields, "Recognition": recognition})
