#!/usr/bin/env bash
# Set up everything mindwatch needs on a fresh Debian machine (idempotent):
# system packages for the browser and Prometheus tests, a virtual environment with
# MindSpore 2.10 (numpy<2) and the dev tools, and the dashboard's npm assets.
set -euo pipefail
cd "$(dirname "$0")/.."
VENV=${VENV:-.venv}

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

# The four jobs (Debian packages, the two environments, the npm assets) mostly wait on downloads: they run at once,
# each into a log of its own under $LOGS, and a job that fails prints its log and fails the set-up.
LOGS=$(mktemp -d "${TMPDIR:-/tmp}/mindwatch-setup.XXXXXX")
trap 'rm -rf "$LOGS"' EXIT
jobs_started=()
start_job() {  # start_job NAME COMMAND...: COMMAND in the background, its output in $LOGS/NAME.log
  local name=$1
  shift
  # set -e ends the job at its first failing command; the EXIT trap notes how it ended
  (trap 'echo "$? $SECONDS" >"$LOGS/$name.rc"' EXIT; SECONDS=0; "$@" >"$LOGS/$name.log" 2>&1) &
  jobs_started+=("$name")
}

apt_packages() {
  apt-get update -q
  DEBIAN_FRONTEND=noninteractive apt-get install -y -q "$@"
}
need_apt=()
command -v chromium >/dev/null 2>&1 || need_apt+=(chromium)
command -v prometheus >/dev/null 2>&1 || need_apt+=(prometheus)
command -v tmux >/dev/null 2>&1 || need_apt+=(tmux)
if [ ${#need_apt[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
    echo "setup: installing ${need_apt[*]} with apt-get"
    start_job apt apt_packages "${need_apt[@]}"
  else
    echo "setup: warning: ${need_apt[*]} missing and apt-get unavailable; the browser/Prometheus tests will skip" >&2
  fi
fi

if [ -f package.json ] && { [ ! -d node_modules ] || [ package.json -nt node_modules ]; }; then
  echo "setup: installing dashboard assets from npm"
  npm_assets() {
    if [ -f package-lock.json ]; then npm ci --no-audit --no-fund; else npm install --no-audit --no-fund; fi
    touch node_modules
  }
  start_job npm npm_assets
fi

# uv installs what pip would, downloading in parallel (minutes less on a fresh machine). It is fetched once with pip
# beside the environment cache; where it cannot be had, pip does the work.
UV=
find_uv() {
  local tools
  tools="$(dirname "$CACHE")/tools"
  [ "$CACHE" != none ] || tools="$LOGS/tools"
  if [ -x "$tools/bin/uv" ]; then UV="$tools/bin/uv"; return; fi
  if python3 -m venv "$tools" >/dev/null 2>&1 && "$tools/bin/pip" install -q uv >/dev/null 2>&1; then
    UV="$tools/bin/uv"
  else
    echo "setup: uv could not be installed: pip installs the environments (slower)" >&2
  fi
}
with_project() {  # with_project VENV EXTRAS [REQUIREMENT...]: the project's dependencies with EXTRAS (and the
  # REQUIREMENTs) installed into VENV, then the project itself, editable (one at a time: that build writes into the checkout)
  local venv=$1 extras=$2 flags=() e
  shift 2
  for e in ${extras//,/ }; do flags+=(--extra "$e"); done
  # --compile-bytecode, as pip does: without .pyc files (and with PYTHONDONTWRITEBYTECODE set, as CI images do) every
  # process compiles MindSpore's 2,000 modules again: `import mindspore` took 8.8 s of CPU instead of 3.4
  if [ -n "$UV" ] && "$UV" pip install --compile-bytecode --python "$venv/bin/python" -r pyproject.toml "${flags[@]}" "$@" \
    && (flock 9 && "$UV" pip install --python "$venv/bin/python" --no-deps -e .) 9>"$LOGS/editable.lock"; then
    return
  fi
  (flock 9 && "$venv/bin/pip" install -q -e ".[$extras]" "$@") 9>"$LOGS/editable.lock"
}

# MindSpore 2.10 (numpy<2) and the dev tools
dev_venv() {
  rm -rf "$VENV"
  python3 -m venv "$VENV"
  with_project "$VENV" mindspore,dev
  touch "$VENV/.mindwatch-setup"
  save_venv dev "$VENV"
}
# MindFormers 1.9 needs MindSpore 2.9, so its integration test gets its own environment (3.4 GB).
mf_venv() {
  rm -rf "$MF_VENV"
  python3 -m venv "$MF_VENV"
  with_project "$MF_VENV" tensorboard,prometheus "mindspore==2.9.0" "mindformers==1.9.0" "numpy<2"
  touch "$MF_VENV/.mindwatch-setup"
  save_venv mindformers "$MF_VENV"
}

stamp="$VENV/.mindwatch-setup"
want_dev=
if [ ! -f "$stamp" ] || [ pyproject.toml -nt "$stamp" ]; then
  if restore_venv dev "$VENV"; then touch "$stamp"; else want_dev=1; fi
fi
# MINDWATCH_SKIP_MINDFORMERS=1 skips the MindFormers environment (its test then skips).
MF_VENV=${MF_VENV:-.venv-mindformers}
mf_stamp="$MF_VENV/.mindwatch-setup"
want_mf=
if [ -z "${MINDWATCH_SKIP_MINDFORMERS:-}" ] && { [ ! -f "$mf_stamp" ] || [ pyproject.toml -nt "$mf_stamp" ]; }; then
  if restore_venv mindformers "$MF_VENV"; then touch "$mf_stamp"; else want_mf=1; fi
fi
if [ -n "$want_dev$want_mf" ]; then
  find_uv
  if [ -n "$want_dev" ]; then
    echo "setup: creating $VENV with MindSpore 2.10 (a few minutes the first time)"
    start_job "$(basename "$VENV")" dev_venv
  fi
  if [ -n "$want_mf" ]; then
    echo "setup: creating $MF_VENV with MindSpore 2.9 + MindFormers 1.9 (for tests/test_mindformers.py)"
    start_job "$(basename "$MF_VENV")" mf_venv
  fi
fi

failed=()
wait
for name in "${jobs_started[@]}"; do
  read -r rc secs <"$LOGS/$name.rc" || { rc=1 secs=?; }
  if [ "$rc" = 0 ]; then
    echo "setup: $name done in ${secs} s"
  else
    echo "setup: $name FAILED (exit $rc after ${secs} s); its output:" >&2
    tail -n 40 "$LOGS/$name.log" >&2
    failed+=("$name")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "setup: failed: ${failed[*]}; fix what the output above names, then run make setup again" >&2
  exit 1
fi
echo "setup: ready ($VENV)"
