"""Who may come in through the web page, and what the page may make a browser fetch (issue 19), against running
processes: two page processes (`botgw web`) on one gateway and worker with a stub engine, Chromium for what a
browser does. Page "web" trusts proxies in 10.0.0.0/8 only (so nothing on loopback); page "proxied" trusts
127.0.0.1 and wants the proxy's secret."""

from __future__ import annotations

import asyncio
import base64
import secrets
import select
import socket
import statistics
import threading
import time
from collections.abc import Iterator
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest

from bots.parts import DEFAULT_MAX_MEDIA_BYTES
from bots.web.config import WebBotConfig, hash_password
from testkit.browser import chromium_browser
from testkit.configs import stack_config, write_config
from testkit.processes import BOTGW, Proc, free_port, wait_http
from testkit.services import start_gateway, start_worker
from testkit.stacks import start_stub_engine

PASSWORD = "correct horse battery staple"
PROXY_SECRET = "proxy-secret-0123456789abcdef"
USER_HEADER = "X-Forwarded-User"
SECRET_HEADER = "X-Botgw-Proxy-Secret"
BURST = 8
TIMED = 7  # sign-ins timed per kind of name


@dataclass
class Pages:
    web: str  # trusted_proxies: 10.0.0.0/8
    proxied: str  # trusted_proxies: 127.0.0.1/32, with a secret
    web_root: Path
    config: dict = field(default_factory=dict)
    web_pid: int = 0


def web_bot(bot_id: str, gateway_url: str, users: list[dict], **extra: object) -> dict:
    return {"id": bot_id, "platform": "web", "api_key": f"key-{bot_id}-0123456789abcdef", "gateway_url": gateway_url,
            "trusted_header": USER_HEADER, "users": users, **extra}


@pytest.fixture(scope="module")
def pages(redis_url: str, log_dir: Path) -> Iterator[Pages]:
    engine, engine_url = start_stub_engine(log_dir, 0.05, "guard-engine", chunk_delay_s=0.15)
    gateway_port, web_port, proxied_port = free_port(), free_port(), free_port()
    gateway_url = f"http://127.0.0.1:{gateway_port}"
    hashed = hash_password(PASSWORD)
    users = [
        {"name": "alice", "password": PASSWORD},  # plain, from the environment in real life
        {"name": "carol", "password_hash": hashed},
        {"name": "dave", "password_hash": hashed},
        {"name": "erin", "password": PASSWORD},  # the browser tests' (the others spend their names' limits)
        {"name": "racer", "password_hash": hashed},  # the concurrent burst's
        *({"name": f"burst{i}", "password_hash": hashed} for i in range(BURST)),
        *({"name": f"hashed{i}", "password_hash": hashed} for i in range(TIMED)),
        *({"name": f"plain{i}", "password": PASSWORD} for i in range(TIMED)),
    ]
    bots = [
        web_bot("web", gateway_url, users, trusted_proxies=["10.0.0.0/8"],
                login_guard={"per_name": "5/minute", "per_address": "1000/minute"}),
        web_bot("proxied", gateway_url, [{"name": "alice", "password_hash": hashed}],
                trusted_proxies=["127.0.0.1/32"], trusted_header_secret=PROXY_SECRET,
                login_guard={"per_name": "50/minute", "per_address": "3/minute"}),
    ]
    namespace = "g" + secrets.token_hex(4)
    config = stack_config(redis_url, engine_url, "http://127.0.0.1:9", namespace, bots=bots)
    path = write_config(log_dir / f"guard-{namespace}.yaml", config)
    procs = [engine, start_gateway(path, gateway_port, log_dir, f"gw-{namespace}"),
             start_worker(path, log_dir, f"worker-{namespace}")]
    web_root = log_dir / "guard-chainlit-web"
    for bot, port, root in (("web", web_port, web_root), ("proxied", proxied_port, log_dir / "guard-chainlit-px")):
        procs.append(Proc([*BOTGW, "web", "--config", str(path), "--bot", bot, "--port", str(port),
                           "--app-root", str(root)], log_dir / f"guard-{bot}.log"))
    try:
        for proc, port in ((procs[-2], web_port), (procs[-1], proxied_port)):
            wait_http(f"http://127.0.0.1:{port}/health", 120, proc)
        wait_http(f"{gateway_url}/healthz", 60, procs[1])
        yield Pages(f"http://127.0.0.1:{web_port}", f"http://127.0.0.1:{proxied_port}", web_root, config,
                    procs[-2].pid)
    finally:
        for proc in procs:
            proc.stop()


