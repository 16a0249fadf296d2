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

# A virtual environment built once for a given pyproject.toml (and this script, and this Python) is kept under
# $MINDWATCH_VENV_CACHE and copied into a fresh clone as hard links, its scripts pointed at their new place and the
# clone installed into it in editable mode: seconds instead of minutes. MINDWATCH_VENV_CACHE=none turns it off.
CACHE=${MINDWATCH_VENV_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/mindwatch/venvs}
KEY=$( { cat pyproject.toml "$0"; python3 --version; } | sha1sum | cut -c1-16)

restore_venv() {  # restore_venv DEST NAME: the cached environment NAME-KEY copied to DEST; false when none
  local src="$CACHE/$1-$KEY" dest="$2"
  [ "$CACHE" != none ] && [ -f "$src/.mindwatch-setup" ] || return 1
  echo "setup: $dest from the environment cached in $src"
  rm -rf "$dest"
  cp -al "$src" "$dest" 2>/dev/null || cp -a "$src" "$dest"
  local abs
  abs=$(cd "$dest" && pwd)
  # scripts name their interpreter by absolute path: point them here (sed -i writes a new file: the cache keeps its own)
  grep -lIs '^#!.*/bin/python[0-9.]*$' "$dest"/bin/* | xargs -r sed -i "1s|^#!.*/bin/python[0-9.]*\$|#!$abs/bin/python3|"
  sed -i "s|^VIRTUAL_ENV=.*|VIRTUAL_ENV=\"$abs\"|" "$dest/bin/activate"
  "$dest/bin/pip" install -q --no-deps -e . >/dev/null  # this clone, not the one it was built from
}

save_venv() {  # save_venv DEST NAME: keep a copy of the environment just built (the newest two per NAME)
  [ "$CACHE" != none ] || return 0
  mkdir -p "$CACHE"
  rm -rf "$CACHE/$1-$KEY.tmp"
  if cp -al "$2" "$CACHE/$1-$KEY.tmp" 2>/dev/null || cp -a "$2" "$CACHE/$1-$KEY.tmp"; then
    rm -rf "$CACHE/$1-$KEY" && mv "$CACHE/$1-$KEY.tmp" "$CACHE/$1-$KEY"
    ls -dt "$CACHE/$1"-* 2>/dev/null | tail -n +3 | xargs -r rm -rf
  fi
}

stamp="$VENV/.mindwatch-setup"
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  if ! restore_venv dev "$VENV"; then
    echo "setup: creating $VENV with MindSpore 2.10 (a few minutes the first time)"
    rm -rf "$VENV"
    python3 -m venv "$VENV"
    "$VENV/bin/pip" install -q --upgrade pip
    "$VENV/bin/pip" install -q -e ".[mindspore,dev]"
    touch "$stamp"
    save_venv dev "$VENV"
  fi
  touch "$stamp"
fi

# MindFormers 1.9 needs MindSpore 2.9, so its integration test gets its own environment
# (about 2 minutes and 3.4 GB the first time). MINDWATCH_SKIP_MINDFORMERS=1 skips it.
MF_VENV=${MF_VENV:-.venv-mindformers}
mf_stamp="$MF_VENV/.mindwatch-setup"
if [ -z "${MINDWATCH_SKIP_MINDFORMERS:-}" ] && { [ ! -f "$mf_stamp" ] || [ pyproject.toml -nt "$mf_stamp" ]; }; then
  if ! restore_venv mindformers "$MF_VENV"; then
    echo "setup: creating $MF_VENV with MindSpore 2.9 + MindFormers 1.9 (for tests/test_mindformers.py)"
    rm -rf "$MF_VENV"
    python3 -m venv "$MF_VENV"
    "$MF_VENV/bin/pip" install -q --upgrade pip
    "$MF_VENV/bin/pip" install -q "mindspore==2.9.0" "mindformers==1.9.0" "numpy<2"
    "$MF_VENV/bin/pip" install -q -e ".[tensorboard,prometheus]" "numpy<2"
    touch "$mf_stamp"
    save_venv mindformers "$MF_VENV"
  fi
  touch "$mf_stamp"
fi

if [ -f package.json ] && { [ ! -d node_modules ] || [ package.json -nt node_modules ]; }; then
  echo "setup: installing dashboard assets from npm"
  if [ -f package-lock.json ]; then npm ci --silent --no-audit --no-fund; else npm install --silent --no-audit --no-fund; fi
  touch node_modules
fi
echo "setup: ready ($VENV)"
