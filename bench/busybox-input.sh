#!/usr/bin/env bash
# bench/busybox-input.sh — writes the text input of the busybox workloads (sort, gzip -c):
# MIB MiB of lines "word number wordN" from a fixed linear congruential generator, the same
# file on every machine. Does nothing when FILE already exists and is not empty.
#
# Usage: bench/busybox-input.sh MIB FILE
set -euo pipefail
mib="$1"; input="$2"
[ -s "$input" ] && exit 0
echo "generating $input ($mib MiB of text lines)..." >&2
awk -v bytes=$((mib * 1024 * 1024)) 'BEGIN {
    split("alpha beta gamma delta epsilon zeta eta theta iota kappa lambda mu", w, " ");
    x = 12345; n = 0;
    while (n < bytes) {
        x = (x * 1103515245 + 12345) % 2147483648; a = x % 12 + 1;
        x = (x * 1103515245 + 12345) % 2147483648; b = x % 1000000;
        x = (x * 1103515245 + 12345) % 2147483648; c = x % 12 + 1;
        line = sprintf("%s %06d %s%d", w[a], b, w[c], x % 97);
        print line; n += length(line) + 1;
    }
}' >"$input.tmp"
mv "$input.tmp" "$input"
