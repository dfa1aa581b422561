#!/usr/bin/env bash
# Creates <project>/.venv with the real Python EventMQ 0.3.13 (the interop
# test peer), following the recipe in tests/interop/README.md:
#   pip install --no-deps eventmq==0.3.13 && pip install -r requirements-py311.txt
#
# Idempotent: a stamp file inside the venv records what was installed; when
# it matches, the script exits at once. A lock (flock on <venv>.lock) makes
# concurrent callers (parallel test threads, CI) wait for one another.
# Needs only PyPI. Environment:
#   EMQ_VENV    venv directory            (default <project>/.venv)
#   EMQ_PYTHON  interpreter to create it  (default python3)
# Exit status 0 when the venv is ready; otherwise non-zero with the reason
# (and the pip log) on stderr.
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"
venv="${EMQ_VENV:-$root/.venv}"
python="${EMQ_PYTHON:-python3}"
req="$here/requirements-py311.txt"
eventmq_version="0.3.13"
stamp="$venv/.emq-interop-stamp"

fail() { echo "setup-venv: $*" >&2; exit 1; }

want_stamp() {
    # what is installed: eventmq version + the exact requirements text
    { echo "eventmq==$eventmq_version"; cat "$req"; } | sha256sum | cut -d' ' -f1
}

ready() { [[ -f "$stamp" && "$(cat "$stamp")" == "$(want_stamp)" ]]; }

ready && exit 0

command -v flock >/dev/null || fail "flock (util-linux) is required"
command -v "$python" >/dev/null || fail "no '$python' on PATH (set EMQ_PYTHON)"

exec 9>"$venv.lock"
flock -w 900 9 || fail "timed out after 900 s waiting for the lock $venv.lock"
ready && exit 0   # another caller finished while we waited

log="$(mktemp "${TMPDIR:-/tmp}/emq-setup-venv.XXXXXX")"
trap 'rm -f "$log"' EXIT
run() {
    if ! "$@" >>"$log" 2>&1; then
        cat "$log" >&2
        fail "failed: $*"
    fi
}

echo "setup-venv: creating $venv with eventmq $eventmq_version ($("$python" --version 2>&1))" >&2
rm -rf "$venv"   # a venv without a matching stamp is partial or stale
run "$python" -m venv "$venv"
pip=("$venv/bin/python" -m pip --disable-pip-version-check --no-input -q)
run "${pip[@]}" install --no-deps "eventmq==$eventmq_version"
run "${pip[@]}" install -r "$req"
run "$venv/bin/python" -c \
    "import eventmq.router, eventmq.jobmanager, eventmq.scheduler, eventmq.client.messages, zmq"
for script in emq-router emq-jobmanager emq-scheduler emq-cli; do
    [[ -x "$venv/bin/$script" ]] || fail "$venv/bin/$script is missing after install"
done
want_stamp >"$stamp"
echo "setup-venv: ready ($venv)" >&2
