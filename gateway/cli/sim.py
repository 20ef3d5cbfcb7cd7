"""`botgw sim`: the platform simulator (`sim serve`), and a person writing to a bot through it (`sim wecom`,
`dingtalk`, `wecom-kf`, `wecom-ai`), the bot's answer printed. simulator/ is imported only when a command runs: the
Docker image has no simulator, and its other commands must not need it."""

from __future__ import annotations

import argparse
import asyncio
import os
import sys
import time
from typing import TYPE_CHECKING, TypeVar

import httpx

from gateway.config import load_settings
from gateway.logs import setup_logging

if TYPE_CHECKING:
    from bots.wecom.config import WeComAppConfig

T = TypeVar("T")
DEFAULT_GATEWAY_URL = "http://127.0.0.1:8080"
HUMAN_KF_STATES = (2, 3)  # 微信客服 service_state: the queue for a human, a human agent (wecom-kf.md §6)


def _player(
    sub: argparse._SubParsersAction, name: str, help_text: str, person: tuple[str, str | None] = ("--user", None)
) -> argparse.ArgumentParser:
    """A `botgw sim` command that plays a person writing to a bot through the gateway, then waits for the answer."""
    player = sub.add_parser(name, help=help_text)
    player.add_argument("--config", required=True)
    player.add_argument("--bot", required=True)
    player.add_argument(person[0], required=True, help=person[1])
    player.add_argument("--gateway", default=os.environ.get("BOTGW_GATEWAY_URL", DEFAULT_GATEWAY_URL))
    player.add_argument("--timeout", type=float, default=120.0)
    _attachments(player)
    return player


def _attachments(player: argparse.ArgumentParser) -> None:
    """What a simulated person can send besides text: each becomes the platform's own message type, its media
    uploaded to the simulator first (so the bot downloads it from there, as from the platform)."""
    player.add_argument("--image", metavar="FILE", default=None, help="send this picture")
    player.add_argument("--voice", metavar="FILE", default=None, help="send this recording as a voice message")
    player.add_argument("--file", metavar="FILE", default=None, help="send this document as a file message")
    player.add_argument("--quote", metavar="TEXT", default=None, help="the message quotes an earlier one")
    player.add_argument("text", nargs="?", default="", help="what the person types ('' with an attachment alone)")


def register(sub: argparse._SubParsersAction) -> None:
    sim = sub.add_parser("sim", help="the platform simulator (local playground)")
    sim_sub = sim.add_subparsers(dest="sim_command", required=True)
    sim_serve = sim_sub.add_parser("serve", help="run the simulated platform servers")
    sim_serve.add_argument("--config", required=True)
    sim_serve.add_argument("--host", default="127.0.0.1")
    sim_serve.add_argument("--port", type=int, default=8090)
    sim_serve.add_argument(
        "--stream-keepalive-s", type=float, default=20.0, help="Stream gateway's ping interval and timeout"
    )
    sim_serve.add_argument(
        "--state",
        metavar="FILE",
        default=None,
        help="keep the simulated 微信客服 (its log, cursors, sessions) in FILE across restarts, as the real platform "
        "does (the playground's); without it everything is in memory",
    )
    sim_serve.set_defaults(run=serve)
    sim_wecom = _player(sim_sub, "wecom", "send a message as a WeCom user and print the bot's reply")
    sim_wecom.add_argument("--tap", metavar="LABEL", default=None,
                           help="tap the button LABEL (确认, 取消) of the last card the user was shown, instead of "
                           "writing")
    sim_wecom.set_defaults(run=wecom)
    sim_dt = _player(sim_sub, "dingtalk", "write to a DingTalk robot (HTTP or Stream mode), print its answer")
    sim_dt.add_argument("--group", default=None, help="a group conversation id: the robot is @-mentioned there")
    sim_dt.add_argument("--simulator", default=os.environ.get("BOTGW_SIMULATOR_URL", "http://127.0.0.1:8090"))
    sim_dt.set_defaults(run=dingtalk)
    sim_kf = _player(sim_sub, "wecom-kf", "write to a 微信客服 account as a WeChat customer, print the answer",
                     person=("--customer", "the customer's external_userid"))  # fmt: skip
    sim_kf.add_argument("--open-kfid", default=None, help="the account (default: the bot's first)")
    sim_kf.set_defaults(run=wecom_kf)
    sim_ai = sim_sub.add_parser("wecom-ai", help="talk to a WeCom AI bot and watch the streamed answer grow")
    sim_ai.add_argument("--config", required=True)
    sim_ai.add_argument("--bot", required=True)
    sim_ai.add_argument("--user", required=True)
    sim_ai.add_argument("--gateway", action="append", help="gateway URL; repeat to spread refreshes over replicas")
    sim_ai.add_argument("--simulator", default=os.environ.get("BOTGW_SIMULATOR_URL", "http://127.0.0.1:8090"))
    sim_ai.add_argument("--interval", type=float, default=0.5, help="seconds between refresh callbacks")
    _attachments(sim_ai)
    sim_ai.set_defaults(run=wecom_ai)