@pytest.fixture(scope="module")
def chromium() -> Iterator[object]:
    with chromium_browser() as browser:
        yield browser


def header_sign_in(page: str, headers: dict[str, str]) -> httpx.Response:
    return httpx.post(f"{page}/auth/header", headers=headers, timeout=10)


def login(page: str, name: str, password: str) -> httpx.Response:
    return httpx.post(f"{page}/login", files={"username": (None, name), "password": (None, password)}, timeout=30)


# trusted_header only from the proxy


def test_trusted_header_only_from_the_proxy_with_its_secret(pages: Pages) -> None:
    forged = {USER_HEADER: "alice"}
    assert header_sign_in(pages.web, forged).status_code == 401, "any client signed in as anyone"
    assert header_sign_in(pages.web, {**forged, "X-Forwarded-For": "10.1.2.3"}).status_code == 401, (
        "a forwarded address decided trust"
    )
    assert header_sign_in(pages.web, {**forged, SECRET_HEADER: PROXY_SECRET}).status_code == 401

    signed = header_sign_in(pages.proxied, {**forged, SECRET_HEADER: PROXY_SECRET})
    assert signed.status_code == 200, signed.text
    me = httpx.get(f"{pages.proxied}/user", cookies=signed.cookies, timeout=10).json()
    assert me["identifier"] == "alice" and me["metadata"] == {"login": "header", "name": "alice"}
    assert header_sign_in(pages.proxied, {**forged, SECRET_HEADER: "wrong"}).status_code == 401, "a wrong secret"
    assert header_sign_in(pages.proxied, forged).status_code == 401, "no secret"
    assert header_sign_in(pages.proxied, {USER_HEADER: "mallory", SECRET_HEADER: PROXY_SECRET}).status_code == 401, (
        "a name that is not a listed user"
    )


def test_the_trusted_header_sent_twice_is_not_believed(pages: Pages) -> None:
    """A proxy that appends to the header rather than setting it passes the client's value on too: with two values
    the first won (the client's, with a proxy that appends); now neither is believed, as for a doubled secret."""
    twice = httpx.Headers([(USER_HEADER, "alice"), (USER_HEADER, "carol"), (SECRET_HEADER, PROXY_SECRET)])
    assert header_sign_in(pages.proxied, twice).status_code == 401, "the header sent twice was believed"  # type: ignore[arg-type]
    assert header_sign_in(pages.proxied, {USER_HEADER: "alice", SECRET_HEADER: PROXY_SECRET}).status_code == 200


def test_proxies_are_the_same_whether_written_ipv4_or_ipv4_mapped() -> None:
    proxies = ["10.0.0.5/32", "::ffff:192.168.1.0/120"]
    bot = WebBotConfig.model_validate(web_bot("w", "http://gw", [], trusted_proxies=proxies))
    for address in ("10.0.0.5", "::ffff:10.0.0.5", "::ffff:a00:5", "192.168.1.9", "::ffff:192.168.1.9"):
        assert bot.trusts_proxy(address), address
    for address in ("10.0.0.6", "::ffff:10.0.0.6", "::10.0.0.5", "192.168.2.1", "::ffff:192.168.2.1", "x", ""):
        assert not bot.trusts_proxy(address), address


