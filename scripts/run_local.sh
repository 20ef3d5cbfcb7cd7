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
#   logs/<time>[-n]/, logs/latest      each start's logs (the newest LOGS_KEPT); latest links to the newest
#   <component>.pid                    "PID START BOOT": the process group's leader, its start time (field 22 of
#                                      /proc/PID/stat) and the boot's id. A file whose pid now names another process
#                                      (a reboot, a reused pid) is stale: removed, never signalled.
# Ports: redis 6390, engine 8000, gateway 8080 (admin 8081), simulator 8090, page 8100, demo MCP server 8095.
# PLAYGROUND_RUN_DIR and PLAYGROUND_{REDIS,ENGINE,GATEWAY,ADMIN,SIM,WEB,MCP}_PORT move it (tests/deploy/test_playground.py does, with a config that
# names the same ports); BOTGW_CONFIG picks another config; PLAYGROUND_STOP_WAIT_S and PLAYGROUND_KILL_WAIT_S how long
# stop waits after TERM (then KILL) and after KILL (then it gives up, exit 1).
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
MCP_PORT=${PLAYGROUND_MCP_PORT:-8095}  # the demo MCP server (rooms: list_rooms, book), tools.servers in local.yaml
STOP_WAIT_S=${PLAYGROUND_STOP_WAIT_S:-30}  # after TERM, before KILL
KILL_WAIT_S=${PLAYGROUND_KILL_WAIT_S:-10}  # after KILL: a group still there is a zombie or stuck in the kernel
LOGS_KEPT=10
BOTGW=.venv/bin/botgw
BOOT_ID=$(cat /proc/sys/kernel/random/boot_id)

# Which processes are ours. A pid file outlives its processes (a reboot, a crash, a kill -9 of this script), and the
# pid in it may since name anything, a shell or sshd leading its own group: signalling it on the pid alone would
# TERM, then KILL, someone else's process group. So a pid file also holds the leader's start time and the boot's id,
# and a group is ours only when both still match.

