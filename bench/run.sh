#!/usr/bin/env bash
# bench/run.sh — wall-time benchmark of hotpath against native execution (and qemu-x86_64
# when it is installed) on the CPU-bound guest samples.
#
# Builds hotpath in release, compiles the bench_* samples with the same flags as the tests
# (gcc -O2, -static by default), then runs every sample N times in each mode, interleaved
# (native, hotpath --no-monitor, hotpath with the monitor, qemu; then again), so that drift
# in machine load hits all modes alike. Prints the median wall time of each mode and its
# ratio to native. A run whose stdout or exit status differs from native is reported as
# WRONG instead of timed.
#
# Usage: bench/run.sh [-n RUNS] [-l static|static-pie] [-s "sample ..."] [--no-build] [-h]
#   -n RUNS        runs per mode and sample (default 5; env BENCH_RUNS)
#   -l LINKAGE     static (default) or static-pie
#   -s SAMPLES     space-separated sample names (default: all bench_* samples)
#   --no-build     do not run cargo build (use HOTPATH_BIN or the existing release binary)
# Environment: HOTPATH_BIN overrides the hotpath binary; CARGO_TARGET_DIR is honoured;
#   QEMU (default qemu-x86_64) names the qemu user-mode binary; BENCH_TIMEOUT is the
#   seconds one run may take (default 600).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${BENCH_RUNS:-5}"
linkage=static
samples="bench_sieve bench_crc bench_fib bench_nbody bench_interp"
build=1
qemu="${QEMU:-qemu-x86_64}"
run_timeout="${BENCH_TIMEOUT:-600}"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        -n) runs="$2"; shift 2 ;;
        -l) linkage="$2"; shift 2 ;;
        -s) samples="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench/run.sh: unknown argument: $1 (try -h)" >&2; exit 2 ;;
    esac
done
case "$linkage" in static|static-pie) ;; *) echo "bench/run.sh: -l must be static or static-pie" >&2; exit 2 ;; esac
case "$runs" in ''|*[!0-9]*|0) echo "bench/run.sh: -n must be a positive integer" >&2; exit 2 ;; esac