def test_the_guard_with_either_config() -> None:
    """The middleware and the header check in process, for what the two pages above do not configure:
    `allow_unlisted`, a chain of proxies, and the headers Chainlit's app is left with."""
    from starlette.datastructures import Headers

    from webchat.guard import FACTS, UPLOAD_SLACK_BYTES, PageGuard, header_user

    seen: list[dict] = []

    async def chainlit_stand_in(scope: dict, receive: object, send: object) -> None:
        headers = Headers(scope=scope)
        seen.append({"client": scope["client"][0], "user": header_user(bot, headers),
                     "secret": headers.get(SECRET_HEADER), "address": FACTS.get().address})  # type: ignore[union-attr]
        await send({"type": "http.response.start", "status": 200, "headers": []})  # type: ignore[operator]
        await send({"type": "http.response.body", "body": b"ok"})  # type: ignore[operator]

    async def ask(peer: str, headers: dict[str, str]) -> tuple[dict, httpx.Response]:
        transport = httpx.ASGITransport(PageGuard(chainlit_stand_in, bot, "img-src 'self' data:"), client=(peer, 1))
        async with httpx.AsyncClient(transport=transport, base_url="http://page") as client:
            response = await client.post("/auth/header", headers=headers)
        return seen[-1], response

    for allow_unlisted in (False, True):
        bot = WebBotConfig.model_validate(web_bot("w", "http://gw", [{"name": "alice", "password": PASSWORD}],
                                                  trusted_proxies=["10.0.0.0/8", "192.168.1.1"],
                                                  allow_unlisted=allow_unlisted, trusted_header_secret=PROXY_SECRET))
        request = {USER_HEADER: "bob", SECRET_HEADER: PROXY_SECRET, "X-Forwarded-For": "203.0.113.7, 10.0.0.2"}
        facts, response = asyncio.run(ask("192.168.1.1", request))
        assert facts == {"client": "203.0.113.7", "user": "bob" if allow_unlisted else None, "secret": None,
                         "address": "203.0.113.7"}
        assert response.headers["content-security-policy"] == "img-src 'self' data:"
        facts, _ = asyncio.run(ask("192.168.1.2", {**request, USER_HEADER: "alice"}))
        assert facts == {"client": "192.168.1.2", "user": None, "secret": None, "address": "192.168.1.2"}
        facts, _ = asyncio.run(ask("10.9.9.9", {**request, USER_HEADER: "alice"}))
        assert facts["user"] == "alice"
        facts, _ = asyncio.run(ask("10.9.9.9", {**request, USER_HEADER: "al:ice"}))
        assert facts["user"] is None, "a name no page user could have"
        facts, _ = asyncio.run(ask("10.9.9.9", {**request, USER_HEADER: "alice\n"}))
        assert facts["user"] is None, "a name with a trailing newline ($ matches before it)"
        facts, _ = asyncio.run(ask("::ffff:10.9.9.9", {**request, USER_HEADER: "alice"}))
        assert facts["user"] == "alice", "a trusted proxy seen through a dual-stack socket"
        small = bot.model_copy(update={"max_media_bytes": 4096})
        assert asyncio.run(_upload(PageGuard(chainlit_stand_in, small, ""), 4096)).status_code == 200
        over = asyncio.run(_upload(PageGuard(chainlit_stand_in, small, ""), 4096 + UPLOAD_SLACK_BYTES))
        assert over.status_code == 413, "an upload past max_media_bytes and its envelope reached Chainlit"


def test_a_header_without_trusted_proxies_is_warned_about(caplog: pytest.LogCaptureFixture) -> None:
    from webchat.serve import warn_about

    bot = web_bot("w", "http://gw", [], trusted_header_secret=PROXY_SECRET)
    warn_about(WebBotConfig.model_validate(bot))
    assert [record.levelname for record in caplog.records] == ["WARNING"]
    assert "trusted_proxies is empty" in caplog.text and PROXY_SECRET not in caplog.text
    caplog.clear()
    warn_about(WebBotConfig.model_validate({**bot, "trusted_proxies": ["10.0.0.1"]}))
    assert not caplog.records


