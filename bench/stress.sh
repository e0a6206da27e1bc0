#!/usr/bin/env bash
# bench/stress.sh — runs the suite's timing-sensitive tests (signals, threads, forks, the
# translation cache, the fault corpus) ROUNDS times beside two CPU burners and prints every
# failure: a test that fails once in a few hundred runs shows up here, not in CI.
#
# Each round runs these test groups (cargo test filters, release build):
#   samples:  every signal_*, sig*, thread_*, fork_*, hole_reuse and superblock_fault sample
#             (native vs hotpath, monitor off/on, eager superblocks, every linkage)
#   translation_cache, faults: the whole test files (the cache's concurrent writers, the
#             fault corpus's traps and signals)
#   races:    guest-samples/thread_races.c run directly under hotpath, -r RACE_RUNS times
#             per round and mode (threads that end while others join them or wait on their
#             tid, exit_group while threads start and end, forks from threads while others
#             start and end, process-directed signals as the thread taking them exits),
#             each run with a timeout, compared with the native output
# Any other test file of tests/tests can be named as a group too (-g "threads counts").
# A test's failure output goes to $out/round-N-GROUP.log; the summary names each failing
# test with the rounds it failed in. Exit status 1 if anything failed.
#
# Usage: bench/stress.sh [-n ROUNDS] [-r RACE_RUNS] [-g "GROUP ..."] [--no-burners] [-h]
#   -n ROUNDS      rounds (default 20)
#   -r RACE_RUNS   runs of each race case per round and mode (default 3)
#   -g GROUPS      the groups to run (default: samples translation_cache faults races)
#   --no-burners   run without the two CPU burners
# Environment: CARGO_TARGET_DIR is honoured; STRESS_OUT names the log directory (default a
#   new one under /tmp).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
rounds=20
race_runs=3
groups="samples translation_cache faults races"
burners=2

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        -n) rounds="$2"; shift 2 ;;
        -r) race_runs="$2"; shift 2 ;;
        -g) groups="$2"; shift 2 ;;
        --no-burners) burners=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "stress.sh: unknown argument $1" >&2; usage >&2; exit 2 ;;
    esac
done

out="${STRESS_OUT:-$(mktemp -d /tmp/hotpath-stress.XXXXXX)}"
mkdir -p "$out"
cd "$root"

echo "stress: building (release)"
cargo build --release --quiet
cargo test --release --quiet -p hotpath-e2e --no-run 2>/dev/null
target="${CARGO_TARGET_DIR:-$root/target}"
hotpath="$target/x86_64-unknown-linux-gnu/release/hotpath"
[ -x "$hotpath" ] || hotpath="$target/release/hotpath"

# The race sample, built as the tests build samples (static and dynamic).
race_src="$root/guest-samples/thread_races.c"
race_bin="$out/thread_races"
gcc -O2 -Wall -Wextra -static -pthread -I"$root/guest-samples" -o "$race_bin.static" "$race_src" -lm
gcc -O2 -Wall -Wextra -pthread -I"$root/guest-samples" -o "$race_bin.dynamic" "$race_src" -lm
race_cases="join exit fork signal"

pids=()
stop_burners() { for p in "${pids[@]:-}"; do [ -n "$p" ] && kill "$p" 2>/dev/null || true; done; }
trap stop_burners EXIT
for _ in $(seq 1 "$burners"); do
    (while :; do :; done) &
    pids+=($!)
done
echo "stress: $rounds rounds of [$groups], $burners CPU burners, logs in $out"

declare -A failed=()
nfailed=0
record() { # record TEST ROUND
    [ -n "${failed["$1"]:-}" ] || nfailed=$((nfailed + 1))
    failed["$1"]="${failed["$1"]:-}${failed["$1"]:+ }$2"
}

run_group() { # run_group ROUND GROUP
    local round="$1" group="$2" log="$out/round-$1-$2.log" rc=0
    case "$group" in
        samples)
            cargo test --release -q -p hotpath-e2e --test samples -- \
                signal_ sig thread_ fork_ hole_reuse superblock_fault >"$log" 2>&1 || rc=$? ;;
        races)
            : >"$log"
            for linkage in static dynamic; do
                for c in $race_cases; do
                    local want
                    want="$("$race_bin.$linkage" "$c" 2>&1; echo "status $?")"
                    for mode in "" "--no-monitor" "--superblock-threshold 1"; do
                        for _ in $(seq 1 "$race_runs"); do
                            local got
                            # shellcheck disable=SC2086
                            got="$(timeout 60 "$hotpath" run --quiet $mode -- "$race_bin.$linkage" "$c" 2>&1; echo "status $?")"
                            if [ "$got" != "$want" ]; then
                                echo "race $c ($linkage, ${mode:-monitor}): got [$got] want [$want]" >>"$log"
                                rc=1
                            fi
                        done
                    done
                done
            done ;;
        *)
            cargo test --release -q -p hotpath-e2e --test "$group" >"$log" 2>&1 || rc=$? ;;
    esac
    if [ "$rc" -ne 0 ]; then
        local names
        if [ "$group" = races ]; then
            names="$(sed -n 's/^race \([a-z]*\) (\([^,]*\), \([^)]*\)).*/races::\1.\2 (\3)/p' "$log" | sort -u)"
        else
            # A failing test's section header (`---- NAME stdout ----`), in quiet and verbose
            # output alike.
            names="$(sed -n -E 's/^---- (.*) stdout ----$/\1/p' "$log" | sort -u)"
        fi
        [ -n "$names" ] || names="$group (status $rc, see the log)"
        while IFS= read -r n; do
            case "$n" in "$group::"*|races::*) ;; *) n="$group::$n" ;; esac
            record "$n" "$round"
        done <<<"$names"
        echo "  round $round: $group FAILED (see $log)"
    else
        rm -f "$log"
    fi
}

start=$(date +%s)
for round in $(seq 1 "$rounds"); do
    t0=$(date +%s)
    for g in $groups; do
        run_group "$round" "$g"
    done
    echo "stress: round $round done in $(( $(date +%s) - t0 )) s"
done

echo
echo "stress: $rounds rounds in $(( $(date +%s) - start )) s, $burners CPU burners"
if [ "$nfailed" -eq 0 ]; then
    echo "stress: 0 failures"
    exit 0
fi
echo "stress: failures (test: rounds it failed in)"
for t in "${!failed[@]}"; do
    echo "  $t: ${failed[$t]}"
done | sort
exit 1
