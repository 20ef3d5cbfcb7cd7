#!/usr/bin/env bash
# `make run`: the whole product on this machine, WeCom played by the simulator.
#   scripts/run_local.sh start | stop | status
# Ports: redis 6390, engine 8000, gateway 8080 (admin 8081), simulator 8090. Logs in .run/logs/.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG=${BOTGW_CONFIG:-deploy/local.yaml}
RUN=.run
LOGS=$RUN/logs
BOTGW=.venv/bin/botgw
mkdir -p "$LOGS"

start_bg() {  # name, command...
  local name=$1; shift
  if [ -f "$RUN/$name.pid" ] && kill -0 "$(cat "$RUN/$name.pid")" 2>/dev/null; then
    echo "  $name already running (pid $(cat "$RUN/$name.pid"))"; return
  fi
  setsid "$@" >"$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! >"$RUN/$name.pid"
  echo "  $name started (pid $!, log $LOGS/$name.log)"
}

wait_url() {  # url, seconds, name
  local deadline=$((SECONDS + $2))
  until curl -sf -o /dev/null "$1"; do
    if [ $SECONDS -ge $deadline ]; then echo "botgw: $3 did not come up; see $LOGS/$3.log" >&2; exit 1; fi
    sleep 1
  done
}

stop_all() {
  for name in web simulator dingtalk-stream worker gateway engine redis; do
    if [ -f "$RUN/$name.pid" ]; then
      pid=$(cat "$RUN/$name.pid")
      kill -TERM -- "-$pid" 2>/dev/null || kill -TERM "$pid" 2>/dev/null || true
      rm -f "$RUN/$name.pid"
      echo "  $name stopped"
    fi
  done
}

case "${1:-start}" in
  stop) stop_all; exit 0 ;;
  status) for f in "$RUN"/*.pid; do [ -e "$f" ] && echo "$(basename "$f" .pid): $(kill -0 "$(cat "$f")" 2>/dev/null && echo up || echo down)"; done; exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

echo "botgw: starting the local stack"
start_bg redis redis-server --port 6390 --dir "$PWD/$RUN" --save "" --appendonly yes --appendfilename botgw.aof
start_bg engine "$BOTGW" engine serve --profile auto --port 8000 --served-model-name ernie
start_bg simulator "$BOTGW" sim serve --config "$CONFIG" --port 8090
start_bg gateway "$BOTGW" serve --config "$CONFIG" --port 8080
start_bg worker "$BOTGW" worker --config "$CONFIG"
start_bg dingtalk-stream "$BOTGW" dingtalk-stream --config "$CONFIG"
start_bg web "$BOTGW" web --config "$CONFIG" --bot web --port 8100
wait_url http://127.0.0.1:8090/__sim__/healthz 30 simulator
wait_url http://127.0.0.1:8080/healthz 30 gateway
echo "botgw: waiting for the engine to load (first start builds the tiny model; up to a few minutes)"
wait_url http://127.0.0.1:8000/health 900 engine
wait_url http://127.0.0.1:8081/readyz 60 gateway
grep -ah "^botgw:" "$LOGS/engine.log" || true
cat <<TXT

botgw is up.  Talk to the bot as a WeCom user would (the simulator signs and encrypts the callback):

  .venv/bin/botgw sim wecom --config $CONFIG --bot demo --user alice "你好，请介绍一下你自己"
  .venv/bin/botgw sim wecom --config $CONFIG --bot demo --user alice "/help"
  .venv/bin/botgw sim wecom-ai --config $CONFIG --bot assistant-ai --user alice "写一首关于春天的诗"
  .venv/bin/botgw sim dingtalk --config $CONFIG --bot dingtalk --user bob "你好"              # Stream mode
  .venv/bin/botgw sim dingtalk --config $CONFIG --bot dingtalk-http --user bob --group cid-team "@bot hi"
  .venv/bin/botgw sim wecom-kf --config $CONFIG --bot kefu --customer wmcarol "你们几点上班？"     # 微信客服
  .venv/bin/botgw kf handoff --config $CONFIG --bot kefu --customer wmcarol                      # to a human

  web chat   http://127.0.0.1:8100  (sign in as alice / alice-demo-password)
  readiness  http://127.0.0.1:8081/readyz     metrics  http://127.0.0.1:8081/metrics   (admin listener, loopback)
  engine     http://127.0.0.1:8000/v1/models  logs     $LOGS/
  stop everything: make stop
TXT