async def _upload(app: object, size: int) -> httpx.Response:
    async with httpx.AsyncClient(transport=httpx.ASGITransport(app), base_url="http://page") as client:  # type: ignore[arg-type]
        return await client.post("/project/file?session_id=x", files={"file": ("a.txt", b"x" * size)})


# Login


def health_latencies(page: str, stop: threading.Event) -> list[float]:
    times: list[float] = []
    with httpx.Client(timeout=10) as client:
        while not stop.is_set():
            started = time.perf_counter()
            client.get(f"{page}/health")
            times.append(time.perf_counter() - started)
            time.sleep(0.005)
    return times


def test_a_burst_of_wrong_passwords_does_not_freeze_the_page(pages: Pages) -> None:
    """Eight concurrent wrong passwords for hashed users, twice over, while another client asks the page for
    /health: scrypt on the event loop held that client up for about 400 ms; off the loop it is not held up."""
    baseline = statistics.median(health_latencies_for(pages.web, 0.5))
    stop = threading.Event()
    with ThreadPoolExecutor(BURST + 1) as pool:
        watcher = pool.submit(health_latencies, pages.web, stop)
        time.sleep(0.1)
        for _ in range(2):
            codes = list(pool.map(lambda i: login(pages.web, f"burst{i}", "wrong").status_code, range(BURST)))
            assert codes == [401] * BURST
        stop.set()
        during = watcher.result()
    worst = max(during)
    print(f"\n/health during {2 * BURST} wrong sign-ins: worst {worst * 1000:.0f} ms, median "
          f"{statistics.median(during) * 1000:.1f} ms ({len(during)} requests); before: {baseline * 1000:.1f} ms")
    # On the loop, each scrypt held every client up for about 400 ms (16 of them: seconds). Off it, the two
    # hashing threads still take both cores of a 2-core CI machine: up to 164 ms was seen there, so the bound
    # is 250 ms, which the on-loop regression exceeds at its first hash.
    assert worst < 0.25, f"the page stalled {worst * 1000:.0f} ms for everyone during the burst"


def health_latencies_for(page: str, seconds: float) -> list[float]:
    stop = threading.Event()
    threading.Timer(seconds, stop.set).start()
    return health_latencies(page, stop)


def test_failed_sign_ins_are_limited_with_a_clear_message(pages: Pages, chromium: object) -> None:
    for _ in range(5):  # per_name: 5/minute
        assert login(pages.web, "dave", "wrong").status_code == 401
    refused = login(pages.web, "dave", PASSWORD)  # even the right password: the name must wait
    assert refused.status_code == 429
    assert "Too many failed sign-ins" in refused.json()["detail"] and int(refused.headers["retry-after"]) > 0
    assert login(pages.web, "carol", PASSWORD).status_code == 200, "another name was refused too"

    for name in ("x1", "x2", "x3"):  # per_address on the other page: 3/minute, whatever the names
        assert login(pages.proxied, name, "wrong").status_code == 401
    assert login(pages.proxied, "alice", PASSWORD).status_code == 429

    page = chromium.new_page(locale="en-US")  # type: ignore[attr-defined]
    page.goto(pages.web, wait_until="networkidle")
    page.fill("input:not([type=password])", "dave")
    page.fill("input[type=password]", "wrong again")
    page.click("button:has-text('Sign In')")
    page.wait_for_selector("text=Too many failed sign-ins", timeout=10000)
    page.close()