proc_stat() {  # pid: "STATE STARTTIME" of the process (fields 3 and 22 of /proc/PID/stat); fails if there is none
  local stat fields
  stat=$(cat "/proc/$1/stat" 2>/dev/null) || return 1
  stat=${stat##*) }  # after "(comm)", which may hold spaces and parentheses: fields 3 onwards
  read -ra fields <<<"$stat"
  [ ${#fields[@]} -ge 20 ] || return 1
  echo "${fields[0]} ${fields[19]}"
}

group_alive() {  # pid: whether any process of the group it leads is left (vLLM has children)
  kill -0 -- "-$1" 2>/dev/null
}

owned() {  # pid start: whether the group that this pid, started at `start` in this boot, leads is still there
  local now
  if now=$(proc_stat "$1"); then
    [ "${now#* }" = "$2" ] || return 1  # the pid was reused: another process, not ours
    [[ ${now%% *} != [ZX] ]] && return 0  # the leader itself runs (maybe not yet a group leader: just forked)
  fi
  # The leader has ended (or is a zombie). Its children may still be there: Linux does not reuse a pid while a
  # process group of that id has members, so a live group of this id is still ours.
  group_alive "$1"
}

read_pid_file() {  # name: sets PID and START from $RUN/name.pid when it is this boot's; fails otherwise
  local boot=""
  PID="" START=""
  [ -f "$RUN/$1.pid" ] || return 1
  read -r PID START boot <"$RUN/$1.pid" || true
  [[ $PID =~ ^[1-9][0-9]*$ ]] && [ -n "$START" ] && [ "$boot" = "$BOOT_ID" ]
}

ours() {  # name: whether its pid file names a live process group of ours (PID and START set when it does)
  read_pid_file "$1" && owned "$PID" "$START"
}

write_pid_file() {  # name pid
  local now
  now=$(proc_stat "$2") || now="- gone"  # it ended already: the file will read as ended, never as ours
  echo "$2 ${now#* } $BOOT_ID" >"$RUN/$1.pid"
}

stop_together() {  # names...: TERM their process groups, wait until all have ended (KILL after STOP_WAIT_S)
  local name names=() pids=() starts=() stuck=()
  for name in "$@"; do
    [ -f "$RUN/$name.pid" ] || continue
    if ours "$name"; then
      kill -TERM -- "-$PID" 2>/dev/null || true
      names+=("$name"); pids+=("$PID"); starts+=("$START")
    else
      if [[ $PID =~ ^[1-9][0-9]*$ ]] && kill -0 "$PID" 2>/dev/null; then
        echo "  $name: $RUN/$name.pid names pid $PID, which is not ours any more (a reboot or a reused pid):" \
             "not signalled; file removed"
      fi
      rm -f "$RUN/$name.pid"
    fi
  done
  [ ${#pids[@]} -gt 0 ] || return 0
  local deadline=$((SECONDS + STOP_WAIT_S)) i left pid
  while :; do
    left=0
    for i in "${!pids[@]}"; do owned "${pids[$i]}" "${starts[$i]}" && left=1; done
    [ $left = 1 ] && [ $SECONDS -lt $deadline ] || break
    sleep 0.2
  done
  for i in "${!pids[@]}"; do
    name=${names[$i]}; pid=${pids[$i]}
    if owned "$pid" "${starts[$i]}"; then
      echo "  $name still running after ${STOP_WAIT_S} s: killed"
      kill -KILL -- "-$pid" 2>/dev/null || true
      deadline=$((SECONDS + KILL_WAIT_S))
      while owned "$pid" "${starts[$i]}" && [ $SECONDS -lt $deadline ]; do sleep 0.1; done
      if owned "$pid" "${starts[$i]}"; then
        echo "botgw: $name (process group $pid) did not end ${KILL_WAIT_S} s after SIGKILL (a zombie, or stuck in" \
             "the kernel: see ps -o pid,stat,wchan,cmd -g $pid); $RUN/$name.pid kept" >&2
        stuck+=("$name")
        continue
      fi
    fi
    rm -f "$RUN/$name.pid"
    echo "  $name stopped"
  done
  [ ${#stuck[@]} -eq 0 ] || exit 1  # what comes after (the simulator, Redis) may still be in use by it
}

stop_all() {
  # Front to back: nothing new comes in while the worker finishes what it holds (it may still need the
  # simulator and the engine); the simulator writes its state on the way out; Redis, which all of them use, last.
  stop_together web dingtalk-stream gateway worker
  stop_together simulator engine tools-demo
  stop_together redis
  echo "botgw: stopped"
}

case "${1:-start}" in
  stop) stop_all; exit 0 ;;
  status)
    for f in "$RUN"/*.pid; do
      [ -e "$f" ] || continue
      name=$(basename "$f" .pid)
      if ours "$name"; then echo "$name: up (pid $PID)"; else echo "$name: down"; fi
    done
    exit 0 ;;
  start) ;;
  *) echo "usage: $0 start|stop|status" >&2; exit 2 ;;
esac

# The configuration first, as every botgw process checks it at start: a mistake is its one line and exit 2, before
# anything is made (its output is the effective configuration: not wanted here).
"$BOTGW" config check --config "$CONFIG" >/dev/null || exit 2

# The Redis password is the one in the config's redis_url. It goes into a file only this user can read, never onto a
# command line. It is written into redis.conf as is, so it is held to characters that need no quoting there (a `"`
# or `\` breaks redis.conf's parsing, a %0A in the URL would start a directive of its own).
REDIS_PASSWORD=$(.venv/bin/python -c 'import sys; from urllib.parse import unquote, urlsplit
from gateway.config import load_settings
print(unquote(urlsplit(load_settings(sys.argv[1]).redis_url).password or ""))' "$CONFIG")
if [ -z "$REDIS_PASSWORD" ]; then
  echo "botgw: $CONFIG's redis_url has no password; the playground's Redis needs one (redis://:PASSWORD@127.0.0.1:$REDIS_PORT/0)" >&2
  exit 2
fi
if ! [[ $REDIS_PASSWORD =~ ^[A-Za-z0-9._~-]+$ ]]; then
  echo "botgw: $CONFIG's redis_url password has characters the playground's redis.conf cannot hold; use only letters, digits and . _ ~ - (e.g. openssl rand -hex 24)" >&2
  exit 2
fi

mkdir -p "$RUN/logs"
RUN_ABS=$(cd "$RUN" && pwd)  # for redis-server, which changes into its dir
STAMP=$(date +%Y%m%d-%H%M%S)
n=1
until mkdir "$RUN/logs/$STAMP" 2>/dev/null; do  # two starts in one second: a folder each
  n=$((n + 1))
  [ $n -le 100 ] || { echo "botgw: cannot make a log folder in $RUN/logs" >&2; exit 1; }
  STAMP=$(date +%Y%m%d-%H%M%S)-$n
done
LOGS=$RUN/logs/$STAMP
ln -sfn "$STAMP" "$RUN/logs/latest"
# The newest LOGS_KEPT starts' logs are kept (names sort as they were made: 20250101-120000 < 20250101-120000-2).
mapfile -t old_logs < <(find "$RUN/logs" -mindepth 1 -maxdepth 1 -type d -name '[0-9]*' -printf '%f\n' | LC_ALL=C sort)
if [ ${#old_logs[@]} -gt $LOGS_KEPT ]; then
  for old in "${old_logs[@]:0:${#old_logs[@]}-LOGS_KEPT}"; do rm -rf -- "${RUN:?}/logs/$old"; done
fi

start_bg() {  # name, command...
  local name=$1; shift
  if ours "$name"; then
    echo "  $name already running (pid $PID)"; return
  fi
  setsid "$@" >"$LOGS/$name.log" 2>&1 < /dev/null &
  write_pid_file "$name" $!
  echo "  $name started (pid $!)"
}

wait_url() {  # url, seconds, name: until the URL answers; a process that exited fails at once
  local deadline=$((SECONDS + $2))
  until curl -sf -o /dev/null "$1"; do
    if ! ours "$3"; then echo "botgw: $3 exited; see $LOGS/$3.log" >&2; exit 1; fi
    if [ $SECONDS -ge $deadline ]; then echo "botgw: $3 did not come up; see $LOGS/$3.log" >&2; exit 1; fi
    sleep 1
  done
}

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
deadline=$((SECONDS + 30))
until REDISCLI_AUTH=$REDIS_PASSWORD redis-cli -p "$REDIS_PORT" ping >/dev/null 2>&1; do
  ours redis || { echo "botgw: redis did not start; see $LOGS/redis.log" >&2; exit 1; }
  [ $SECONDS -lt $deadline ] || { echo "botgw: redis did not answer on port $REDIS_PORT within 30 s; see $LOGS/redis.log" >&2; exit 1; }
  sleep 0.2
done
start_bg engine "$BOTGW" engine serve --profile auto --port "$ENGINE_PORT" --served-model-name ernie
start_bg tools-demo .venv/bin/python -m testkit.fakes.demo_mcp --transport http --port "$MCP_PORT"
start_bg simulator "$BOTGW" sim serve --config "$CONFIG" --port "$SIM_PORT" --state "$RUN/simulator.json"
start_bg gateway "$BOTGW" serve --config "$CONFIG" --port "$GATEWAY_PORT" --admin-port "$ADMIN_PORT"
start_bg worker "$BOTGW" worker --config "$CONFIG"
start_bg dingtalk-stream "$BOTGW" dingtalk-stream --config "$CONFIG"
start_bg web "$BOTGW" web --config "$CONFIG" --bot web --port "$WEB_PORT" --app-root "$RUN/web"
wait_url "http://127.0.0.1:$SIM_PORT/__sim__/healthz" 30 simulator
wait_url "http://127.0.0.1:$GATEWAY_PORT/healthz" 60 gateway
# What an operator does once in WeCom's admin console for the operator console's 企业微信登录: its callback becomes a
# 可信域名 of the app that signs people in (console.login.wecom.bot), here at the simulator.
CONSOLE_TRUST=$(.venv/bin/python -c 'import json, sys; from gateway.config import load_settings
settings = load_settings(sys.argv[1]); login = settings.console.login.wecom
print(json.dumps({"agentid": settings.bot(login.bot).agent_id, "redirect_uri":
      f"http://127.0.0.1:{sys.argv[2]}/console/login/wecom/callback"}) if login else "")' "$CONFIG" "$ADMIN_PORT")
if [ -n "$CONSOLE_TRUST" ]; then
  curl -sf -o /dev/null -X POST -H 'Content-Type: application/json' -d "$CONSOLE_TRUST" \
    "http://127.0.0.1:$SIM_PORT/__sim__/login/trust" || echo "botgw: the simulator did not take the console's 可信域名" >&2
fi
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
  .venv/bin/botgw tools audit  --config $CONFIG                       # the demo bot's tool calls (rooms MCP server)

  web chat   http://127.0.0.1:$WEB_PORT  (sign in as alice / alice-demo-password)
  readiness  http://127.0.0.1:$ADMIN_PORT/readyz     metrics  http://127.0.0.1:$ADMIN_PORT/metrics   (admin listener, loopback)
  admin API  http://127.0.0.1:$ADMIN_PORT/admin/kb   (Bearer admin.token from $CONFIG)
  console    http://127.0.0.1:$ADMIN_PORT/console/  (the admin token from $CONFIG, or 企业微信登录 as alice, bob or carol)
  engine     http://127.0.0.1:$ENGINE_PORT/v1/models
  logs       $LOGS/  ($RUN/logs/latest)
  stop everything: make stop    (state is kept for the next make run; make clean removes it)
TXT
