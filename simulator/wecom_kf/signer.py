"""The signed callback 微信客服 sends a bot's URL: "there is something to pull" [ref §1] (the envelope:
simulator/wecom/signer.py)."""

from __future__ import annotations

import time

from bots.wecom_kf.config import WeComKfConfig
from simulator.wecom.signer import EnvelopeSigner, SignedCallback, cdata


def kf_msg_or_event_xml(corp_id: str, token: str, open_kfid: str, create_time: int) -> str:
    """The inner XML of the callback that says "there is something to pull" [ref §1]."""
    return (
        f"<xml><ToUserName>{cdata(corp_id)}</ToUserName><CreateTime>{create_time}</CreateTime>"
        f"<MsgType>{cdata('event')}</MsgType><Event>{cdata('kf_msg_or_event')}</Event>"
        f"<Token>{cdata(token)}</Token><OpenKfId>{cdata(open_kfid)}</OpenKfId></xml>"
    )


class WeComKfCallbackSigner(EnvelopeSigner):
    """Signs and encrypts Kefu callbacks with the bot's token and AES key (receive id: the corp id), as WeCom does;
    a Kefu callback belongs to no app, so its envelope has no AgentID."""

    def __init__(self, bot: WeComKfConfig) -> None:
        super().__init__(bot.token.get_secret_value(), bot.encoding_aes_key.get_secret_value(), bot.corp_id)
        self.bot = bot

    def kf_msg_or_event(self, token: str, open_kfid: str, timestamp: int | None = None) -> SignedCallback:
        ts = timestamp if timestamp is not None else int(time.time())
        return self.sign_plaintext(kf_msg_or_event_xml(self.bot.corp_id, token, open_kfid, ts), timestamp=ts)
