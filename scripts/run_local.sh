#!/usr/bin/env bash
# `make run` / `make stop`: the whole product on this machine, the platforms played by the simulator.
#   scripts/run_local.sh start | stop | status
#
# Everything it makes lives in the run folder (.run; `make clean` removes it) and survives `make stop` + `make run`:
#   redis.conf and Redis's AOF         Redis on 127.0.0.1 only, with the password of the config's redis_url
#   simulator.json                     the simulated 微信客服 (its log, cursors, sessions: the cursor botgw keeps
#                                      in Redis stays valid, as on the real platform)
#   knowledge/                         the knowledge store (deploy/local.yaml's knowledge.store.path)
#   web/                               the page's Chainlit files
#   logs/<time>/, logs/latest          each start's logs; latest links to the newest
# Ports: redis 6390, engine 8000, gateway 8080 (admin 8081), simulator 8090, page 8100. PLAYGROUND_RUN_DIR and
# PLAYGROUND_{REDIS,ENGINE,GATEWAY,ADMIN,SIM,WEB}_PORT move it (tests/test_playground.py does, with a config that
# names the same ports); BOTGW_CONFIG picks another config.
set -euo pipefail
cd "$(dirname "$0")/.."

CONFIG=${BOTGW_CONFIG:-deploy/local.yaml}
RUN=${PLAYGROUND_RUN_DIR:-.run}
REDIS_PORT=${PLAYGROUND_REDIS_PORT:-6390}
ENGINE_PORT=${PLAYGROUND_ENGINE_PORT:-8000}
GATEWAY_PORT=${PLAYGROUND_GATEWAY_PORT:-8080}
ADMIN_PORT=${PLAYGROUND_ADMIN_PORT:-8081}
SIM_PORT=${PLAYGROUND_SIM_PORT:-8090}
WEB_PORT=${PLAYGROUND_WEB_PORT:-8100}
STOP_WAIT_S=30
BOTGW=.venv/bin/botgw

alive() {  # pid: whether any process of the group it leads is left (vLLM has children)
  kill -0 -- "-$1" 2>/dev/null
}

stop_together() {  # names...: TERM their process groups, wait until all have ended (KILL after STOP_WAIT_S)
  local name pid names=() pids=()
  for name in "$@"; do
    [ -f "$RUN/$name.pid" ] || continue
    pid=$(cat "$RUN/$name.pid")
    if alive "$pid"; then
      kill -TERM -- "-$pid" 2>/dev/null || true
      names+=("$name"); pids+=("$pid")
    else
      rm -f "$RUN/$name.pid"
    fi
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  local deadline=$((SECONDS + STOP_WAIT_S)) i left
  while :; do
    left=0
    for pid in "${pids[@]}"; do alive "$pid" && left=1; done
    [ $left = 1 ] && [ $SECONDS -lt $deadline ] || break
    sleep 0.2
  done
  for i in "${!pids[@]}"; do
    name=${names[$i]}; pid=${pids[$i]}
    if alive "$pid"; then
      echo "  $name still running after ${STOP_WAIT_S} s: killed"
      kill -KILL -- "-$pid" 2>/dev/null || true
      while alive "$pid"; do sleep 0.1; done
    fi
    rm -f "$RUN/$name.pid"
    echo "  $name stopped"
  done
}

stop_all() {
  # Front to back: nothing new comes in while the worker finishes what it holds (it may still need the
  # simulator and the engine); the simulator writes its state on the way out; Redis, which all of them use, last.
  stop_together web dingtalk-stream gateway worker
  stop_together simulator engine
  stop_together redis
  echo "botgw: stopped"
}