target_dir="${CARGO_TARGET_DIR:-$root/target}"
case "$target_dir" in /*) ;; *) target_dir="$root/$target_dir" ;; esac

# 1. hotpath, in release.
if [ -n "${HOTPATH_BIN:-}" ]; then
    hotpath="$HOTPATH_BIN"
else
    if [ "$build" = 1 ]; then
        echo "building hotpath (release)..." >&2
        cargo build --release --manifest-path "$root/Cargo.toml" -p hotpath --bin hotpath >&2
    fi
    hotpath="$target_dir/release/hotpath"
fi
[ -x "$hotpath" ] || { echo "bench/run.sh: no hotpath binary at $hotpath" >&2; exit 1; }

# 2. The samples, with the flags the tests use (tests/guest_build.rs).
out_dir="$target_dir/bench-samples"
mkdir -p "$out_dir"
for s in $samples; do
    src="$root/guest-samples/$s.c"
    exe="$out_dir/$s.$linkage"
    [ -f "$src" ] || { echo "bench/run.sh: no sample $src" >&2; exit 1; }
    if [ ! -x "$exe" ] || [ "$src" -nt "$exe" ] || [ "$root/guest-samples/common.h" -nt "$exe" ]; then
        echo "compiling $s ($linkage)..." >&2
        gcc -O2 -Wall -Wextra "-$linkage" -pthread "-I$root/guest-samples" -o "$exe.tmp" "$src" -lm
        mv "$exe.tmp" "$exe"
    fi
done

modes=(native no-monitor monitor)
have_qemu=0
if command -v "$qemu" >/dev/null 2>&1; then
    have_qemu=1
    modes+=(qemu)
fi

# 3. Measure. One run: prints "<seconds> <status>" and leaves stdout in $tmp/out.<mode>.
tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

run_once() { # mode exe
    local mode="$1" exe="$2" start end status=0
    local -a cmd
    case "$mode" in
        native) cmd=("$exe") ;;
        no-monitor) cmd=("$hotpath" run --quiet --no-monitor -- "$exe") ;;
        monitor) cmd=("$hotpath" run --quiet -- "$exe") ;;
        qemu) cmd=("$qemu" "$exe") ;;
    esac
    start=$(date +%s%N)
    timeout --kill-after=5 "$run_timeout" "${cmd[@]}" >"$tmp/out.$mode" 2>"$tmp/err.$mode" </dev/null || status=$?
    end=$(date +%s%N)
    echo "$(( (end - start) / 1000 )) $status"
}

median() { # microsecond values on stdin -> median in microseconds
    sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "" } else if (NR % 2) { print v[(NR + 1) / 2] } else { print int((v[NR / 2] + v[NR / 2 + 1]) / 2) } }'
}

declare -A times wrong
echo "hotpath: $hotpath" >&2
echo "runs: $runs per mode, interleaved; linkage: $linkage; qemu: $([ $have_qemu = 1 ] && command -v "$qemu" || echo "not installed")" >&2
for s in $samples; do
    exe="$out_dir/$s.$linkage"
    # Reference output and status from one untimed native run (also warms the page cache).
    ref_status=0
    "$exe" >"$tmp/ref.out" 2>/dev/null </dev/null || ref_status=$?
    for mode in "${modes[@]}"; do times[$s,$mode]=""; wrong[$s,$mode]=""; done
    for ((i = 1; i <= runs; i++)); do
        for mode in "${modes[@]}"; do
            read -r us status < <(run_once "$mode" "$exe")
            if [ "$status" != "$ref_status" ]; then
                wrong[$s,$mode]="status $status"
            elif ! cmp -s "$tmp/ref.out" "$tmp/out.$mode"; then
                wrong[$s,$mode]="stdout"
            else
                times[$s,$mode]+="$us "
            fi
        done
        printf '.' >&2
    done
    printf ' %s\n' "$s" >&2
done

# 4. The table: median wall time per mode, and its ratio to native.
fmt_cell() { # microseconds native_microseconds
    awk -v t="$1" -v n="$2" 'BEGIN { if (n > 0) printf "%8.3f s %6.2fx", t / 1e6, t / n; else printf "%8.3f s %7s", t / 1e6, "" }'
}
printf '\n%-14s' "sample"
for mode in "${modes[@]}"; do printf ' | %-18s' "$mode"; done
[ $have_qemu = 1 ] || printf ' | %-18s' "qemu"
printf '\n%-14s' "--------------"
for mode in "${modes[@]}"; do printf ' | %-18s' "------------------"; done
[ $have_qemu = 1 ] || printf ' | %-18s' "------------------"
printf '\n'
for s in $samples; do
    native_med=$(printf '%s\n' ${times[$s,native]} | median)
    printf '%-14s' "$s"
    for mode in "${modes[@]}"; do
        if [ -n "${wrong[$s,$mode]}" ]; then
            printf ' | %-18s' "WRONG (${wrong[$s,$mode]})"
        else
            med=$(printf '%s\n' ${times[$s,$mode]} | median)
            if [ "$mode" = native ]; then
                printf ' | %-18s' "$(fmt_cell "$med" "$med")"
            else
                printf ' | %-18s' "$(fmt_cell "$med" "${native_med:-0}")"
            fi
        fi
    done
    [ $have_qemu = 1 ] || printf ' | %-18s' "n/a (not installed)"
    printf '\n'
done
printf '\nmedian wall time of %s runs; ratio = mode / native (lower is better).\n' "$runs"
any_wrong=0
for k in "${!wrong[@]}"; do [ -n "${wrong[$k]}" ] && any_wrong=1; done
if [ $any_wrong = 1 ]; then
    echo "WRONG: some runs' stdout or exit status differed from native; they are not timed." >&2
    exit 1
fi
