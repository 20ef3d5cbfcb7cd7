"""DingTalk's downloads of what a person sent a robot, for the simulator: a message's downloadCode exchanged for a
temporary downloadUrl, and that URL serving the bytes.

获取机器人消息中文件下载链接 (help.dingtalk.io …/download-the-file-content-of-the-robot-receiving-message):
POST /v1.0/robot/messageFiles/download with the `x-acs-dingtalk-access-token` header and {downloadCode,
robotCode}, both required → {downloadUrl}; then "访问临时下载链接,获取文件内容". What the doc does not say is
played the harsher way (UNCONFIRMED each):
- an unknown, expired or another robot's downloadCode: one answer for all, HTTP 400 {"code":
  "InvalidParameter.DownloadCode", "message": …}: nothing in it tells an expired code from a wrong one;
- a downloadCode lives DOWNLOAD_CODE_TTL_S (the doc says only 临时) unless the test sets its own;
- `pictureDownloadCode` (in picture messages, message.md) is not taken by this API: only `downloadCode` is;
- the downloadUrl works for DOWNLOAD_URL_TTL_S, then answers 403 (as a signed object-storage link does), and
  serves the bytes with the type they were sent as.
"""

from __future__ import annotations

import secrets
import time

from fastapi import APIRouter, Request, Response
from fastapi.responses import JSONResponse

from simulator.dingtalk.state import DingTalkState, StoredMedia, token_refusal

DOWNLOAD_CODE_TTL_S = 3600.0
DOWNLOAD_URL_TTL_S = 60.0
DOWNLOAD_PATH = "/dingtalk-media/download/"
CODE_REFUSED = {"code": "InvalidParameter.DownloadCode", "message": "downloadCode is invalid or expired"}


def store_media(state: DingTalkState, data: bytes, *, mime: str, name: str, robot: str, ttl_s: float) -> str:
    """Keep what a simulated person sent to `robot`; its new downloadCode."""
    code = secrets.token_urlsafe(48)
    state.media[code] = StoredMedia(data, mime, name, robot, time.time() + ttl_s)
    return code


def media_router(state: DingTalkState) -> APIRouter:
    router = APIRouter()

    @router.post("/v1.0/robot/messageFiles/download")
    async def download_link(request: Request) -> JSONResponse:
        if refusal := token_refusal(state, request):
            return refusal
        try:
            body = await request.json()
        except ValueError:
            body = None
        if not isinstance(body, dict) or not body.get("downloadCode") or not body.get("robotCode"):
            return JSONResponse({"code": "MissingParameter", "message": "downloadCode and robotCode required"}, 400)
        stored = state.media.get(str(body["downloadCode"]))
        if stored is None or stored.expires_at < time.time() or stored.robot != body["robotCode"]:
            return JSONResponse(CODE_REFUSED, 400)
        token = secrets.token_urlsafe(24)
        state.media_links[token] = (str(body["downloadCode"]), time.time() + DOWNLOAD_URL_TTL_S)
        return JSONResponse({"downloadUrl": f"{str(request.base_url).rstrip('/')}{DOWNLOAD_PATH}{token}"})

    @router.get(DOWNLOAD_PATH + "{token}")
    async def download(token: str) -> Response:
        code, expires_at = state.media_links.get(token, ("", 0.0))
        stored = state.media.get(code)
        if stored is None or expires_at < time.time():
            return Response("AccessDenied: the link expired", status_code=403, media_type="text/plain")
        state.media_downloads += 1
        return Response(stored.data, media_type=stored.mime or "application/octet-stream")

    return router
