#!/usr/bin/env bash
# bench/paths.sh — what path profiles cost: wall time of each workload natively and under
# hotpath in three modes, interleaved run by run (--no-monitor; the monitor with tables only,
# --no-paths; the monitor with paths, --paths), with the medians, the ratios paths / native,
# tables / native and paths / tables, the median times the guest waited for a full event ring
# in each monitored mode (totals.ring_waits of the JSON report), and what each ring event cost
# the monitor thread in each (totals.monitor_busy_ns / totals.events, medians; steadier than
# wall time on a noisy machine). The last line is the geometric mean of each ratio. Target
# (#21): paths / native <= 2 geomean and <= 4 on every workload. Besides the samples, two real
# programs: busybox_sort and busybox_gzip (sort / gzip -c of an 8 MiB text file, as in
# bench/run.sh; skipped without /bin/busybox).
#
# Usage: bench/paths.sh [-n RUNS] [-s "workload[:arg] ..."] [-r RECORDER] [-p "FLAGS"] [--no-build]
# (-r passes --paths-recorder RECORDER to the paths mode: sums or per-block; -p adds
# FLAGS to it, e.g. -p "--call-tree --pap-runs" for the profile's optional parts.)
# Environment: HOTPATH_BIN overrides the binary; CARGO_TARGET_DIR is honoured; BUSYBOX
# (default /bin/busybox).
set -euo pipefail
root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs=5
# Full-size runs (each sample's default argument, as in bench/run.sh: 0.3-0.6 s natively), so
# that fixed costs (path numbering at the end, a larger report) do not dominate.
samples="bench_sieve bench_crc bench_fib bench_nbody bench_interp busybox_sort busybox_gzip"
busybox="${BUSYBOX:-/bin/busybox}"
build=1
recorder=()
extra=()
while [ $# -gt 0 ]; do
    case "$1" in
        -n) runs="$2"; shift 2 ;;
        -s) samples="$2"; shift 2 ;;
        -r) recorder=(--paths-recorder "$2"); shift 2 ;;
        -p) read -r -a extra <<<"$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; exit 0 ;;
        *) echo "bench/paths.sh: unknown argument: $1" >&2; exit 2 ;;
    esac
done
target_dir="${CARGO_TARGET_DIR:-$root/target}"
if [ -n "${HOTPATH_BIN:-}" ]; then hotpath="$HOTPATH_BIN"; else
    [ "$build" = 1 ] && (cd "$root" && cargo build --release -q -p hotpath)
    hotpath="$target_dir/x86_64-unknown-linux-gnu/release/hotpath"
fi
work="$(mktemp -d)"; trap 'rm -rf "$work"' EXIT
median() { sort -n | awk '{a[NR]=$1} END {print (NR%2) ? a[(NR+1)/2] : (a[NR/2]+a[NR/2+1])/2}'; }
now() { date +%s.%N; }
modes="native nomon tables paths"
printf "%-14s %9s %10s %10s %10s %12s %13s %13s %12s %12s %11s %11s" sample native no-monitor tables paths paths/native tables/native paths/tables "waits(tab)" "waits(paths)" "ns/ev(tab)" "ns/ev(pth)"
echo
: >"$work/ratios"
for spec in $samples; do
    name="${spec%%:*}"; arg="${spec#*:}"; [ "$arg" = "$spec" ] && arg=""
    case "$name" in
        busybox_*)
            if [ ! -x "$busybox" ]; then
                echo "bench/paths.sh: $busybox not found: skipping $name (install busybox-static)" >&2
                continue
            fi
            input="$target_dir/bench-samples/busybox-input-8mib.txt"
            mkdir -p "$target_dir/bench-samples"
            "$root/bench/busybox-input.sh" 8 "$input"
            case "$name" in
                busybox_sort) exe="$busybox"; arg="sort $input" ;;
                *) exe="$busybox"; arg="gzip -c $input" ;;
            esac
            ;;
        *)
            exe="$work/$name"
            gcc -O2 -static -I"$root/guest-samples" -o "$exe" "$root/guest-samples/$name.c" -lm
            ;;
    esac
    for i in $(seq "$runs"); do
        for mode in $modes; do
            case $mode in
                native) t0=$(now); "$exe" $arg >/dev/null; t1=$(now); echo "$t1 - $t0" | bc >>"$work/$name.$mode"; continue ;;
                nomon) flags=(--no-monitor) ;; tables) flags=(--no-paths --report "$work/r.json") ;; paths) flags=(--paths "${recorder[@]}" "${extra[@]}" --report "$work/r.json") ;;
            esac
            t0=$(now); "$hotpath" run --quiet "${flags[@]}" -- "$exe" $arg >/dev/null; t1=$(now)
            echo "$t1 - $t0" | bc >>"$work/$name.$mode"
            if [ "$mode" != nomon ]; then
                python3 -c "import json,sys; t=json.load(open(sys.argv[1]))['totals']; print(t['ring_waits'], '%.2f' % (t['monitor_busy_ns'] / max(t['events'], 1)))" "$work/r.json" >"$work/tot"
                cut -d' ' -f1 "$work/tot" >>"$work/$name.$mode.waits"
                cut -d' ' -f2 "$work/tot" >>"$work/$name.$mode.nsev"
            fi
        done
    done
    x=$(median <"$work/$name.native"); n=$(median <"$work/$name.nomon"); t=$(median <"$work/$name.tables"); p=$(median <"$work/$name.paths")
    echo "$(echo "$p / $x" | bc -l) $(echo "$t / $x" | bc -l) $(echo "$p / $t" | bc -l)" >>"$work/ratios"
    printf "%-14s %8.3fs %9.3fs %9.3fs %9.3fs %11.2fx %12.2fx %12.2fx %12s %12s %11s %11s" "$name" "$x" "$n" "$t" "$p" \
        "$(echo "$p / $x" | bc -l)" "$(echo "$t / $x" | bc -l)" "$(echo "$p / $t" | bc -l)" \
        "$(median <"$work/$name.tables.waits")" "$(median <"$work/$name.paths.waits")" \
        "$(median <"$work/$name.tables.nsev")" "$(median <"$work/$name.paths.nsev")"
    echo
done
if [ -s "$work/ratios" ]; then
    awk '{for (i = 1; i <= 3; i++) g[i] += log($i)} END {printf "%-14s %9s %10s %10s %10s %11.2fx %12.2fx %12.2fx", "geomean", "", "", "", "", exp(g[1]/NR), exp(g[2]/NR), exp(g[3]/NR)}' "$work/ratios"
    echo
fi