def _read_attachment(command: str, path: str | None) -> bytes | None:
    """The file a flag names (b"" for none), or None after saying why it cannot be read."""
    from pathlib import Path

    try:
        return Path(path).read_bytes() if path else b""
    except OSError as exc:
        print(f"botgw sim {command}: cannot read {path}: {exc.strerror}", file=sys.stderr)
        return None


def _chosen_bot(args: argparse.Namespace, platform: str, kind: type[T]) -> T | None:
    """The bot --bot names when it is a `platform` bot; else None, with one line naming that platform's bots. Asked
    before anything is posted."""
    from simulator.bot_choice import choose_bot

    bot, problem = choose_bot(load_settings(args.config).bots, args.bot, platform)
    if problem:
        print(f"botgw sim {platform}: {problem}", file=sys.stderr)
    return bot if isinstance(bot, kind) else None


def serve(args: argparse.Namespace) -> int:
    from pathlib import Path

    import uvicorn

    from simulator.server import create_simulator_app
    from simulator.state_file import StateFileError

    settings = load_settings(args.config)
    setup_logging(settings.log_level)
    try:
        app = create_simulator_app(settings.bots, args.port, Path(args.state) if args.state else None)
    except StateFileError as exc:
        print(f"botgw sim serve: {exc}", file=sys.stderr)
        return 2
    # The Stream gateway's own keepalive: how long DingTalk keeps pushing into a connection that died silently
    # before it notices (UNCONFIRMED on the platform; a message pushed into it meanwhile is lost).
    keepalive = args.stream_keepalive_s
    uvicorn.run(
        app,
        host=args.host,
        port=args.port,
        log_config=None,
        access_log=False,
        ws_ping_interval=keepalive,
        ws_ping_timeout=keepalive,
    )
    return 0