def test_unknown_and_known_names_take_the_same_time(pages: Pages) -> None:
    def timed(name: str) -> float:
        started = time.perf_counter()
        assert login(pages.web, name, "wrong").status_code == 401
        return time.perf_counter() - started

    samples: dict[str, list[float]] = {"hashed": [], "plain": [], "unknown": []}
    kinds = list(samples)
    for i in range(TIMED):  # interleaved and rotated, so that a busy moment of the machine falls on all alike
        for kind in kinds[i % 3 :] + kinds[: i % 3]:
            samples[kind].append(timed(f"{'nobody' if kind == 'unknown' else kind}{i}"))
    medians = {kind: statistics.median(times) for kind, times in samples.items()}
    print("\nsign-in medians: " + ", ".join(f"{kind} {value * 1000:.1f} ms" for kind, value in medians.items()))
    for kind in ("plain", "unknown"):
        assert abs(medians[kind] - medians["hashed"]) < 0.3 * medians["hashed"], medians


# Uploads


def test_uploads_are_bounded(pages: Pages, chromium: object) -> None:
    """The attach button is on (issue 23), for the types the gateway reads and up to the bot's max_media_bytes:
    a file past that is refused by the guard before Chainlit spools it, another type by Chainlit's check."""
    context = chromium.new_context()  # type: ignore[attr-defined]
    page = context.new_page()
    sessions: list[str] = []
    # socket.io's connect packet carries the session id, over HTTP polling or the websocket
    page.on("request", lambda request: sessions.append(request.post_data or ""))
    page.on("websocket", lambda ws: ws.on("framesent", lambda frame: sessions.append(str(frame))))
    sign_in(page, pages.web, "erin")
    session_id = next(text.split('"sessionId":"')[1].split('"')[0] for text in sessions if '"sessionId":"' in text)
    url = f"{pages.web}/project/file?session_id={session_id}"
    files = pages.web_root / ".files"
    too_large = {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"x" * (DEFAULT_MAX_MEDIA_BYTES + 70_000)}
    response = page.request.post(url, multipart={"file": too_large})
    assert response.status == 413, f"an oversized upload was taken: {response.status} {response.text()}"
    assert not any(path.is_file() for path in files.rglob("*"))
    program = {"name": "tool.exe", "mimeType": "application/x-msdownload", "buffer": b"MZ" + b"x" * 100}
    assert page.request.post(url, multipart={"file": program}).status == 400
    assert not any(path.is_file() for path in files.rglob("*"))
    notes = {"name": "notes.txt", "mimeType": "text/plain", "buffer": b"x" * 4096}
    assert page.request.post(url, multipart={"file": notes}).status == 200
    settings = page.request.get(f"{pages.web}/project/settings?language=en-US").json()
    offered = settings["features"]["spontaneous_file_upload"]
    assert offered["enabled"] is True and offered["max_size_mb"] == 10 and "image/png" in offered["accept"]
    context.close()


# No remote content


class Listener:
    """A TCP server on another port standing in for the attacker: it counts whoever connects."""

    def __init__(self) -> None:
        self.port = free_port()
        self.connections = 0
        self._server = socket.create_server(("127.0.0.1", self.port))
        self._server.settimeout(0.2)
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._serve, daemon=True)
        self._thread.start()

    def _serve(self) -> None:
        while not self._stop.is_set():
            try:
                conn, _ = self._server.accept()
            except TimeoutError:
                continue
            self.connections += 1
            conn.close()

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self._server.close()


def sign_in(page: object, url: str, name: str) -> None:
    """The page sends a visitor with no session to /login itself, a navigation in the browser that can come after
    "networkidle" on a busy machine: a page already at `url` waits for it instead of navigating over it."""
    if not page.url.startswith(url.rstrip("/") + "/"):  # type: ignore[attr-defined]
        page.goto(url)  # type: ignore[attr-defined]
    page.wait_for_url("**/login**", timeout=30000)  # type: ignore[attr-defined]
    page.fill("input:not([type=password])", name)  # type: ignore[attr-defined]
    page.fill("input[type=password]", PASSWORD)  # type: ignore[attr-defined]
    page.click("button:has-text('Sign In')")  # type: ignore[attr-defined]
    page.wait_for_selector("text=/reset", timeout=30000)  # type: ignore[attr-defined]  (the chat has started)


