"""A WeChat customer's photo, voice or file, as 微信客服 keeps it for media/get.

The Kefu API downloads media with WeCom's own media/get (`GET https://qyapi.weixin.qq.com/cgi-bin/media/get`, the
Kefu 素材管理 page: kancloud wikizhima/wechatkf-api 2376706, "该media_id仅三天内有效"), one endpoint and one media_id
space with the apps' (simulator/wecom/media.py plays it: the file, or errcode 40007 for an unknown or expired
media_id, 830002 past 20 MB). So what a customer sends goes into that same table; this module only adds the control
route a simulated customer's WeChat uses to upload it. The table lives in memory: after a restart a media_id in the
kept 微信客服 log answers 40007, as an expired one does (harsher than a platform that keeps it three days).
"""

from __future__ import annotations

import secrets
import time
from pathlib import PurePosixPath

from fastapi import APIRouter, Request
from fastapi.responses import JSONResponse

from simulator.wecom.media import MEDIA_LIFETIME_S
from simulator.wecom.state import StoredMedia, WeComApiState

UPLOAD_MAX_BYTES = 64 * 1024 * 1024  # the simulator's own bound on what a test uploads (not the platform's)


def kf_media_router(wecom: WeComApiState) -> APIRouter:
    router = APIRouter()

    @router.post("/__sim__/kf/media")
    async def customer_uploads(
        request: Request, name: str = "", mime: str = "application/octet-stream", age_s: float = 0.0
    ) -> JSONResponse:
        """The body's bytes, kept under a new media_id for a customer message to name (`media_id` in
        /__sim__/kf/customer); `age_s` backdates the upload (past three days media/get answers 40007).

        The name media/get gives back is the media_id with the file's extension, as in the media/get page's sample
        answer (`filename="MEDIA_ID.jpg"`): whether a customer's own file name comes back is UNCONFIRMED, and a
        sync_msg file item carries none (`file: {media_id}` only), so the harsher reading is played."""
        data = await request.body()
        if not data or len(data) > UPLOAD_MAX_BYTES:
            return JSONResponse({"error": f"1 to {UPLOAD_MAX_BYTES} bytes"}, status_code=400)
        media_id = "MEDIA_" + secrets.token_urlsafe(24)
        suffix = PurePosixPath(name).suffix
        suffix = suffix if suffix.isascii() and suffix[1:].isalnum() else ""  # a header value is ASCII
        expires_at = time.time() + MEDIA_LIFETIME_S - age_s
        wecom.media[media_id] = StoredMedia(data, mime, f"{media_id}{suffix}", expires_at)
        return JSONResponse({"media_id": media_id, "size": len(data)})

    return router
