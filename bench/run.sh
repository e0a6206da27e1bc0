#!/usr/bin/env bash
# bench/run.sh — wall-time benchmark of hotpath against native execution (and qemu-x86_64
# when it is installed) on the CPU-bound guest samples and on busybox-static workloads.
#
# Builds hotpath in release, compiles the bench_* samples with the same flags as the tests
# (gcc -O2, -static by default), generates a deterministic text file for the busybox workloads
# (sort and gzip -c, when /bin/busybox exists), then runs every workload N times in each mode,
# interleaved (native, hotpath --no-monitor, with the monitor, with --paths, qemu; then again), so
# that drift in machine load hits all modes alike. Prints the median wall time of each mode
# and its ratio to native, the cost of the monitor (monitor / --no-monitor), and the share of
# the monitor run's wall time the guest spent waiting for a full event ring (from the run's
# raw profile, rendered after it: totals.ring_wait_ns, median over runs). A run whose stdout or exit status
# differs from native is reported as WRONG instead of timed.
#
# Usage: bench/run.sh [-n RUNS] [-l static|static-pie] [-s "workload ..."] [--mib N]
#                     [--no-build] [-h]
#   -n RUNS        runs per mode and workload (default 5; env BENCH_RUNS)
#   -l LINKAGE     static (default) or static-pie (the samples; busybox is what it is)
#   -s WORKLOADS   space-separated names (default: all bench_* samples (bench_threads: two
#                  threads at once; bench_deep: deep recursion), busybox_sort,
#                  busybox_gzip, busybox_awk (a field-counting script), busybox_sh (a shell
#                  loop that forks and execs `busybox expr` 300 times), startup
#                  (`busybox true`, 100 separate runs: each mode's start-up and exit cost),
#                  coreutils_sh (a bash loop running GNU ls, date and cat 30 times each:
#                  short dynamically linked processes that close their stderr at exit),
#                  and the dynamically linked python3 (a script), py_text (another python3
#                  script: regular expressions, a Counter, classes), python3_pass
#                  (`python3 -c pass`: startup), py_threads_seq (python3 starting and joining
#                  200 threads one after another), py_threads_16 (16 python3 threads running
#                  the same loop at once), sqlite3 (a recursive CTE), lua (lua5.4), lua_oop
#                  (another lua script: metatables, string building, a recursive search),
#                  zstd_t2 (`zstd -T2 -5` on 22 MiB of random text: two compression threads)
#                  and gcc_zstd (a big program: `gcc -O2 -S` of 16,000 preprocessed lines of
#                  zstd 1.5.6's amalgamation, fetched once from PyPI's zstandard 0.23.0 sdist
#                  with pip; the assembly on stdout must equal native's), make_j2 (`make -j2`
#                  of Brotli 1.1.0's C library, 31 sources, from PyPI's sdist; every object
#                  must equal native's) and two_procs (two busybox gzip processes at once))
#   --mib N        size of the busybox input in MiB (default 8)
#   --no-build     do not run cargo build (use HOTPATH_BIN or the existing release binary)
# Environment: HOTPATH_BIN overrides the hotpath binary; CARGO_TARGET_DIR is honoured;
#   QEMU (default qemu-x86_64) names the qemu user-mode binary (its column is n/a for the
#   workloads that exec their work: without binfmt_misc qemu runs only the first program);
#   BENCH_TIMEOUT is the seconds one run may take (default 600); BUSYBOX (default
#   /bin/busybox).
set -euo pipefail

root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
runs="${BENCH_RUNS:-5}"
linkage=static
workloads="bench_sieve bench_crc bench_fib bench_nbody bench_interp bench_threads bench_deep busybox_sort busybox_gzip busybox_awk busybox_sh startup coreutils_sh python3 py_text python3_pass py_threads_seq py_threads_16 sqlite3 lua lua_oop zstd_t2 gcc_zstd make_j2 two_procs"
build=1
mib=8
qemu="${QEMU:-qemu-x86_64}"
busybox="${BUSYBOX:-/bin/busybox}"
run_timeout="${BENCH_TIMEOUT:-600}"

usage() { sed -n '2,/^set -euo/p' "$0" | sed '$d; s/^# \{0,1\}//'; }

