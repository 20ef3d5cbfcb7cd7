#!/usr/bin/env python3
"""The botgw image's health check (installed as /usr/local/bin/botgw-healthcheck; standard library only).

It looks at the command the container runs (PID 1's, or the one given) and checks what that command serves:
  serve            GET /healthz on the public port (--port, default 8080)
  web              GET / on the page's port (--port, default 8100)
  worker           GET /metrics on worker.metrics_port (BOTGW_WORKER__METRICS_PORT, else the --config file's
                   worker.metrics_port, else 9101 when the file cannot be read): the worker's process answers;
                   with no metrics port configured, that it is alive (this check runs beside it)
  dingtalk-stream  GET /metrics on --metrics-port when the command has one (the process answers; whether each
                   bot's WebSocket is open is botgw_dingtalk_stream_connected, which the alert watches); without
                   it, an established TCP connection to port 443 (DingTalk's Stream gateway)
  anything else    healthy (a one-off command such as `kb add`)
Exit 0 when healthy, 1 when not (Docker's HEALTHCHECK convention).
"""

from __future__ import annotations

import os
import sys
import urllib.request


def _argv() -> list[str]:
    if len(sys.argv) > 1:
        return sys.argv[1:]
    try:
        with open("/proc/1/cmdline", "rb") as handle:
            return [part.decode() for part in handle.read().split(b"\0") if part]
    except OSError:
        return []


def _option(argv: list[str], name: str, default: str) -> str:
    for index, token in enumerate(argv):
        if token == name and index + 1 < len(argv):
            return argv[index + 1]
        if token.startswith(name + "="):
            return token.split("=", 1)[1]
    return default


def _get(url: str) -> bool:
    try:
        with urllib.request.urlopen(url, timeout=4) as response:
            return 200 <= response.status < 400
    except OSError:
        return False


def _stream_connected() -> bool:
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as handle:
                rows = handle.read().splitlines()[1:]
        except OSError:
            continue
        for row in rows:
            fields = row.split()
            if len(fields) > 3 and fields[2].endswith(":01BB") and fields[3] == "01":  # remote :443, ESTABLISHED
                return True
    return False


def _worker_port(argv: list[str]) -> str:
    """The worker's metrics port: the environment's, else its config file's ("" when it sets none). Reading only
    the environment called a worker with another port in its file, or none, unhealthy for ever (found by a
    review). PyYAML is botgw's own dependency, in the image's Python; 9101 when the file cannot be read."""
    port = os.environ.get("BOTGW_WORKER__METRICS_PORT", "").strip()
    if port:
        return port
    try:
        import yaml

        with open(_option(argv, "--config", "botgw.yaml"), encoding="utf-8") as handle:
            settings = yaml.safe_load(handle)
    except Exception:  # no PyYAML, no file, or one it cannot parse (the worker itself refuses that at start)
        return "9101"
    worker = settings.get("worker") if isinstance(settings, dict) else None
    value = worker.get("metrics_port") if isinstance(worker, dict) else None
    if value is None:
        return ""
    text = str(value).strip()
    if text.startswith("${") and text.endswith("}"):  # as botgw reads it: from the environment
        text = os.environ.get(text[2:-1], "").strip()
    return text if text.isdigit() else "9101"


def main() -> int:
    argv = _argv()
    command = next((token for token in argv if token in ("serve", "web", "worker", "dingtalk-stream")), None)
    if command == "serve":
        ok = _get(f"http://127.0.0.1:{_option(argv, '--port', '8080')}/healthz")
    elif command == "web":
        ok = _get(f"http://127.0.0.1:{_option(argv, '--port', '8100')}/")
    elif command == "worker":
        port = _worker_port(argv)
        ok = _get(f"http://127.0.0.1:{port}/metrics") if port else True
    elif command == "dingtalk-stream":
        port = _option(argv, "--metrics-port", "")
        ok = _get(f"http://127.0.0.1:{port}/metrics") if port else _stream_connected()
    else:
        ok = True
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