def test_an_answer_with_a_remote_image_fetches_nothing(pages: Pages, chromium: object) -> None:
    listener = Listener()
    try:
        page = chromium.new_page()  # type: ignore[attr-defined]
        violations: list[str] = []
        page.on("console", lambda message: violations.append(message.text)
                if "Content Security Policy" in message.text and "127.0.0.1:" + str(listener.port) not in message.text
                else None)
        response = page.goto(pages.web, wait_until="networkidle")
        sign_in(page, pages.web, "erin")
        remote = f"http://127.0.0.1:{listener.port}"
        # The stub engine answers "answer to: <the message>", streamed in pieces that cut the image in two. Filled,
        # not typed key by key: a "/" typed in the box can open the page's command menu.
        page.fill("#chat-input", f"see ![chart]({remote}/md.png?q=secret) and <img src=\"{remote}/html.png\"> ok")
        page.press("#chat-input", "Enter")
        page.wait_for_selector("[data-step-type=assistant_message] >> text=answer to:", timeout=30000)
        page.wait_for_timeout(2500)
        images = page.eval_on_selector_all(
            "[data-step-type=assistant_message] img", "els => els.map(e => e.getAttribute('src'))")
        links = page.eval_on_selector_all(
            "[data-step-type=assistant_message] a", "els => els.map(e => e.getAttribute('href'))")
        assert listener.connections == 0, f"the browser fetched from the attacker's port {listener.connections} time(s)"
        assert not [src for src in images if src and remote in src], images
        assert f"{remote}/md.png?q=secret" in links, "the image should be shown as a link"
        csp = response.headers.get("content-security-policy", "")
        assert "img-src 'self' data:" in csp and "connect-src 'self'" in csp, f"the page's policy: {csp!r}"
        assert httpx.get(f"{pages.web}/health", timeout=5).headers["content-security-policy"] == csp
        assert not violations, f"the page itself broke its policy: {violations}"
        page.close()
    finally:
        listener.close()


def test_images_from_elsewhere_become_links() -> None:
    """The rewrite the answers and the sources box go through, including answers streamed in pieces."""
    from webchat.markdown import ImageLinks, images_as_links

    assert images_as_links("a ![x](https://evil/p.png?q=1) b") == "a [x](https://evil/p.png?q=1) b"
    assert images_as_links("![x](/public/logo.png) ![d](data:image/png;base64,AA)") == (
        "![x](/public/logo.png) ![d](data:image/png;base64,AA)"
    )
    for hostile in ("![x](//evil/p)", "![x](/\\evil/p)", "![x](/&#47;evil)", "![x][ref]", "!![x](http://e)",
                    "![x](<http://e>)", "[![x](http://e)](http://l)", "![x](\nhttp://e)"):
        assert "![" not in images_as_links(hostile), hostile
    assert images_as_links("![](http://e)") == "[image](http://e)"
    assert images_as_links("wow! really!") == "wow! really!"
    text = "one ![a](https://evil/x.png) two ![b](/public/y.png) three!"
    for size in range(1, 12):
        stream = ImageLinks()
        shown = ""
        for start in range(0, len(text), size):
            shown += stream.feed(text[start : start + size])
            assert "![a" not in shown
        assert shown + stream.flush() == images_as_links(text)


def test_the_page_refuses_an_oversized_request_head_unread(pages: Pages) -> None:
    """The page's uvicorn has the gateway's head bound: 431 for a 1 MB header, a 60 KB one still served."""
    from tests.e2e.general.test_request_bounds import exchange, port_of, status_of

    port = port_of(pages.web)
    big = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * (1 << 20) + b"\r\nConnection: close\r\n\r\n"
    assert status_of(exchange(port, big)) == 431
    fine = b"GET /health HTTP/1.1\r\nHost: x\r\nX-Big: " + b"a" * 60_000 + b"\r\nConnection: close\r\n\r\n"
    assert status_of(exchange(port, fine)) == 200


