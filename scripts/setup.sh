#!/usr/bin/env bash
# Set up everything mindwatch needs on a fresh Debian machine (idempotent):
# system packages for the browser and Prometheus tests, a virtual environment with
# MindSpore 2.10 (numpy<2) and the dev tools, and the dashboard's npm assets.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need_apt[*]} with apt-get"
    apt-get update -q >/dev/null
    DEBIAN_FRONTEND=noninteractive apt-get install -y -q "${need_apt[@]}" >/dev/null
  else
    echo "setup: warning: ${need_apt[*]} missing and apt-get unavailable; the browser/Prometheus tests will skip" >&2
  fi
fi

stamp="$VENV/.mindwatch-setup"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  echo "setup: creating $VENV with MindSpore 2.10 (a few minutes the first time)"
  python3 -m venv "$VENV"
  "$VENV/bin/pip" install -q --upgrade pip
  "$VENV/bin/pip" install -q -e ".[mindspore,dev]"
  touch "$stamp"
fi

# MindFormers 1.9 needs MindSpore 2.9, so its integration test gets its own environment
# (about 2 minutes and 3.4 GB the first time). MINDWATCH_SKIP_MINDFORMERS=1 skips it.
MF_VENV=${MF_VENV:-.venv-mindformers}
mf_stamp="$MF_VENV/.mindwatch-setup"
if [ -z "${MINDWATCH_SKIP_MINDFORMERS:-}" ] && { [ ! -f "$mf_stamp" ] || [ pyproject.toml -nt "$mf_stamp" ]; }; then
  echo "setup: creating $MF_VENV with MindSpore 2.9 + MindFormers 1.9 (for tests/test_mindformers.py)"
  python3 -m venv "$MF_VENV"
  "$MF_VENV/bin/pip" install -q --upgrade pip
  "$MF_VENV/bin/pip" install -q "mindspore==2.9.0" "mindformers==1.9.0" "numpy<2"
  "$MF_VENV/bin/pip" install -q -e ".[tensorboard,prometheus]" "numpy<2"
  touch "$mf_stamp"
fi

if [ -f package.json ] && { [ ! -d node_modules ] || [ package.json -nt node_modules ]; }; then
  echo "setup: installing dashboard assets from npm"
  if [ -f package-lock.json ]; then npm ci --silent --no-audit --no-fund; else npm install --silent --no-audit --no-fund; fi
  touch node_modules
fi
echo "setup: ready ($VENV)"
