#!/usr/bin/env bash
# Makes docs/status-page.png, the README's screenshot of the status page:
# a router on fresh loopback ports and a temporary data directory, a short
# scripted run (jobs over both protocols, a job that keeps failing until it
# is in the dead set), then headless Chromium's screenshot of the page.
#
# Usage: docs/status-page.sh   (from the repository root; needs chromium)
# Everything it starts is stopped by PID when it ends.
set -euo pipefail
cd "$(dirname "$0")/.."
cargo build --release --bins >/dev/null
bin=target/release
work=$(mktemp -d)
pids=()
cleanup() {
    for pid in "${pids[@]}"; do kill "$pid" 2>/dev/null || true; done
    wait 2>/dev/null || true
    rm -rf "$work"
}
trap cleanup EXIT

port() { python3 -c 'import socket; s=socket.socket(); s.bind(("127.0.0.1", 0)); print(s.getsockname()[1])'; }
fe=$(port) be=$(port) ad=$(port) tx=$(port) http=$(port)
"$bin/emq-router" --frontend "tcp://127.0.0.1:$fe" --backend "tcp://127.0.0.1:$be" \
    --admin "tcp://127.0.0.1:$ad" --text "127.0.0.1:$tx" --metrics "127.0.0.1:$http" \
    --data-dir "$work/data" --max-retries 2 --retry-backoff 200ms --drain-timeout 1s --log error &
pids+=($!)
cli=("$bin/emq-cli" --frontend "tcp://127.0.0.1:$fe" --admin "tcp://127.0.0.1:$ad" --text "127.0.0.1:$tx")
for _ in $(seq 50); do "${cli[@]}" status >/dev/null 2>&1 && break; sleep 0.1; done

# A worker for `email` and `reports` (each job sleeps a little), and one for
# `flaky` whose command always fails.
printf '#!/bin/sh\ncat >/dev/null\nsleep 0.0$((RANDOM %% 9))\necho ok\n' >"$work/ok.sh"
printf '#!/bin/sh\ncat >/dev/null\nexit 1\n' >"$work/fail.sh"
chmod +x "$work/ok.sh" "$work/fail.sh"
"$bin/emq-worker" -B "tcp://127.0.0.1:$be" -Q email -Q reports -J 4 --stats-interval 0s -- "$work/ok.sh" 2>/dev/null &
pids+=($!)
"$bin/emq-worker" -B "tcp://127.0.0.1:$be" -Q flaky -J 1 --stats-interval 0s -- "$work/fail.sh" 2>/dev/null &
pids+=($!)
sleep 1
for i in $(seq 40); do "${cli[@]}" request email "{\"to\": \"user$i@example.com\"}" >/dev/null; done
for i in $(seq 12); do "${cli[@]}" request reports "[\"report $i\"]" >/dev/null; done
for i in $(seq 3); do "${cli[@]}" sched "thumbnail $i" --queue images >/dev/null; done
"${cli[@]}" request flaky '{"charge": 42}' >/dev/null
sleep 2.5
"${cli[@]}" dead list
curl -s "http://127.0.0.1:$http/" >/dev/null  # a first load, so the page has rates
sleep 1
chromium --headless --no-sandbox --disable-gpu --no-first-run --disable-dev-shm-usage \
    --user-data-dir="$work/profile" --hide-scrollbars --window-size=1280,1080 \
    --screenshot="$PWD/docs/status-page.png" "http://127.0.0.1:$http/" 2>/dev/null
echo "wrote docs/status-page.png"