while [ $# -gt 0 ]; do
    case "$1" in
        -n) runs="$2"; shift 2 ;;
        -l) linkage="$2"; shift 2 ;;
        -s) workloads="$2"; shift 2 ;;
        --mib) mib="$2"; shift 2 ;;
        --no-build) build=0; shift ;;
        -h|--help) usage; exit 0 ;;
        *) echo "bench/run.sh: unknown argument: $1 (try -h)" >&2; exit 2 ;;
    esac
done
case "$linkage" in static|static-pie) ;; *) echo "bench/run.sh: -l must be static or static-pie" >&2; exit 2 ;; esac
case "$runs" in ''|*[!0-9]*|0) echo "bench/run.sh: -n must be a positive integer" >&2; exit 2 ;; esac
case "$mib" in ''|*[!0-9]*|0) echo "bench/run.sh: --mib must be a positive integer" >&2; exit 2 ;; esac

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
    hotpath="$target_dir/x86_64-unknown-linux-gnu/release/hotpath"
fi
[ -x "$hotpath" ] || { echo "bench/run.sh: no hotpath binary at $hotpath" >&2; exit 1; }

tmp="$(mktemp -d)"
trap 'rm -rf "$tmp"' EXIT

# 2. The workloads: a command line each (an executable and its arguments).
out_dir="$target_dir/bench-samples"
mkdir -p "$out_dir"
declare -A argv reps
selected=""
for w in $workloads; do
    case "$w" in
        bench_*)
            src="$root/guest-samples/$w.c"
            exe="$out_dir/$w.$linkage"
            [ -f "$src" ] || { echo "bench/run.sh: no sample $src" >&2; exit 1; }
            if [ ! -x "$exe" ] || [ "$src" -nt "$exe" ] || [ "$root/guest-samples/common.h" -nt "$exe" ]; then
                echo "compiling $w ($linkage)..." >&2
                gcc -O2 -Wall -Wextra "-$linkage" -pthread "-I$root/guest-samples" -o "$exe.tmp" "$src" -lm
                mv "$exe.tmp" "$exe"
            fi
            argv[$w]="$exe"
            ;;
        busybox_sort|busybox_gzip|busybox_awk|busybox_sh|startup)
            if [ ! -x "$busybox" ]; then
                echo "bench/run.sh: $busybox not found: skipping $w (install busybox-static)" >&2
                continue
            fi
            input="$out_dir/busybox-input-${mib}mib.txt"
            "$root/bench/busybox-input.sh" "$mib" "$input"
            case "$w" in
                busybox_sort) argv[$w]="$busybox sort $input" ;;
                busybox_gzip) argv[$w]="$busybox gzip -c $input" ;;
                busybox_awk)
                    script="$out_dir/bench.awk"
                    cat >"$script" <<'AWK'
{ n[$1]++; s += $2 % 1000; w[substr($3, 1, 2)] += length($0) }
END { for (k in n) print k, n[k]; for (k in w) t += w[k]; print s, t }
AWK
                    argv[$w]="$busybox awk -f $script $input" ;;
                busybox_sh)
                    script="$out_dir/bench.sh"
                    cat >"$script" <<SH
i=0
while [ \$i -lt 300 ]; do i=\$($busybox expr \$i + 1); done
echo \$i
SH
                    argv[$w]="$busybox sh $script" ;;
                startup) argv[$w]="$busybox true"; reps[$w]=100 ;;
            esac
            ;;
        python3|py_text|python3_pass|py_threads_seq|py_threads_16|sqlite3|lua|lua_oop|zstd_t2)
            # Dynamically linked programs from Debian (installed by .ci/setup).
            case "$w" in
                python3*|py_*) prog=python3 ;;
                sqlite3) prog=sqlite3 ;;
                lua*) prog=lua5.4 ;;
                zstd_t2) prog=zstd ;;
            esac
            prog_path=$(command -v "$prog" || true)
            # A pyenv shim or the like is a script: bench the system's binary.
            [ -x "/usr/bin/$prog" ] && prog_path="/usr/bin/$prog"
            if [ -z "$prog_path" ]; then
                echo "bench/run.sh: $prog not found: skipping $w (run .ci/setup)" >&2
                continue
            fi
            case "$w" in
                python3)
                    script="$out_dir/bench.py"
                    cat >"$script" <<'PY'
import hashlib, json, zlib
d = {}
for i in range(200000):
    d[str(i)] = i * i % 1009
