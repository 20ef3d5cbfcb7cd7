"""微信客服 callbacks use the app callbacks' crypto, with the corp id as the receiver id."""

from __future__ import annotations

from bots.wecom.crypto import WeComCrypto
from bots.wecom_kf.config import WeComKfConfig


def kf_crypto(config: WeComKfConfig) -> WeComCrypto:
    return WeComCrypto(config.token.get_secret_value(), config.encoding_aes_key.get_secret_value(), config.corp_id)
