#!/usr/bin/env bash
# bench/recorder-instructions.sh — what the monitor's per-event work costs in instructions,
# counted by valgrind's callgrind: exact and repeatable, where wall time on a noisy machine
# moves by 10-20 % from run to run. For each guest sample (built static-pie: valgrind keeps
# 0x400000 for itself, where a non-PIE guest would have to go), hotpath runs under callgrind
# with --paths and --no-superblocks (one event per basic block, so the event stream, and the
# count, do not depend on when a superblock was built), and the script prints the guest
# instructions per ring event of the tables (Tables::record, or Tables::record_with_repeats
# where it exists, inclusive) and of the path recorder
# (PathRecorder::record, inclusive), and their ratio. Given two binaries it prints both side
# by side with the ratio new / old: the way to compare a change to the recorder. Instruction
# counts are not time (a mispredicted branch or a cache miss costs more than an instruction),
# so a change that saves instructions is then timed with HOTPATH_REPLAY (README).
#
# Usage: bench/recorder-instructions.sh [-s "sample[:arg] ..."] [OLD_BIN] [NEW_BIN]
# Default binary: target/x86_64-unknown-linux-gnu/release/hotpath (CARGO_TARGET_DIR honoured; built if missing).
# Default samples: bench_fib:24 bench_interp:30 bench_sieve:2000000 funcptr_qsort (about
# 10-20 s each under callgrind).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
samples="bench_fib:24 bench_interp:30 bench_sieve:2000000 funcptr_qsort"
while [ $# -gt 0 ]; do
    case "$1" in
        -s) samples="$2"; shift 2 ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        -*) echo "bench/recorder-instructions.sh: unknown option: $1" >&2; exit 2 ;;
        *) break ;;
    esac
done
command -v valgrind >/dev/null || { echo "bench/recorder-instructions.sh: valgrind not installed" >&2; exit 1; }
if [ $# -eq 0 ]; then
    bin="${CARGO_TARGET_DIR:-$root/target}/x86_64-unknown-linux-gnu/release/hotpath"
    [ -x "$bin" ] || (cd "$root" && cargo build --release -q -p hotpath)
    set -- "$bin"
fi
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT

# Prints "events tables_ir paths_ir" for one binary and one guest run.
measure() {
    local bin="$1"; shift
    valgrind --tool=callgrind --smc-check=all --callgrind-out-file="$work/cg.out" \
        "$bin" run --quiet --paths --no-superblocks --report "$work/r.json" -- "$@" \
        >/dev/null 2>"$work/err" || { cat "$work/err" >&2; return 1; }
    local events
    events=$(grep -o '"events": *[0-9]*' "$work/r.json" | grep -o '[0-9]*$')
    callgrind_annotate --inclusive=yes "$work/cg.out" 2>/dev/null | awk -v ev="$events" '
        # Inclusive totals: the first line naming each function in its own file.
        # With paths on, newer binaries feed the tables through Tables::record_with_repeats
        # (which calls Tables::record and counts the repeat runs of the recorder at once).
        t == "" && /\/tables\.rs:hotpath_monitor::tables::Tables::record( |$)/ { gsub(",", "", $1); t = $1 }
        r == "" && /\/tables\.rs:hotpath_monitor::tables::Tables::record_with_repeats( |$)/ { gsub(",", "", $1); r = $1 }
        p == "" && /\/paths\.rs:hotpath_monitor::paths::PathRecorder::record( |$)/ { gsub(",", "", $1); p = $1 }
        END { if (r != "") t = r; printf "%d %.1f %.1f\n", ev, t / ev, p / ev }'
}

printf "%-16s %10s" sample events
for b in "$@"; do printf " %14s %14s" "tables/ev" "paths/ev"; done
[ $# -eq 2 ] && printf " %10s" "new/old"
printf "\n"
for spec in $samples; do
    name="${spec%%:*}"; arg="${spec#*:}"; [ "$arg" = "$spec" ] && arg=""
    exe="$work/$name"
    gcc -O2 -static-pie -I"$root/guest-samples" -o "$exe" "$root/guest-samples/$name.c" -lm
    line=$(printf "%-16s" "$name")
    first=""
    for b in "$@"; do
        read -r events tables paths < <(measure "$b" "$exe" $arg)
        [ -z "$first" ] && { line+=$(printf " %10s" "$events"); first="$paths"; }
        line+=$(printf " %14s %14s" "$tables" "$paths")
    done
    [ $# -eq 2 ] && line+=$(awk -v a="$first" -v b="$paths" 'BEGIN { printf " %9.3fx", b / a }')
    echo "$line"
done