s = json.dumps(d)
print(len(zlib.compress(s.encode())), hashlib.sha256(s.encode()).hexdigest()[:16])
print(sum(sorted(d.values())[::1000]))
PY
                    argv[$w]="$prog_path $script" ;;
                py_text)
                    # Another script than the bench's own: regular expressions, a Counter,
                    # method calls through a class hierarchy.
                    script="$out_dir/text.py"
                    cat >"$script" <<'PY'
import collections, re
words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"]
x = 12345
lines = []
for i in range(40000):
    x = (x * 1103515245 + 12345) % 2147483648
    lines.append(" ".join(words[(x >> s) % 8] + str((x >> s) % 13) for s in (3, 7, 11, 15, 19)))
text = "\n".join(lines)
counts = collections.Counter(re.findall(r"[a-z]+\d+", text))
class Shape:
    def area(self):
        raise NotImplementedError
class Rect(Shape):
    def __init__(self, w, h):
        self.w, self.h = w, h
    def area(self):
        return self.w * self.h
class Tri(Shape):
    def __init__(self, b, h):
        self.b, self.h = b, h
    def area(self):
        return self.b * self.h / 2
shapes = [Rect(i % 7 + 1, i % 5 + 1) if i % 3 else Tri(i % 11 + 1, i % 4 + 1) for i in range(150000)]
total = sum(s.area() for s in shapes)
print(len(counts), counts.most_common(3), f"{total:.1f}")
print(" ".join(sorted(set(text[:2000].split())))[:60])
PY
                    argv[$w]="$prog_path $script" ;;
                python3_pass) argv[$w]="$prog_path -c pass" ;;
                py_threads_seq)
                    # A thread's start and end: each one does next to nothing.
                    script="$out_dir/threads_seq.py"
                    cat >"$script" <<'PY'
import threading
done = []
for i in range(200):
    t = threading.Thread(target=done.append, args=(i,))
    t.start()
    t.join()
print(len(done), sum(done))
PY
                    argv[$w]="$prog_path $script" ;;
                py_threads_16)
                    # Threads at once: the GIL hands the loop from thread to thread.
                    script="$out_dir/threads_16.py"
                    cat >"$script" <<'PY'
import threading
out = [0] * 16
def loop(k):
    s = 0
    for i in range(100000):
        s += (i * k) % 7
    out[k] = s
ts = [threading.Thread(target=loop, args=(k,)) for k in range(16)]
for t in ts:
    t.start()
for t in ts:
    t.join()
print(sum(out))
PY
                    argv[$w]="$prog_path $script" ;;
                sqlite3)
                    script="$out_dir/bench.sql"
                    cat >"$script" <<'SQL'
WITH RECURSIVE c(x, y) AS (SELECT 1, 1 UNION ALL SELECT x + 1, (y * 31 + x) % 1000003 FROM c WHERE x < 1000000)
SELECT count(*), sum(y), max(y) FROM c;
SQL
                    argv[$w]="$prog_path -init $script :memory: .quit" ;;
                lua)
                    script="$out_dir/bench.lua"
                    cat >"$script" <<'LUA'
local t = {}
for i = 1, 2000000 do t[i] = (i * 7919) % 1000003 end
table.sort(t)
local s = 0
for i = 1, #t, 97 do s = s + t[i] end
print(s)
LUA
                    argv[$w]="$prog_path $script" ;;
                lua_oop)
                    # Another script than the bench's own: metatables and method calls, string
                    # building and matching, a recursive search.
                    script="$out_dir/oop.lua"
                    cat >"$script" <<'LUA'
