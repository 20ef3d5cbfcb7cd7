"""The web chat page (Chainlit), for people without a WeCom or DingTalk bot.

It never calls vLLM itself: each message goes to the gateway's /web API, through the same
limits, memory, queue and worker as every platform, and the answer streams back as the
worker writes it. Started by `botgw web --config FILE` (which sets BOTGW_CONFIG and
BOTGW_WEB_BOT for this module).
"""

from __future__ import annotations

import asyncio
import json
from pathlib import Path

import chainlit as cl
import httpx
from chainlit.input_widget import Select, Switch
from starlette.datastructures import Headers

from bots.buttons import read_button_key
from bots.web.config import PRESETS, WebBotConfig
from knowledge.prompt import CITATION_MARK
from webchat.bot_settings import page_settings
from webchat.guard import header_user
from webchat.markdown import ImageLinks, images_as_links, sources_text
from webchat.oauth import install as install_company_logins
from webchat.passwords import PasswordSignIn

TAP_ACTION = "botgw_button"  # the Chainlit action of a question's buttons (bots/buttons.py keys in its payload)
BUTTON_ICONS = {"confirmed": "check", "cancelled": "x"}  # lucide icon names, as Chainlit's actions take them
STATUS_TEXT = {
    "ready": "Engine ready.",
    "busy": "Engine busy: answers may take a little longer.",
    "loading": "Engine loading: your answer will come as soon as it is ready.",
}


BOT: WebBotConfig = page_settings().web  # its own bot only (webchat/bot_settings.py)
API = f"{BOT.gateway_url.rstrip('/')}/web/{BOT.id}"
AUTH = {"Authorization": f"Bearer {BOT.api_key.get_secret_value()}"}
LOGINS = install_company_logins(BOT)  # WeCom/DingTalk sign-in if web_login names them (webchat/oauth.py)


PASSWORDS = PasswordSignIn(BOT)


@cl.password_auth_callback
async def password_auth(username: str, password: str) -> cl.User | None:
    """scrypt off the event loop, failed sign-ins limited per name and address (webchat/passwords.py)."""
    user = await PASSWORDS.check(username, password)
    return cl.User(identifier=user.name, metadata={"login": "password", "name": user.name}) if user else None


if BOT.trusted_header:

    @cl.header_auth_callback
    async def header_auth(headers: Headers) -> cl.User | None:
        """Only what a trusted proxy sent (webchat/guard.py), and only a listed name unless allow_unlisted."""
        name = header_user(BOT, headers)
        return cl.User(identifier=name, metadata={"login": "header", "name": name}) if name else None


async def engine_status() -> str:
    try:
        async with httpx.AsyncClient(timeout=5) as http:
            return (await http.get(f"{API}/status", headers=AUTH)).json().get("engine", "loading")
    except (httpx.HTTPError, ValueError):
        return "loading"


@cl.on_chat_start
async def start() -> None:
    settings = await cl.ChatSettings(
        [
            Select(id="preset", label="Task preset", values=list(PRESETS), initial_index=0),
            Switch(id="experts", label="Show which experts answered (MoE on GPU)", initial=False),
        ]
    ).send()
    cl.user_session.set("settings", settings)
    status = await engine_status()
    await cl.Message(content=f"{STATUS_TEXT[status]} Type /reset to start over, /help for help.",
                     author="status").send()


@cl.on_settings_update
async def settings_changed(settings: dict) -> None:
    cl.user_session.set("settings", settings)


def signed_in_as() -> tuple[str, str]:
    """The signed-in user's name and how they signed in, from the page's session (never from the browser's post).
    The gateway qualifies the name by how it signed in: wecom → the WeCom member, dingtalk → the DingTalk staff
    member (webchat/oauth.py), otherwise the page's own user web:<bot>:<name>."""
    user = cl.user_session.get("user")
    meta = (user.metadata or {}) if user else {}
    return meta.get("name") or (user.identifier if user else "anonymous"), meta.get("login") or "password"


@cl.on_message
async def on_message(message: cl.Message) -> None:
    settings = cl.user_session.get("settings") or {}
    preset = settings.get("preset") or next(iter(PRESETS))
    name, login = signed_in_as()
    attachments = await upload_files(message.elements or [], name, login)
    if attachments is None:
        return
    body = {"user": name, "login": login, "text": message.content, "temperature": PRESETS.get(preset, 0.1)}
    if attachments:
        body["attachments"] = attachments
    if await engine_status() == "loading":
        await cl.Message(content=STATUS_TEXT["loading"], author="status").send()
    await ask_gateway(body, bool(settings.get("experts")))