def wecom(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bots.wecom.config import WeComAppConfig
    from simulator.wecom.signer import WeComCallbackSigner

    bot = _chosen_bot(args, "wecom", WeComAppConfig)
    if bot is None:
        return 2
    # An app message is one of text, image, voice, video, location, link (doc 96467): no file, no quote, and a
    # picture comes without text. A voice message's text is WeCom's recognition of it (语音识别 on).
    refused = ("--tap is a tap, not a message: no text or attachment with it" if args.tap and (
                   args.text or args.image or args.voice or args.file or args.quote) else
               "--file: a WeCom app has no file messages" if args.file else
               "--quote: a WeCom app message cannot quote" if args.quote else
               "--image and --voice are two messages: send one" if args.image and args.voice else
               "--image: an app's image message carries no text" if args.image and args.text else "")
    if refused:
        print(f"botgw sim wecom: {refused}", file=sys.stderr)
        return 2
    attachment = args.image or args.voice
    data = _read_attachment("wecom", attachment)
    if data is None:
        return 2
    since = time.time()
    signer = WeComCallbackSigner(bot)
    gateway = args.gateway.rstrip("/")
    with httpx.Client(timeout=10) as http:
        if attachment:
            import mimetypes

            name = Path(attachment).name
            mime = mimetypes.guess_type(name)[0] or ("image/jpeg" if args.image else "audio/amr")
            try:  # the member's client uploads the media; the callback names it by MediaId
                sent = http.post(f"{bot.api_base}/__sim__/wecom/media", params={"name": name, "mime": mime},
                                 content=data)
                sent.raise_for_status()
            except httpx.HTTPError as exc:
                print(f"botgw sim: the simulator at {bot.api_base} took no media ({type(exc).__name__})",
                      file=sys.stderr)
                return 3
            media_id, pic_url = sent.json()["media_id"], sent.json()["pic_url"]
            audio_format = Path(name).suffix.lstrip(".").lower() or "amr"
            callback = (signer.image(args.user, media_id, pic_url) if args.image else
                        signer.voice(args.user, media_id, audio_format, args.text or None))
        elif args.tap:
            tapped = _card_tap(http, bot, args.user, args.tap)
            if isinstance(tapped, int):
                return tapped
            callback = signer.card_event(tapped)
        else:
            callback = signer.text(args.user, args.text)
        failed = _post_callback(http, f"{gateway}/callback/{bot.id}", callback)
        if failed is not None:
            return failed
        pieces = _wait_for_reply(bot.api_base, args.user, since, args.timeout)
        cards = _cards_shown(http, bot.api_base, args.user, since)
    if not pieces and not cards:
        print(f"botgw sim: no reply within {args.timeout:.0f} s", file=sys.stderr)
        return 1
    print("".join(pieces))
    for card in cards:
        print(card)
    return 0


def _cards_shown(http: httpx.Client, api_base: str, user: str, since: float) -> list[str]:
    """The template cards the simulated WeCom showed `user` since `since`, one line each, with how to tap."""
    try:
        shown = http.get(f"{api_base}/__sim__/wecom/cards", params={"touser": user}).json()
    except (httpx.HTTPError, ValueError):
        return []
    lines = []
    for card in shown:
        if card.get("at", 0) < since:
            continue
        title = (card["card"].get("main_title") or {}).get("title", "")
        labels = [str(button.get("text", "")) for button in card["card"].get("button_list", [])]
        lines.append(f"[卡片 card] {title} [{' | '.join(labels)}]  (tap: --tap {labels[0] if labels else 'LABEL'})")
    return lines


def _card_tap(http: httpx.Client, bot: WeComAppConfig, user: str, label: str) -> dict[str, str] | int:
    """The event WeCom sends for `user`'s tap on the button `label` of the last card they were shown, from the
    simulator (which refuses a button of no card they got); an exit status when there is none."""
    api_base, agent_id = bot.api_base, bot.agent_id
    try:
        shown = http.get(f"{api_base}/__sim__/wecom/cards", params={"touser": user}).json()
        buttons = [button for button in (shown[-1]["card"].get("button_list", []) if shown else [])
                   if button.get("text") == label]
        if not buttons:
            print(f"botgw sim: {user} was shown no card with a button {label!r}", file=sys.stderr)
            return 1
        tapped = http.post(f"{api_base}/__sim__/wecom/tap",
                           json={"user": user, "key": buttons[0]["key"], "agentid": agent_id})
        tapped.raise_for_status()
        return dict(tapped.json()["event"])
    except (httpx.HTTPError, ValueError, KeyError) as exc:
        print(f"botgw sim: the simulator at {api_base} took no tap ({type(exc).__name__})", file=sys.stderr)
        return 3


def wecom_ai(args: argparse.Namespace) -> int:

    from bots.wecom.config import WeComAIBotConfig
    from simulator.wecom.ai_user import WeComAIBotUser

    bot = _chosen_bot(args, "wecom-ai", WeComAIBotConfig)
    if bot is None:
        return 2
    # Doc 100719: text, image, mixed (text and pictures), voice (only WeCom's recognition of it) and file messages;
    # a quote on text and mixed ones.
    refused = ("send one of --image, --voice, --file" if sum(map(bool, (args.image, args.voice, args.file))) > 1
               else "--voice: WeCom sends the AI bot only its recognition: give it as the text" if args.voice
               and not args.text else "--file: a file message carries no text" if args.file and args.text
               else "--quote: only text (and text with a picture) messages quote" if args.quote
               and (args.voice or args.file or (args.image and not args.text)) else "")
    if refused:
        print(f"botgw sim wecom-ai: {refused}", file=sys.stderr)
        return 2
    attachment = args.image or args.file
    data = _read_attachment("wecom-ai", attachment)
    if data is None:
        return 2
    gateways = args.gateway or [os.environ.get("BOTGW_GATEWAY_URL", DEFAULT_GATEWAY_URL)]

    async def show(text: str) -> None:
        print(f"\r\033[K{text[-200:]}", end="", flush=True, file=sys.stderr)

    async def main() -> int:
        async with httpx.AsyncClient(timeout=10) as http:
            user = WeComAIBotUser(bot, gateways, args.simulator, http)
            content = (await user.image_content(data, args.text) if args.image else
                       await user.file_content(data) if args.file else
                       user.voice_content(args.text) if args.voice else None)
            view = await user.ask(args.user, args.text, interval_s=args.interval, on_update=show, content=content,
                                  quote=args.quote or "")
        print(file=sys.stderr)
        print(view.text)
        print(f"[{len(view.shown)} states, finished={view.finished}]", file=sys.stderr)
        return 0 if view.finished else 1

    return asyncio.run(main())


def dingtalk(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bots.dingtalk.config import DingTalkBotConfig
    from simulator.dingtalk.user import DingTalkUser
    from simulator.replies import wait_until_quiet

    bot = _chosen_bot(args, "dingtalk", DingTalkBotConfig)
    if bot is None:
        return 2

    async def main() -> int:
        async with httpx.AsyncClient(timeout=10) as http:
            user = DingTalkUser(bot, args.gateway, args.simulator, http)
            attached = {name: Path(getattr(args, name)) if getattr(args, name) else None
                        for name in ("image", "voice", "file")}  # fmt: skip
            try:
                composed = await user.compose(args.text, quote=args.quote, **attached)
            except OSError as exc:
                print(f"botgw sim dingtalk: {exc}", file=sys.stderr)
                return 2
            sent = [await user.send(args.user, args.text, group=args.group or "", message=m) for m in composed]
            payload = sent[0]  # replies since the first one are shown

            async def mine() -> list[dict]:
                """The robot's replies in this conversation since the message was written."""
                replies = await user.replies(payload["conversationId"])
                return [reply for reply in replies if reply["at"] * 1000 >= payload["createAt"]]

            seen = await wait_until_quiet(mine, args.timeout, at_least=len(sent))
        if not seen:
            print(f"botgw sim: no reply within {args.timeout:.0f} s", file=sys.stderr)
            return 1
        for reply in seen:
            mention = f"@{','.join(reply['at_user_ids'])} " if reply["at_user_ids"] else ""
            print(f"[{reply['via']}] {mention}{reply['content']}")
        return 0

    return asyncio.run(main())


def wecom_kf(args: argparse.Namespace) -> int:
    """A WeChat customer writes to a 微信客服 account: the simulator logs it, the gateway gets the signed "pull"
    callback, and the answer is whatever the simulated Kefu API delivered to the customer.

    Silence is the right answer while a human or the queue for one holds the session (state 2 or 3): that is
    reported as such, exit 0. When the session was already theirs before the customer wrote, the bot cannot answer
    (send_msg is refused in 2 and 3, and the customer's message does not move the session), so the command stops
    once botgw has pulled the message instead of waiting out --timeout."""
    from bots.wecom_kf.config import WeComKfConfig
    from simulator.replies import kf_sent, wait_until_quiet
    from simulator.wecom_kf.signer import WeComKfCallbackSigner

    bot = _chosen_bot(args, "wecom-kf", WeComKfConfig)
    if bot is None:
        return 2
    if args.quote is not None:  # a sync_msg item has no quoted-message field (bots/wecom_kf/models.py)
        print("botgw sim wecom-kf: --quote: a 微信客服 message cannot quote", file=sys.stderr)
        return 2
    # Each attachment is a message of its own (a sync_msg item is one type), sent before the text, as a customer
    # sends a photo and then asks about it.
    attachments = [(kind, path) for kind, path in (("image", args.image), ("voice", args.voice),
                                                  ("file", args.file)) if path]  # fmt: skip
    uploads = [(kind, path, _read_attachment("wecom-kf", path)) for kind, path in attachments]
    if any(data is None for _, _, data in uploads):
        return 2
    if not uploads and not args.text:
        print("botgw sim wecom-kf: nothing to send (a text, or --image/--voice/--file)", file=sys.stderr)
        return 2
    gateway, simulator = args.gateway.rstrip("/"), bot.api_base
    with httpx.Client(timeout=10) as http:
        try:
            open_kfid = args.open_kfid or (bot.open_kfids or [None])[0]
            if not open_kfid:
                accounts = http.get(f"{simulator}/__sim__/kf/accounts", params={"corp_id": bot.corp_id}).json()
                if not accounts:
                    print(f"botgw sim: the simulator at {simulator} has no account for {bot.corp_id}", file=sys.stderr)
                    return 2
                open_kfid = accounts[0]["open_kfid"]
            state_before = kf_state(http, simulator, open_kfid, args.customer)
            since = time.time()
            messages: list[dict] = []
            for kind, path, data in uploads:  # the customer's WeChat uploads the media; the message names it
                import mimetypes

                mime = mimetypes.guess_type(path)[0] or "application/octet-stream"
                params = {"name": os.path.basename(path), "mime": mime}
                uploaded = http.post(f"{simulator}/__sim__/kf/media", params=params, content=data)
                if uploaded.status_code != 200:
                    print(f"botgw sim: simulator answered {uploaded.status_code}: {uploaded.text}", file=sys.stderr)
                    return 1
                messages.append({"msgtype": kind, "media_id": uploaded.json()["media_id"]})
            if args.text:
                messages.append({"text": args.text})
            wrote = []
            for message in messages:
                body = {"open_kfid": open_kfid, "external_userid": args.customer, **message}
                wrote.append(http.post(f"{simulator}/__sim__/kf/customer", json=body))
                if wrote[-1].status_code != 200:
                    print(f"botgw sim: simulator answered {wrote[-1].status_code}: {wrote[-1].text}", file=sys.stderr)
                    return 1
        except httpx.HTTPError as exc:
            print(f"botgw sim: the simulator at {simulator} is not reachable ({type(exc).__name__})", file=sys.stderr)
            return 3
        for answer in wrote:  # WeCom calls back for each message
            callback = WeComKfCallbackSigner(bot).kf_msg_or_event(answer.json()["token"], open_kfid)
            failed = _post_callback(http, f"{gateway}/callback/{bot.id}", callback)
            if failed is not None:
                return failed
        held_by_human = state_before in HUMAN_KF_STATES
        written = [str(msgid) for answer in wrote for msgid in answer.json().get("msgids", [])]
        pulled_at = 0.0

        def left_to_a_human(seen: list[dict]) -> bool:
            """Nothing will come: a human holds the session and botgw pulled the message a moment ago."""
            nonlocal pulled_at
            if not held_by_human or seen:
                return False
            if not pulled_at and kf_pulled(http, simulator, written):
                pulled_at = time.monotonic()
            return bool(pulled_at) and time.monotonic() - pulled_at > 1.0  # a moment for anything botgw might send

        async def wait() -> list[dict]:
            async with httpx.AsyncClient(timeout=10) as replies_http:

                async def mine() -> list[dict]:
                    sent = await kf_sent(replies_http, simulator, args.customer, since)
                    return [item for item in sent if item["open_kfid"] == open_kfid]

                return await wait_until_quiet(mine, args.timeout, done_early=left_to_a_human)

        seen = asyncio.run(wait())
        state_after = kf_state(http, simulator, open_kfid, args.customer) if not seen else None
    if not seen and state_after in HUMAN_KF_STATES:
        print("no answer (the session is with a human)")
        who = "waiting in the queue for an agent" if state_after == 2 else "held by a human agent"
        print(f"[service_state {state_after}: {who}; the bot stays quiet]", file=sys.stderr)
        return 0
    if not seen:
        print(f"botgw sim: no answer to {args.customer} within {args.timeout:.0f} s", file=sys.stderr)
        return 1
    for item in seen:
        print(f"[{item['via']}] {item['content']}")
    return 0


def kf_state(http: httpx.Client, simulator: str, open_kfid: str, customer: str) -> int | None:
    """The customer's session state as the simulated platform holds it (its control route, not the Kefu API); None
    when the simulator cannot say (an older one without the route): the command then just waits for an answer."""
    params = {"open_kfid": open_kfid, "external_userid": customer}
    answer = http.get(f"{simulator}/__sim__/kf/session", params=params)
    try:
        return int(answer.json()["service_state"]) if answer.status_code == 200 else None
    except (ValueError, KeyError, TypeError):
        return None


def kf_pulled(http: httpx.Client, simulator: str, msgids: list[str]) -> bool:
    """Whether botgw has pulled (kf/sync_msg) every one of the customer's messages. Unknown reads as not yet: a
    simulator reset since (the message is gone from its log) or an older one (no such route) answers 404, and the
    command then waits out --timeout as it would for an answer."""
    if not msgids:
        return False
    for msgid in msgids:
        answer = http.get(f"{simulator}/__sim__/kf/pulled", params={"msgid": msgid})
        try:
            if answer.status_code != 200 or answer.json().get("pulled") is not True:
                return False
        except (ValueError, AttributeError):
            return False
    return True


def _post_callback(http: httpx.Client, url: str, callback) -> int | None:  # type: ignore[no-untyped-def]
    """POST a signed callback as the platform would; None when acknowledged, else the exit status (said why)."""
    try:
        ack = http.post(url, params=callback.params, content=callback.body)
    except httpx.HTTPError as exc:
        print(f"botgw sim: the gateway at {url} is not reachable ({type(exc).__name__})", file=sys.stderr)
        return 3
    if ack.status_code != 200:
        print(f"botgw sim: gateway answered {ack.status_code}: {ack.text}", file=sys.stderr)
        return 1
    print(f"[ack {ack.status_code} in {ack.elapsed.total_seconds() * 1000:.1f} ms]", file=sys.stderr)
    return None


def _wait_for_reply(api_base: str, user: str, since: float, timeout: float) -> list[str]:
    """What the simulated WeCom delivered to `user`, once nothing new came for 1 s."""
    from simulator.replies import wait_until_quiet, wecom_messages

    async def wait() -> list[dict]:
        async with httpx.AsyncClient(timeout=10) as http:
            return await wait_until_quiet(lambda: wecom_messages(http, api_base, user, since), timeout)

    return [item["content"] for item in asyncio.run(wait())]