def test_a_userid_with_a_trailing_newline_is_refused() -> None:
    from webchat.sso import LoginRefused, checked_userid

    assert checked_userid("wecom", "zhang.san") == "zhang.san"
    with pytest.raises(LoginRefused):
        checked_userid("wecom", "zhang.san\n")


# Login limits under concurrency


def at_once(count: int, call: object) -> list[httpx.Response]:
    """`count` calls of `call(i)` released together from their own threads."""
    barrier = threading.Barrier(count)

    def one(i: int) -> httpx.Response:
        barrier.wait()
        return call(i)  # type: ignore[operator]

    with ThreadPoolExecutor(count) as pool:
        return list(pool.map(one, range(count)))


def test_a_concurrent_burst_for_one_name_gets_no_more_tries_than_the_limit(pages: Pages) -> None:
    """Twenty wrong passwords for one name at the same instant (per_name: 5/minute): the limits were tested before
    scrypt and counted after it, so all twenty were checked (and one right password among 40 got in); now each
    attempt reserves its place first, and those past the limit are answered 429 without scrypt."""
    started = time.perf_counter()
    codes = [response.status_code for response in at_once(20, lambda i: login(pages.web, "racer", f"wrong{i}"))]
    took = time.perf_counter() - started
    print(f"\n20 concurrent wrong passwords for one name: {codes.count(401)} x 401, {codes.count(429)} x 429 "
          f"in {took:.2f} s")
    assert codes.count(401) + codes.count(429) == 20, codes
    assert 1 <= codes.count(401) <= 5, f"{codes.count(401)} passwords checked for one name with 5/minute"
    assert login(pages.web, "racer", PASSWORD).status_code == 429, "the name is over its limit"


def test_sign_ins_waiting_for_scrypt_are_bounded(pages: Pages) -> None:
    """64 sign-ins of different names at once (each costs one scrypt, known name or not; per_address is 1000/minute
    on this page): those beyond 16 waiting for the two scrypt threads are answered 503 at once, not queued."""
    started = time.perf_counter()
    responses = at_once(64, lambda i: login(pages.web, f"flood{i}", "wrong"))
    took = time.perf_counter() - started
    codes = [response.status_code for response in responses]
    print(f"\n64 concurrent sign-ins: {codes.count(401)} x 401, {codes.count(503)} x 503 in {took:.2f} s")
    assert set(codes) <= {401, 503}, codes
    assert codes.count(503) > 0, "every sign-in was queued for scrypt"
    assert codes.count(401) >= 18, "fewer were checked than the pool and its queue hold"
    busy = next(response for response in responses if response.status_code == 503)
    assert "busy" in busy.json()["detail"] and int(busy.headers["retry-after"]) > 0


# The chat socket only from the page itself


def websocket_handshake(port: int, origin: str | None, cookie: str) -> int:
    head = (f"GET /ws/socket.io/?EIO=4&transport=websocket HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\n"
            "Upgrade: websocket\r\nConnection: Upgrade\r\nSec-WebSocket-Version: 13\r\n"
            f"Sec-WebSocket-Key: {base64.b64encode(secrets.token_bytes(16)).decode()}\r\nCookie: {cookie}\r\n"
            + (f"Origin: {origin}\r\n" if origin else "") + "\r\n")
    with socket.create_connection(("127.0.0.1", port), timeout=10) as sock:
        sock.sendall(head.encode())
        answer = b""
        while b"\r\n" not in answer:
            data = sock.recv(4096)
            if not data:
                break
            answer += data
    return int(answer.split(b" ", 2)[1])