@cl.action_callback(TAP_ACTION)
async def on_tap(action: cl.Action) -> None:
    """A button under a question (确认/取消), clicked: its buttons go (a second click is not offered), and the tap
    goes to the gateway as the signed-in user's, whose answer streams in like any answer. The key is the
    browser's to send: the gateway checks it, and only the asker's tap of the question waiting settles it."""
    key = str((action.payload or {}).get("key", ""))
    shown: dict[str, list[cl.Action]] = cl.user_session.get("questions") or {}
    tap = read_button_key(key)
    for button in (shown.pop(tap.question_id, None) if tap else None) or [action]:
        await button.remove()
    if tap is None:
        return
    name, login = signed_in_as()
    settings = cl.user_session.get("settings") or {}
    await ask_gateway({"user": name, "login": login, "button": key}, bool(settings.get("experts")))


async def ask_gateway(body: dict, show_experts: bool) -> None:
    """Post a message (or a tap) to the gateway and show its answer as it streams."""
    answer = cl.Message(content="")
    timeout = httpx.Timeout(BOT.answer_timeout_s + 10, connect=5)
    try:
        async with (
            httpx.AsyncClient(timeout=timeout) as http,
            http.stream("POST", f"{API}/chat", json=body, headers=AUTH) as response,
        ):
            if response.status_code != 200:
                error = json.loads(await response.aread() or b"{}")
                await cl.ErrorMessage(content=error.get("message") or "The gateway refused the message.").send()
                return
            await read_events(response, answer, show_experts)
    except httpx.HTTPError:
        await cl.ErrorMessage(content="The assistant cannot be reached right now; please try again.").send()


async def upload_files(elements: list, user: str, login: str) -> list[dict] | None:
    """Each attached file posted to the gateway (`/web/{bot}/uploads`), which keeps it for the worker: the refs
    it handed out, as the chat message names them; None when one was refused (the page says why)."""
    attachments = []
    try:
        async with httpx.AsyncClient(timeout=httpx.Timeout(60, connect=5)) as http:
            for element in elements:
                if not getattr(element, "path", None):
                    continue
                data = await asyncio.to_thread(Path(element.path).read_bytes)  # Chainlit's spool of the upload
                response = await http.post(
                    f"{API}/uploads", content=data, params={"user": user, "login": login, "name": element.name},
                    headers={**AUTH, "Content-Type": element.mime or "application/octet-stream"},
                )
                if response.status_code != 201:
                    refusal = response.json().get("message") if response.headers.get("content-type", "").startswith(
                        "application/json") else None
                    await cl.ErrorMessage(content=f"{element.name}: {refusal or 'the file was not taken.'}").send()
                    return None
                attachments.append(response.json())
    except httpx.HTTPError:
        await cl.ErrorMessage(content="The assistant cannot be reached right now; please try again.").send()
        return None
    return attachments


async def read_events(response: httpx.Response, answer: cl.Message, show_experts: bool) -> None:
    """The answer as it streams; an image from elsewhere reaches the page as a link (webchat/markdown.py)."""
    images = ImageLinks()
    async for line in response.aiter_lines():
        if not line.startswith("data:"):
            continue
        event = json.loads(line[5:])
        if "delta" in event:
            if shown := images.feed(event["delta"]):
                await answer.stream_token(shown)
        elif event.get("done"):
            if rest := images.flush():
                await answer.stream_token(rest)
            if not answer.content:
                answer.content = images_as_links(event.get("text", ""))
            if event.get("sources"):  # grounded in a knowledge base: the sources go under the answer, once
                answer.content = without_citation(answer.content)
                answer.elements = [cl.Text(name="参考资料", content=sources_text(event["sources"]), display="inline")]
            if show_experts and event.get("experts"):
                answer.content += f"\n\n`{event['experts']}`"
            if event.get("question"):
                answer.actions = question_buttons(event["question"])
            if not answer.content and not answer.actions:  # done with nothing to show (a tap that did nothing)
                return
            await answer.send() if not answer.id else await answer.update()
            return
        elif "error" in event:
            message = images_as_links(event.get("message", "Something went wrong; please try again."))
            await cl.ErrorMessage(content=message).send()
            return


def question_buttons(question: dict) -> list[cl.Action]:
    """The buttons under an answer that asks a question (确认, 取消: `question` of the final event), kept in the
    session by question so that a click on one takes them all away."""
    buttons = []
    for button in question.get("buttons") or []:
        tap = read_button_key(str(button.get("key", "")))
        if tap is not None:
            buttons.append(cl.Action(name=TAP_ACTION, payload={"key": str(button["key"])},
                                     label=str(button.get("label", "")), icon=BUTTON_ICONS[tap.choice]))
    shown = cl.user_session.get("questions") or {}
    shown[str(question.get("id", ""))] = buttons
    cl.user_session.set("questions", shown)
    return buttons


def without_citation(text: str) -> str:
    """The answer without its closing 来源：… paragraph (the page shows the sources in their own place)."""
    head, mark, tail = text.rpartition(CITATION_MARK)
    if not mark or (head and not head.endswith("\n")) or "\n\n" in tail.strip():
        return text
    return head.rstrip() or text