local Point = {}
Point.__index = Point
function Point.new(x, y) return setmetatable({x = x, y = y}, Point) end
function Point:add(o) return Point.new(self.x + o.x, self.y + o.y) end
local acc = Point.new(0, 0)
for i = 1, 600000 do acc = acc:add(Point.new(i % 7, i % 11)) end
local parts = {}
for i = 1, 200000 do parts[#parts + 1] = string.format("%d:%s", i, string.rep("x", i % 5)) end
local s = table.concat(parts, ",")
local n = 0
for _ in s:gmatch("%d+:xx,") do n = n + 1 end
local function queens(size)
  local count, cols = 0, {}
  local function ok(r, c)
    for pr = 1, r - 1 do
      local pc = cols[pr]
      if pc == c or math.abs(pc - c) == r - pr then return false end
    end
    return true
  end
  local function place(r)
    if r > size then count = count + 1; return end
    for c = 1, size do
      if ok(r, c) then cols[r] = c; place(r + 1) end
    end
  end
  place(1)
  return count
end
print(acc.x, acc.y, #s, n, queens(8))
LUA
                    argv[$w]="$prog_path $script" ;;
                zstd_t2)
                    # Random lines compress to about half: zstd's two workers have work to do.
                    input="$out_dir/zstd-input.txt"
                    if [ ! -s "$input" ]; then
                        echo "generating $input (22 MiB of random text lines)..." >&2
                        awk 'BEGIN { srand(7); for (i = 0; i < 1000000; i++)
                            printf "%d %x %s\n", int(rand() * 1e9), int(rand() * 2^31),
                                substr("abcdefghijklmnopqrstuvwxyz", int(rand() * 20) + 1, int(rand() * 6) + 1) }' \
                            >"$input.tmp"
                        mv "$input.tmp" "$input"
                    fi
                    argv[$w]="$prog_path -q -c -T2 -5 $input" ;;
            esac
            ;;
        gcc_zstd)
            # A compiler on a big file: cc1 runs a quarter of a million distinct blocks.
            input="$out_dir/zstd-16k.i"
            if [ ! -s "$input" ]; then
                echo "fetching zstandard 0.23.0 from PyPI and preprocessing zstd.c..." >&2
                if ! python3 -m pip download -q --no-binary :all: --no-deps zstandard==0.23.0 \
                        -d "$tmp/sdist" >&2 \
                    || ! tar xzf "$tmp/sdist/zstandard-0.23.0.tar.gz" -C "$tmp" \
                    || ! gcc -E -P "$tmp/zstandard-0.23.0/zstd/zstd.c" -o "$tmp/zstd.i"; then
                    echo "bench/run.sh: cannot fetch or preprocess zstandard: skipping $w" >&2
                    continue
                fi
                # Up to the last top-level closing brace before line 16,000.
                cut=$(awk 'NR <= 16000 && /^}/ { n = NR } END { print n }' "$tmp/zstd.i")
                head -n "$cut" "$tmp/zstd.i" >"$input.tmp"
                mv "$input.tmp" "$input"
            fi
            argv[$w]="$(command -v gcc) -O2 -S -o - $input"
            ;;
        make_j2)
            # A build: `make -j2` of Brotli 1.1.0's C library (31 sources, gcc -O2), from
            # PyPI's sdist, fetched once. Every process of it (make, gcc, cc1, as) runs under
            # hotpath; stdout lists each object's sha256, which must equal native's.
            src="$out_dir/Brotli-1.1.0"
            if [ ! -d "$src/c/enc" ]; then
                echo "fetching Brotli 1.1.0 from PyPI..." >&2
                if ! python3 -m pip download -q --no-binary :all: --no-deps Brotli==1.1.0 \
                        -d "$tmp/brotli" >&2 \
                    || ! tar xzf "$tmp/brotli/Brotli-1.1.0.tar.gz" -C "$out_dir"; then
                    echo "bench/run.sh: cannot fetch Brotli: skipping $w" >&2
                    continue
                fi
            fi
            cat >"$out_dir/brotli.mk" <<'MK'