case "${1:-start}" in
  stop) stop_all; exit 0 ;;
  status)
    for f in "$RUN"/*.pid; do
      [ -e "$f" ] && echo "$(basename "$f" .pid): $(alive "$(cat "$f")" && echo up || echo down)"
    done
    exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

mkdir -p "$RUN/logs"
RUN_ABS=$(cd "$RUN" && pwd)  # for redis-server, which changes into its dir
STAMP=$(date +%Y%m%d-%H%M%S)
LOGS=$RUN/logs/$STAMP
mkdir -p "$LOGS"
ln -sfn "$STAMP" "$RUN/logs/latest"

start_bg() {  # name, command...
  local name=$1; shift
  if [ -f "$RUN/$name.pid" ] && alive "$(cat "$RUN/$name.pid")"; then
    echo "  $name already running (pid $(cat "$RUN/$name.pid"))"; return
  fi
  setsid "$@" >"$LOGS/$name.log" 2>&1 < /dev/null &
  echo $! >"$RUN/$name.pid"
  echo "  $name started (pid $!)"
}

wait_url() {  # url, seconds, name: until the URL answers; a process that exited fails at once
  local deadline=$((SECONDS + $2))
  until curl -sf -o /dev/null "$1"; do
    if ! alive "$(cat "$RUN/$3.pid")"; then echo "botgw: $3 exited; see $LOGS/$3.log" >&2; exit 1; fi
    if [ $SECONDS -ge $deadline ]; then echo "botgw: $3 did not come up; see $LOGS/$3.log" >&2; exit 1; fi
    sleep 1
  done
}

# The Redis password is the one in the config's redis_url (read by botgw's own loader, which also checks the
# config before anything starts). It goes into a file only this user can read, never onto a command line.
REDIS_PASSWORD=$(.venv/bin/python -c 'import sys; from urllib.parse import unquote, urlsplit
from gateway.config import load_settings
print(unquote(urlsplit(load_settings(sys.argv[1]).redis_url).password or ""))' "$CONFIG")
if [ -z "$REDIS_PASSWORD" ]; then
  echo "botgw: $CONFIG's redis_url has no password; the playground's Redis needs one (redis://:PASSWORD@127.0.0.1:$REDIS_PORT/0)" >&2
  exit 2
fi
(
  umask 077
  cat >"$RUN/redis.conf" <<CONF
# Written by scripts/run_local.sh at each start (the password is the config's redis_url's).
bind 127.0.0.1
protected-mode yes
port $REDIS_PORT
requirepass "$REDIS_PASSWORD"
dir "$RUN_ABS"
save ""
appendonly yes
appendfilename botgw.aof
CONF
)

echo "botgw: starting the local stack (logs in $LOGS, also $RUN/logs/latest)"
start_bg redis redis-server "$RUN_ABS/redis.conf"
until REDISCLI_AUTH=$REDIS_PASSWORD redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do
  alive "$(cat "$RUN/redis.pid")" || { echo "botgw: redis did not start; see $LOGS/redis.log" >&2; exit 1; }
  sleep 0.2
done
start_bg engine "$BOTGW" engine serve --profile auto --port "$ENGINE_PORT" --served-model-name ernie
start_bg simulator "$BOTGW" sim serve --config "$CONFIG" --port "$SIM_PORT" --state "$RUN/simulator.json"
start_bg gateway "$BOTGW" serve --config "$CONFIG" --port "$GATEWAY_PORT" --admin-port "$ADMIN_PORT"
start_bg worker "$BOTGW" worker --config "$CONFIG"
start_bg dingtalk-stream "$BOTGW" dingtalk-stream --config "$CONFIG"
start_bg web "$BOTGW" web --config "$CONFIG" --bot web --port "$WEB_PORT" --app-root "$RUN/web"
wait_url "http://127.0.0.1:$SIM_PORT/__sim__/healthz" 30 simulator
wait_url "http://127.0.0.1:$GATEWAY_PORT/healthz" 60 gateway
echo "botgw: waiting for the engine to load (first start builds the tiny model; up to a few minutes)"
wait_url "http://127.0.0.1:$ENGINE_PORT/health" 900 engine
wait_url "http://127.0.0.1:$ADMIN_PORT/readyz" 60 gateway
grep -ah "^botgw:" "$LOGS/engine.log" || true
cat <<TXT

botgw is up.  Talk to the bots as their users would (the simulator signs and encrypts every callback):

  .venv/bin/botgw sim wecom    --config $CONFIG --bot demo --user alice "你好，请介绍一下你自己"
  .venv/bin/botgw sim wecom    --config $CONFIG --bot demo --user alice "/help"
  .venv/bin/botgw sim wecom-ai --config $CONFIG --bot assistant-ai --user alice "写一首关于春天的诗"
  .venv/bin/botgw sim dingtalk --config $CONFIG --bot dingtalk --user bob "你好"              # Stream mode
  .venv/bin/botgw sim dingtalk --config $CONFIG --bot dingtalk-http --user bob --group cid-team "@bot hi"
  .venv/bin/botgw sim wecom-kf --config $CONFIG --bot kefu --customer wmcarol "你们几点上班？"     # 微信客服
  .venv/bin/botgw kf handoff   --config $CONFIG --bot kefu --customer wmcarol                      # to a human
  .venv/bin/botgw push         --config $CONFIG --bot alerts "部署完成"                             # group robot

  web chat   http://127.0.0.1:$WEB_PORT  (sign in as alice / alice-demo-password)
  readiness  http://127.0.0.1:$ADMIN_PORT/readyz     metrics  http://127.0.0.1:$ADMIN_PORT/metrics   (admin listener, loopback)
  admin API  http://127.0.0.1:$ADMIN_PORT/admin/kb   (Bearer admin.token from $CONFIG)
  engine     http://127.0.0.1:$ENGINE_PORT/v1/models
  logs       $LOGS/  ($RUN/logs/latest)
  stop everything: make stop    (state is kept for the next make run; make clean removes it)
TXT