def test_the_socket_is_refused_to_other_origins(pages: Pages) -> None:
    """Chainlit's socket.io server checks no Origin: a page elsewhere could open the chat socket with the user's
    cookie (a polling handshake and a websocket with Origin: https://evil.example were accepted)."""
    from tests.e2e.general.test_request_bounds import port_of

    signed = login(pages.web, "carol", PASSWORD)
    assert signed.status_code == 200, signed.text
    cookie = "; ".join(f"{name}={value}" for name, value in signed.cookies.items())
    port = port_of(pages.web)
    handshake = f"{pages.web}/ws/socket.io/?EIO=4&transport=polling"
    for origin in ("https://evil.example", "null", f"http://127.0.0.1:{port + 1}", f"https://127.0.0.1.evil:{port}"):
        polled = httpx.get(handshake, headers={"Origin": origin, "Cookie": cookie}, timeout=10)
        assert polled.status_code == 403, f"a polling handshake from {origin} was accepted: {polled.status_code}"
        assert websocket_handshake(port, origin, cookie) == 403, f"a websocket from {origin} was accepted"
    for origin in (f"http://127.0.0.1:{port}", None):
        polled = httpx.get(handshake, headers={"Cookie": cookie, **({"Origin": origin} if origin else {})}, timeout=10)
        assert polled.status_code == 200 and '"sid"' in polled.text, polled.text
        assert websocket_handshake(port, origin, cookie) == 101


def test_the_page_s_own_origins() -> None:
    from webchat.guard import own_origins

    assert own_origins("http", "chat.example.com", None) == {("http", "chat.example.com", 80),
                                                             ("https", "chat.example.com", 443)}
    assert own_origins("wss", "Chat.example.com:8443", "https://page.example/") == {
        ("https", "chat.example.com", 8443), ("https", "page.example", 443)}
    assert own_origins("https", "", None) == set()


# Bodies


def post_large(port: int, path: str, content_type: str, size: int, chunked: bool) -> bytes:
    """A POST of `size` bytes, announced or chunked, sent in 64 KiB writes until the page answers (or all is sent)."""
    framing = "Transfer-Encoding: chunked" if chunked else f"Content-Length: {size}"
    head = f"POST {path} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nContent-Type: {content_type}\r\n{framing}\r\n\r\n"
    block = b"a" * 65536
    with socket.create_connection(("127.0.0.1", port), timeout=30) as sock:
        sock.sendall(head.encode())
        sent = 0
        if content_type.startswith("multipart/"):  # a file part: spooled whole by the form parser, no part limit
            part = b'--x\r\nContent-Disposition: form-data; name="file"; filename="a.bin"\r\n\r\n'
            sock.sendall(b"%x\r\n%b\r\n" % (len(part), part) if chunked else part)
            sent = len(part)
        try:
            while sent < size:
                if select.select([sock], [], [], 0)[0]:
                    break  # answered
                sock.sendall(b"%x\r\n%b\r\n" % (len(block), block) if chunked else block)
                sent += len(block)
            if chunked and sent >= size:
                sock.sendall(b"0\r\n\r\n")
        except (BrokenPipeError, ConnectionResetError):
            pass
        from tests.e2e.general.test_request_bounds import read_all

        return read_all(sock)


def test_a_large_body_is_refused_413(pages: Pages) -> None:
    """50 MB to /login (multipart, spooled to /tmp by Chainlit's form parser) and to /project/action (JSON, held in
    memory before the 401: a 200 MB body took the page from 168 to 574 MB): 413, announced or chunked."""
    from tests.e2e.general.test_request_bounds import PeakRss, port_of, status_of

    port = port_of(pages.web)
    for path, content_type in (("/login", "multipart/form-data; boundary=x"), ("/project/action", "application/json")):
        for chunked in (False, True):
            peak = PeakRss(pages.web_pid)
            answer = post_large(port, path, content_type, 50 << 20, chunked)
            growth = peak.growth()
            print(f"\n50 MB {'chunked' if chunked else 'announced'} to {path}: {answer[:12]!r}, "
                  f"RSS +{growth:.1f} MB")
            assert status_of(answer) == 413, answer[:300]
            assert growth < 20, f"the page grew {growth:.0f} MB for a refused body"
    assert httpx.get(f"{pages.web}/health", timeout=10).status_code == 200
    assert login(pages.web, "erin", PASSWORD).status_code == 200, "a small body is still served"