SRC := $(wildcard $(S)/c/common/*.c $(S)/c/dec/*.c $(S)/c/enc/*.c)
OBJ := $(patsubst $(S)/c/%.c,%.o,$(SRC))
all: $(OBJ)
$(OBJ): %.o: $(S)/c/%.c
	@mkdir -p $(dir $@)
	@gcc -O2 -I$(S)/c/include -c $< -o $@
MK
            script="$out_dir/make_j2.sh"
            cat >"$script" <<SH
d=\$(mktemp -d) && cd "\$d" || exit 1
make -s -j2 -f "$out_dir/brotli.mk" S="$src" || exit 1
find . -name '*.o' | sort | xargs sha256sum
cd / && rm -rf "\$d"
SH
            argv[$w]="/bin/sh $script" ;;
        coreutils_sh)
            # Short dynamically linked processes from a bash loop: GNU ls, date and cat, which
            # close their stderr at exit (coreutils' close_stdout), 30 times each.
            script="$out_dir/coreutils.sh"
            cat >"$script" <<'SH'
for i in $(seq 30); do ls / >/dev/null; date +%Y >/dev/null; cat /etc/hostname >/dev/null; done
echo done
SH
            argv[$w]="/bin/bash $script" ;;
        two_procs)
            # Two processes at once on two cores (two monitors beside two guests): busybox
            # gzip of the input, twice, from one shell; stdout is both outputs' checksums.
            if [ ! -x "$busybox" ]; then
                echo "bench/run.sh: $busybox not found: skipping $w" >&2
                continue
            fi
            input="$out_dir/busybox-input-${mib}mib.txt"
            "$root/bench/busybox-input.sh" "$mib" "$input"
            script="$out_dir/two_procs.sh"
            cat >"$script" <<SH
d=\$(mktemp -d) || exit 1
$busybox gzip -c "$input" >"\$d/a" & $busybox gzip -c "$input" >"\$d/b" & wait
cksum <"\$d/a"; cksum <"\$d/b"
rm -rf "\$d"
SH
            argv[$w]="/bin/sh $script" ;;
        *) echo "bench/run.sh: unknown workload $w" >&2; exit 2 ;;
    esac
    selected+="$w "
done
[ -n "$selected" ] || { echo "bench/run.sh: no workload to run" >&2; exit 1; }

# The hotpath modes read and write a translation cache of their own, warmed by one untimed run
# of each mode before the timed ones (what a user's second run of a program sees); `cold` is
# the shipped mode with `--no-cache` (every block translated, as on a first run); `paths` is
# the shipped mode with `--paths` (the path profile besides the tables; warm cache).
modes=(native no-monitor no-sb monitor paths cold)
cache="$tmp/cache"
mkdir -m 700 "$cache"
have_qemu=0
if command -v "$qemu" >/dev/null 2>&1; then
    have_qemu=1
    modes+=(qemu)
fi

# 3. Measure. One run: prints "<microseconds> <status> <ring wait ns>" and leaves stdout in
# $tmp/out.<mode>. The monitor modes write a raw profile per process (`--profile`, as a user
# of the profile would, so that `sb gain` compares superblocks alone; `hotpath report`
# renders it later); the monitor mode's, rendered after the timing, gives the time spent on
# a full ring and the monitor's CPU time.
run_once() { # mode workload
    local mode="$1" w="$2" start end status=0 wait_ns=0 cpu_ns=0 share=-1
    local -a cmd
    read -r -a cmd <<<"${argv[$w]}"
    case "$mode" in
        native) ;;
        no-monitor) cmd=("$hotpath" run --quiet --cache-dir "$cache" --no-monitor -- "${cmd[@]}") ;;
        no-sb) cmd=("$hotpath" run --quiet --cache-dir "$cache" --no-superblocks --profile "$tmp/profile-no-sb.raw" -- "${cmd[@]}") ;;
        monitor) rm -f "$tmp"/profile.raw*; cmd=("$hotpath" run --quiet --cache-dir "$cache" --profile "$tmp/profile.raw" -- "${cmd[@]}") ;;
        paths) cmd=("$hotpath" run --quiet --cache-dir "$cache" --paths -- "${cmd[@]}") ;;
        cold) cmd=("$hotpath" run --quiet --no-cache --profile "$tmp/profile-cold.raw" -- "${cmd[@]}") ;;
        qemu) cmd=("$qemu" "${cmd[@]}") ;;
    esac
    start=$(date +%s%N)
    for ((r = 0; r < ${reps[$w]:-1}; r++)); do
        timeout --kill-after=5 "$run_timeout" "${cmd[@]}" >"$tmp/out.$mode" 2>"$tmp/err.$mode" </dev/null || status=$?
    done
    end=$(date +%s%N)
    if [ "$mode" = monitor ]; then
        # The CPU time of every process of the run (this subshell's children, waited for).
        times >"$tmp/times.$mode" # (not in a pipeline: a subshell has no children's times)
        cpu_ns=$(awk 'NR == 2 { t = 0; for (i = 1; i <= 2; i++) { split($i, p, /[ms]/); t += p[1] * 60 + p[2] } printf "%.0f", t * 1e9 }' "$tmp/times.$mode")
        # totals.ring_wait_ns (each thread in `threads` has one too); the monitor's busy time
        # over every process's profile (a child writes PROFILE.PID, an exec'd program
        # PROFILE.exec) as a share of the rest of the CPU time, the guest's.
        rm -f "$tmp"/report.json*
        for f in "$tmp"/profile.raw*; do
            [ -e "$f" ] && printf '%s\0' "$f"
        done | xargs -0 -r -P 2 -I{} sh -c '"$1" report -q "$2" --json "$3/report.json${2#"$3"/profile.raw}"' _ "$hotpath" {} "$tmp"
        read -r wait_ns share < <(python3 -c '
import glob, json, sys
reports = [json.load(open(f))["totals"] for f in sorted(glob.glob(sys.argv[1] + "*"))]
busy = sum(t["monitor_busy_ns"] for t in reports)
guest = int(sys.argv[2]) - busy
print(reports[0]["ring_wait_ns"], "%.4f" % (100 * busy / guest) if guest > 0 else -1)
' "$tmp/report.json" "$cpu_ns" 2>/dev/null || true)
        wait_ns=${wait_ns:--1}
        share=${share:--1}
    fi
    echo "$(( (end - start) / 1000 )) $status $wait_ns $share"
}

median() { # values on stdin -> median
    sort -n | awk '{ v[NR] = $1 } END { if (NR == 0) { print "" } else if (NR % 2) { print v[(NR + 1) / 2] } else { print (v[NR / 2] + v[NR / 2 + 1]) / 2 } }'
}

declare -A times wrong waits shares
# Workloads whose work is done by programs they exec: qemu-x86_64 translates only the first
# program (without binfmt_misc the kernel runs the exec'd ones natively), so its column would
# time native children.
execs_children=" busybox_sh coreutils_sh gcc_zstd make_j2 two_procs "
echo "hotpath: $hotpath" >&2
echo "runs: $runs per mode, interleaved; linkage: $linkage; qemu: $([ $have_qemu = 1 ] && command -v "$qemu" || echo "not installed")" >&2
for w in $selected; do
    # Reference output and status from one untimed native run (also warms the page cache).
    ref_status=0
    ${argv[$w]} >"$tmp/ref.out" 2>/dev/null </dev/null || ref_status=$?
    for mode in "${modes[@]}"; do times[$w,$mode]=""; wrong[$w,$mode]=""; done
    waits[$w]=""
    shares[$w]=""
    # Warm the translation cache: one untimed run of each mode that uses it.
    for mode in no-monitor no-sb monitor paths; do run_once "$mode" "$w" >/dev/null; done
    for ((i = 1; i <= runs; i++)); do
        for mode in "${modes[@]}"; do
            [ "$mode" = qemu ] && [[ "$execs_children" == *" $w "* ]] && continue
            read -r us status wait_ns share < <(run_once "$mode" "$w")
            if [ "$status" != "$ref_status" ]; then
                wrong[$w,$mode]="status $status"
            elif ! cmp -s "$tmp/ref.out" "$tmp/out.$mode"; then
                wrong[$w,$mode]="stdout"
            else
                times[$w,$mode]+="$us "
                if [ "$mode" = monitor ]; then
                    # Share of this run's wall time spent waiting for ring room, in percent.
                    if [ "$wait_ns" -ge 0 ]; then
                        waits[$w]+="$(awk -v n="$wait_ns" -v us="$us" 'BEGIN { printf "%.4f", (us > 0 ? n / 10 / us : 0) }') "
                    else
                        waits[$w]+="nan "
                    fi
                    shares[$w]+="$share "

                fi
            fi
        done
        printf '.' >&2
    done
    printf ' %s\n' "$w" >&2
done

# 4. The table: median wall time per mode and its ratio to native; the monitor's cost as a
# ratio to --no-monitor; the median share of wall time the guest waited for a full ring.
fmt_cell() { # microseconds native_microseconds
    awk -v t="$1" -v n="$2" 'BEGIN { if (n > 0) printf "%8.3f s %6.2fx", t / 1e6, t / n; else printf "%8.3f s %7s", t / 1e6, "" }'
}
printf '\n%-14s' "workload"
for mode in "${modes[@]}"; do printf ' | %-18s' "$mode"; done
[ $have_qemu = 1 ] || printf ' | %-18s' "qemu"
printf ' | %-11s | %-11s | %-11s | %-9s | %-9s\n' "mon/no-mon" "sb gain" "paths/mon" "ring wait" "mon cpu"
printf '%-14s' "--------------"
for mode in "${modes[@]}"; do printf ' | %-18s' "------------------"; done
[ $have_qemu = 1 ] || printf ' | %-18s' "------------------"
printf ' | %-11s | %-11s | %-11s | %-9s | %-9s\n' "-----------" "-----------" "-----------" "---------" "---------"
for w in $selected; do
    native_med=$(printf '%s\n' ${times[$w,native]} | median)
    printf '%-14s' "$w"
    declare -A med=()
    for mode in "${modes[@]}"; do
        if [ "$mode" = qemu ] && [[ "$execs_children" == *" $w "* ]]; then
            printf ' | %-18s' "n/a (execs native)"
        elif [ -n "${wrong[$w,$mode]}" ]; then
            printf ' | %-18s' "WRONG (${wrong[$w,$mode]})"
        else
            med[$mode]=$(printf '%s\n' ${times[$w,$mode]} | median)
            if [ "$mode" = native ]; then
                printf ' | %-18s' "$(fmt_cell "${med[$mode]}" "${med[$mode]}")"
            else
                printf ' | %-18s' "$(fmt_cell "${med[$mode]}" "${native_med:-0}")"
            fi
        fi
    done
    [ $have_qemu = 1 ] || printf ' | %-18s' "n/a (not installed)"
    if [ -n "${med[monitor]:-}" ] && [ -n "${med[no-monitor]:-}" ]; then
        printf ' | %-11s' "$(awk -v a="${med[monitor]}" -v b="${med[no-monitor]}" 'BEGIN { printf "%6.2fx", (b > 0 ? a / b : 0) }')"
    else
        printf ' | %-11s' "n/a"
    fi
    if [ -n "${med[monitor]:-}" ] && [ -n "${med[no-sb]:-}" ]; then
        printf ' | %-11s' "$(awk -v a="${med[no-sb]}" -v b="${med[monitor]}" 'BEGIN { printf "%6.2fx", (b > 0 ? a / b : 0) }')"
    else
        printf ' | %-11s' "n/a"
    fi
    if [ -n "${med[monitor]:-}" ] && [ -n "${med[paths]:-}" ]; then
        printf ' | %-11s' "$(awk -v a="${med[paths]}" -v b="${med[monitor]}" 'BEGIN { printf "%6.2fx", (b > 0 ? a / b : 0) }')"
    else
        printf ' | %-11s' "n/a"
    fi
    case "${waits[$w]}" in
        *nan*) printf ' | %-9s' "no report" ;;
        "") printf ' | %-9s' "n/a" ;;
        *) printf ' | %-9s' "$(printf '%s\n' ${waits[$w]} | median | awk '{ printf "%6.2f %%", $1 }')" ;;
    esac
    case "${shares[$w]}" in
        ""|*-1*) printf ' | %-9s\n' "n/a" ;;
        *) printf ' | %-9s\n' "$(printf '%s\n' ${shares[$w]} | median | awk '{ printf "%6.1f %%", $1 }')" ;;
    esac
    unset med
done
printf '\nmedian wall time of %s runs; ratio = mode / native (lower is better);\n' "$runs"
printf 'no-sb = monitor with --no-superblocks; monitor = as shipped (superblocks on); paths =\n'
printf 'monitor with --paths; paths/mon = the path profile'"'"'s cost over the tables'"'"';\n'
printf 'no-monitor, no-sb and monitor run with a warm translation cache; cold = monitor with\n'
printf -- '--no-cache (every block translated, as on a first run);\n'
printf 'mon/no-mon = monitor / --no-monitor (the cost of profiling); sb gain = no-sb / monitor\n'
printf '(what superblocks buy); ring wait = share of the monitor run'"'"'s wall time the guest\n'
printf 'waited for a full event ring (totals.ring_wait_ns); mon cpu = the monitor threads'"'"' busy\n'
printf 'time (totals.monitor_busy_ns, every process) as a share of the guest'"'"'s CPU time (the\n'
printf 'monitor run'"'"'s CPU time less that).\n'
any_wrong=0
for k in "${!wrong[@]}"; do [ -n "${wrong[$k]}" ] && any_wrong=1; done
if [ $any_wrong = 1 ]; then
    echo "WRONG: some runs' stdout or exit status differed from native; they are not timed." >&2
    exit 1
fi
