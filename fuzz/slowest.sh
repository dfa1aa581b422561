#!/usr/bin/env bash
# Times every input of the fuzz corpora, one at a time, through the same
# optimised fuzz binaries `.ci/fuzz-brief` builds, and prints per target the
# inputs run and the slowest ones (libFuzzer's own "Executed <file> in N ms"
# for each file given on its command line). A measurement, not a test: run
# it after a long fuzzing run has grown the corpora.
#
# Usage: fuzz/slowest.sh [dir with one sub-directory per target]
#        (default fuzz/corpus; e.g. a scratch directory of a long run)
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")"
root="${1:-corpus}"
if rustup run nightly rustc --version >/dev/null 2>&1; then
    fuzz=(cargo +nightly fuzz)
else
    export RUSTC_BOOTSTRAP=1
    fuzz=(cargo fuzz)
fi
"${fuzz[@]}" build -O -a -s none >/dev/null 2>&1
bin_dir=$(ls -d target/*/release | head -n 1)
for t in $("${fuzz[@]}" list); do
    dir="$root/$t"
    [ -d "$dir" ] || continue
    # Files in batches (argument length), each executed once and timed.
    find "$dir" -type f -print0 | xargs -0 -n 500 "$bin_dir/$t" -runs=1 2>&1 |
        sed -n 's/^Executed \(.*\) in \([0-9]*\) ms$/\2 \1/p' | sort -n >"/tmp/fuzz-slowest-$t.txt"
    n=$(wc -l <"/tmp/fuzz-slowest-$t.txt")
    max=$(tail -n 1 "/tmp/fuzz-slowest-$t.txt" | cut -d' ' -f1)
    over=$(awk '$1 > 10' "/tmp/fuzz-slowest-$t.txt" | wc -l)
    echo "$t: $n inputs, slowest ${max:-0} ms, over 10 ms: $over"
    awk '$1 > 10' "/tmp/fuzz-slowest-$t.txt" | tail -n 3 | sed 's/^/    /'
done
