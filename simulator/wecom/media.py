"""Media as WeCom keeps it, for the simulator: the app's media/get, and the AI bot's encrypted media URLs.

App (WeCom doc 96486 获取临时素材): GET /cgi-bin/media/get?access_token=&media_id= serves the file
"和普通的http下载相同" (Content-Type, Content-disposition: attachment; filename="…", Content-Length),
or a JSON error: 40007 "invalid media_id" for an unknown one, and for one past its three days
("media_id有效期只有3天"); 830002 for a file too large to be served whole ("若文件过大则返回错误码830002，
需使用Range分块下载", 20 MB the size it names; Range requests are not played: botgw never downloads that much).
The error answer's headers are left out by the doc (UNCONFIRMED): served as text/plain, so that only a client that
reads the body, not the type, sees the error. The files are put there by simulated members (control route: a
member's client sends a picture or a recording).

AI bot (doc 100719 接收消息, 结构体说明 图片/文件): image.url and file.url serve the file encrypted with the bot's
EncodingAESKey (AES-256-CBC, IV its first 16 bytes, PKCS#7 to 32 bytes), "该url五分钟内有效". The simulated member
(simulator/wecom/ai_user.py, which holds the bot's key as WeCom does) puts the ciphertext here; past five minutes
the URL is answered 403 (UNCONFIRMED: what the storage host answers an expired signed URL; a refusal is the harsh
reading).
"""

from __future__ import annotations

import secrets
import time
from urllib.parse import quote

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from simulator.wecom.robots import RobotState
from simulator.wecom.state import StoredMedia, WeComApiState

MEDIA_LIFETIME_S = 3 * 24 * 3600.0  # 96486: media_id有效期只有3天
WHOLE_DOWNLOAD_MAX_BYTES = 20 * 1024 * 1024  # 96486: larger files answer 830002 (Range downloads, not played)
AIBOT_URL_LIFETIME_S = 300.0  # 100719: 该url五分钟内有效
AIBOT_FILE_MAX_BYTES = 100 * 1024 * 1024  # 100719: 智能机器人目前仅支持100M大小以内的文件回调


def _error(errcode: int, errmsg: str) -> Response:
    return Response(f'{{"errcode": {errcode}, "errmsg": "{errmsg}"}}', media_type="text/plain")


def _expire(media: dict[str, StoredMedia], key: str) -> dict[str, bool]:
    stored = media.get(key)
    if stored is not None:
        stored.expires_at = 0.0
    return {"expired": stored is not None}


def app_media_router(state: WeComApiState) -> APIRouter:
    """media/get, and the control routes a simulated member's client uses to send a file (and a test to age it)."""
    router = APIRouter()

    @router.get("/cgi-bin/media/get")
    async def media_get(access_token: str = "", media_id: str = "") -> Response:
        fault = state.faults.take("media_get")
        if fault and fault.http_status:
            return JSONResponse({"error": "simulated"}, status_code=fault.http_status)
        if fault and fault.errcode is not None:
            return _error(fault.errcode, fault.errmsg or "simulated")
        refused = state.token_refusal(access_token)
        if refused:
            return _error(*refused)
        stored = state.media.get(media_id)
        if stored is None or stored.expires_at < time.time():
            return _error(40007, "invalid media_id")
        if len(stored.data) > WHOLE_DOWNLOAD_MAX_BYTES:
            return _error(830002, "file too large, use Range to download")
        # 96486's sample answer: Content-disposition: attachment; filename="MEDIA_ID.jpg". A name that is not ASCII
        # is sent as RFC 5987's filename* beside an ASCII one (UNCONFIRMED how WeCom writes one).
        ascii_name = stored.name.encode("ascii", "replace").decode().replace("?", "_").replace('"', "_")
        disposition = f"attachment; filename=\"{ascii_name}\"; filename*=UTF-8''{quote(stored.name)}"
        headers = {"Content-disposition": disposition, "Cache-Control": "no-cache"}
        return Response(stored.data, media_type=stored.mime, headers=headers)

    @router.post("/__sim__/wecom/media")
    async def member_sends_media(request: Request, name: str = "media", mime: str = "") -> dict[str, str]:
        """A member's client uploads a picture or recording for a message to the app: its MediaId (and a PicUrl,
        which botgw does not use)."""
        media_id = secrets.token_urlsafe(32)
        kind = mime or request.headers.get("content-type", "application/octet-stream")
        state.media[media_id] = StoredMedia(await request.body(), kind, name, time.time() + MEDIA_LIFETIME_S)
        return {"media_id": media_id, "pic_url": f"{request.base_url}__sim__/wecom/pic/{media_id}"}

    @router.get("/__sim__/wecom/pic/{media_id}")
    async def pic_url(media_id: str) -> Response:
        """The image message's PicUrl (doc 96467: 图片链接), the picture without a token."""
        stored = state.media.get(media_id)
        if stored is None:
            return Response(status_code=404)
        return Response(stored.data, media_type=stored.mime)

    @router.post("/__sim__/wecom/media/{media_id}/expire")
    async def expire_media(media_id: str) -> dict[str, bool]:
        """The media_id's three days are over."""
        return _expire(state.media, media_id)

    return router


def aibot_media_router(state: RobotState) -> APIRouter:
    """The AI bot's media URLs: served (as WeCom's storage would) and put there by the simulated member."""
    router = APIRouter()

    @router.get("/__sim__/wecom-ai/media/{token}")
    async def aibot_media(token: str) -> Response:
        stored = state.media.get(token)
        if stored is None or stored.expires_at < time.time():
            return Response("Request has expired", status_code=403, media_type="text/plain")
        return Response(stored.data, media_type="application/octet-stream")

    @router.post("/__sim__/wecom-ai/media")
    async def member_sends_aibot_media(request: Request) -> JSONResponse:
        """The ciphertext of a member's picture or file (encrypted with the bot's key, as WeCom does): its URL."""
        data = await request.body()
        if len(data) > AIBOT_FILE_MAX_BYTES:
            return JSONResponse({"error": "over 100 MB: WeCom sends no callback for it"}, status_code=413)
        token = secrets.token_urlsafe(24)
        state.media[token] = StoredMedia(data, "application/octet-stream", "", time.time() + AIBOT_URL_LIFETIME_S)
        return JSONResponse({"url": f"{request.base_url}__sim__/wecom-ai/media/{token}"})

    @router.post("/__sim__/wecom-ai/media/{token}/expire")
    async def expire_aibot_media(token: str) -> dict[str, bool]:
        """The URL's five minutes are over."""
        return _expire(state.media, token)

    return router
