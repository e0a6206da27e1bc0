//! Dynamically linked programs under hotpath: real programs from Debian (python3, sqlite3,
//! lua5.4, luajit, gawk, xz, bzip2, zstd, perl, dash), the `dlopen_twice` sample that loads,
//! calls, unloads and reloads a library, and ld.so failing on a library that is gone. Each
//! must give the same stdout, stderr and exit status or signal as natively, with the monitor
//! off, on, and with eager superblocks.
//!
//! Every workload is small (tens to a few hundred milliseconds natively) but exercises what a
//! dynamically linked program does: ld.so relocating and binding lazily through the PLT,
//! glibc's ifunc-selected string functions, TLS in the main program and in dlopened objects,
//! C extension modules loaded with dlopen (Python's lib-dynload, Perl's XS modules), code
//! generated at run time (LuaJIT's traces), libraries calling back into the program (qsort,
//! FFI), fork and exec (gawk's coprocess, dash's pipelines), and error exits with messages.
//! The inputs and scripts are generated into a scratch directory; every run uses the same
//! paths, so messages that name a file or the program are the same natively and under hotpath.
//!
//! How a test decides: the workload runs natively twice and the two runs must be identical
//! (else the workload, not hotpath, is at fault); the native run must end with the status the
//! test expects and print the markers it expects (so a broken workload, e.g. a module that
//! failed to import, cannot pass by failing the same way twice); then each hotpath run must
//! equal the native one byte for byte (`compare_with_native`).
//!
//! A program that is not installed fails its test with a message naming the Debian package:
//! `.ci/setup` installs them all, and CI runs it.

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;

use hotpath_e2e::debian::{self, debian, Expect, Program};
use hotpath_e2e::report::run_with_report;
use hotpath_e2e::{
    compare, compare_with_native, guest_build, paths, run_timeout, runner, set_guest_environment,
    Linkage, Outcome, Termination,
};

const PYTHON3: Program = debian("/usr/bin/python3", "python3");
const SQLITE3: Program = debian("/usr/bin/sqlite3", "sqlite3");
const LUA54: Program = debian("/usr/bin/lua5.4", "lua5.4");
const LUAJIT: Program = debian("/usr/bin/luajit", "luajit");
const GAWK: Program = debian("/usr/bin/gawk", "gawk");
const XZ: Program = debian("/usr/bin/xz", "xz-utils");
const BZIP2: Program = debian("/usr/bin/bzip2", "bzip2");
const ZSTD: Program = debian("/usr/bin/zstd", "zstd");
const PERL: Program = debian("/usr/bin/perl", "perl");
const DASH: Program = debian("/usr/bin/dash", "dash");

use hotpath_e2e::inputs::{Rng, WORDS};

/// Bytes of `words.txt`: about 200 KiB, a few thousand lines of
/// `word number wordNN xxx...` (the scripts below parse this shape).
const WORDS_BYTES: usize = 200 * 1024;

/// The scratch directory of this test process, with `words.txt` in it. Each test writes its
/// own scripts and outputs there under names of its own.
fn scratch() -> &'static Path {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let dir = paths::scratch_dir("dynamic");
        let mut rng = Rng(0x2545_f491_4f6c_dd1d);
        let mut text = String::with_capacity(WORDS_BYTES + 100);
        while text.len() < WORDS_BYTES {
            let w1 = WORDS[rng.below(WORDS.len() as u64) as usize];
            let w2 = WORDS[rng.below(WORDS.len() as u64) as usize];
            let _ = writeln!(
                text,
                "{w1} {} {w2}{} {}",
                rng.below(1_000_000),
                rng.below(100),
                "x".repeat(1 + rng.below(23) as usize)
            );
        }
        write(&dir.join("words.txt"), text.as_bytes());
        dir
    })
}

fn write(path: &Path, bytes: &[u8]) {
    fs::write(path, bytes).unwrap_or_else(|e| panic!("writing {}: {e}", path.display()));
}

/// Writes `text` to `name` in the scratch directory (a script the workload runs).
fn script(name: &str, text: &str) {
    write(&scratch().join(name), text.as_bytes());
}

/// [`debian::check`] in this test process's scratch directory.
fn check(program: &Program, args: &[&str], expect: Expect) -> Outcome {
    debian::check(program, args, scratch(), expect)
}

/// Writes `compressed` to `name` in the scratch directory with its middle byte flipped (xor
/// `0x55`): a file whose integrity check fails.
fn corrupt_copy(compressed: &[u8], name: &str) {
    let mut bytes = compressed.to_vec();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x55;
    write(&scratch().join(name), &bytes);
}

fn words() -> Vec<u8> {
    let path = scratch().join("words.txt");
    fs::read(&path).unwrap_or_else(|e| panic!("reading {}: {e}", path.display()))
}

// ---------------------------------------------------------------------------------------------
// Interpreters and tools

const PYTHON_SCRIPT: &str = r##""""hotpath e2e: the standard library's C accelerators and extension modules at work."""
import bz2
import decimal
import hashlib
import json
import lzma
import sys
import zlib

import _bz2
import _decimal
import _hashlib
import _json
import _lzma

# Each must be a shared object from lib-dynload, loaded by the import system with dlopen.
for name, module in (("_bz2", _bz2), ("_decimal", _decimal), ("_hashlib", _hashlib),
                     ("_json", _json), ("_lzma", _lzma)):
    origin = getattr(module, "__file__", "") or ""
    kind = "shared object" if origin.endswith(".so") else "BUILT IN (not a shared object)"
    print(f"{name}: {kind}")

with open(sys.argv[1], "rb") as f:
    data = f.read()
text = data.decode("ascii")

# Word statistics, in a deterministic order.
counts = {}
numbers = []
for line in text.splitlines():
    fields = line.split()
    counts[fields[0]] = counts.get(fields[0], 0) + 1
    numbers.append(int(fields[1]))
top = sorted(counts.items(), key=lambda kv: (-kv[1], kv[0]))[:5]
print("lines", len(numbers), "top", top)
print("sum", sum(numbers), "max", max(numbers), "median", sorted(numbers)[len(numbers) // 2])

# JSON through the C encoder and scanner, round trip.
doc = {"words": dict(sorted(counts.items())), "first": numbers[:20], "ratio": 1 / 3,
       "nested": [{"i": i, "sq": i * i, "s": "\u00e9\u4e2d" * (i % 3)} for i in range(200)]}
encoded = json.dumps(doc, sort_keys=True, ensure_ascii=True)
assert json.loads(encoded) == doc
print("json", len(encoded), hashlib.sha256(encoded.encode()).hexdigest()[:16])

# Digests: OpenSSL's (md5, sha1, sha256, sha512 via _hashlib) and the built-in ones.
for name in ("md5", "sha1", "sha256", "sha512", "sha3_256", "blake2b"):
    print(name, hashlib.new(name, data).hexdigest()[:32])
print("pbkdf2", hashlib.pbkdf2_hmac("sha256", b"password", b"salt", 2000).hex()[:32])

# Compression: zlib (built in), bz2 and lzma (extension modules over libbz2 and liblzma).
z = zlib.compress(data, 6)
b = bz2.compress(data, 9)
x = lzma.compress(data, preset=1)
assert zlib.decompress(z) == data and bz2.decompress(b) == data and lzma.decompress(x) == data
print("zlib", len(z), hex(zlib.crc32(data)), hex(zlib.adler32(data)))
print("bz2", len(b), hashlib.md5(b).hexdigest()[:16])
print("lzma", len(x), hashlib.md5(x).hexdigest()[:16])

# Decimal arithmetic in the C implementation (libmpdec).
decimal.getcontext().prec = 60
D = decimal.Decimal
print("sqrt(2)", D(2).sqrt())
print("exp(1)", D(1).exp())
print("ln(10)", D(10).ln())
total = sum(D(n) / D(7) for n in numbers[:2000])
print("sum/7", total.quantize(D("1.000000")))
try:
    D(1) / D(0)
except decimal.DivisionByZero as e:
    print("division by zero:", type(e).__name__)

# Plain interpreter work: a sieve and big integers.
limit = 60000
sieve = bytearray([1]) * limit
sieve[0:2] = b"\0\0"
for i in range(2, int(limit ** 0.5) + 1):
    if sieve[i]:
        sieve[i * i::i] = bytes(len(range(i * i, limit, i)))
print("primes below", limit, sum(sieve))
print("2**1000 digits", len(str(2 ** 1000)), "fact(300) mod 1e9+7", __import__("math").factorial(300) % 1000000007)

print("done; ending with status 3", file=sys.stderr)
sys.exit(3)
"##;

/// CPython with its C accelerators and extension modules (`_decimal`, `_json`, `_hashlib`
/// over OpenSSL, `_bz2`, `_lzma`, each a shared object in lib-dynload that the import system
/// dlopens), zlib built in, plain interpreter loops and big integers; exits with status 3.
#[test]
fn python3_stdlib_and_extension_modules() {
    script("workload.py", PYTHON_SCRIPT);
    check(
        &PYTHON3,
        // -I: no user site, no PYTHON* variables; -B: no .pyc written.
        &["-I", "-B", "workload.py", "words.txt"],
        Expect {
            status: Termination::Exited(3),
            stdout: &[
                "_bz2: shared object",
                "_decimal: shared object",
                "_hashlib: shared object",
                "_json: shared object",
                "_lzma: shared object",
                "sqrt(2) 1.41421356237309504880168872420969807856967187537694807317668",
                "primes below 60000 6057",
            ],
            stderr: &["done; ending with status 3"],
        },
    );
}

const SQL_SCRIPT: &str = r##"-- hotpath e2e: recursive CTEs, a table with an index, aggregates, JSON, then an error.
.bail on
PRAGMA synchronous = OFF;
DROP TABLE IF EXISTS numbers;
CREATE TABLE numbers (n INTEGER PRIMARY KEY, steps INTEGER, word TEXT);
-- Collatz stopping times of 1..2000, by a recursive CTE.
WITH RECURSIVE collatz(start, x, steps) AS (
    SELECT value, value, 0 FROM generate_series(1, 2000)
    UNION ALL
    SELECT start, CASE WHEN x % 2 = 0 THEN x / 2 ELSE 3 * x + 1 END, steps + 1
    FROM collatz WHERE x > 1
)
INSERT INTO numbers
SELECT start, max(steps), printf('w%04d', (start * 7919) % 10007) FROM collatz GROUP BY start;
CREATE INDEX numbers_steps ON numbers(steps);
SELECT 'longest', n, steps FROM numbers ORDER BY steps DESC, n LIMIT 3;
SELECT 'histogram', steps / 25 * 25 AS bucket, count(*) FROM numbers GROUP BY bucket ORDER BY bucket LIMIT 8;
SELECT 'words', count(DISTINCT word), min(word), max(word), sum(length(word)) FROM numbers;
SELECT 'json', json_group_array(json_object('n', n, 's', steps)) FROM (SELECT * FROM numbers WHERE steps > 180 ORDER BY n);
-- Fibonacci numbers and a running total.
WITH RECURSIVE fib(i, a, b) AS (SELECT 1, 0, 1 UNION ALL SELECT i + 1, b, a + b FROM fib WHERE i < 90)
SELECT 'fib', i, a, sum(a) OVER (ORDER BY i) FROM fib WHERE i % 15 = 0;
-- The Mandelbrot set, from SQLite's documentation of WITH RECURSIVE.
WITH RECURSIVE
  xaxis(x) AS (VALUES(-2.0) UNION ALL SELECT x + 0.05 FROM xaxis WHERE x < 1.2),
  yaxis(y) AS (VALUES(-1.0) UNION ALL SELECT y + 0.1 FROM yaxis WHERE y < 1.0),
  m(iter, cx, cy, x, y) AS (
    SELECT 0, x, y, 0.0, 0.0 FROM xaxis, yaxis
    UNION ALL
    SELECT iter + 1, cx, cy, x * x - y * y + cx, 2.0 * x * y + cy FROM m
     WHERE (x * x + y * y) < 4.0 AND iter < 28
  ),
  m2(iter, cx, cy) AS (SELECT max(iter), cx, cy FROM m GROUP BY cx, cy),
  a(t) AS (
    SELECT group_concat(substr(' .+*#', 1 + min(iter / 7, 4), 1), '')
    FROM m2 GROUP BY cy
  )
SELECT group_concat(rtrim(t), x'0a') FROM a;
SELECT 'float', printf('%.10f %.3e', 1.0 / 3, 6.02214076e23), round(22.0 / 7, 6);
SELECT 'error next';
SELECT * FROM no_such_table;
SELECT 'never reached';
"##;

/// sqlite3 on a database file: recursive CTEs (Collatz, Fibonacci, the Mandelbrot set), an
/// index, aggregates, a window function, JSON, then a statement on a missing table that ends
/// the script (`.bail on`: exit status 1, the error on stderr).
#[test]
fn sqlite3_recursive_cte() {
    script("workload.sql", SQL_SCRIPT);
    check(
        &SQLITE3,
        &["-batch", "sqlite.db", ".read workload.sql"],
        Expect {
            status: Termination::Exited(1),
            stdout: &[
                "longest|1161|181",
                "fib|90|1779979416004714189|1781285342973592226",
                " #############################################...",
                "error next",
            ],
            stderr: &["no such table: no_such_table"],
        },
    );
}

const LUA_SCRIPT: &str = r##"-- hotpath e2e: Lua 5.4 tables, strings, closures, coroutines, metatables, integers and
-- floats, utf8 and string.pack; ends with an uncaught error (exit status 1, traceback).
math.randomseed(42) -- Lua 5.4 seeds randomly at start; the sequence is fixed from here

-- Word counts from the input file, printed in sorted order (pairs() order is not fixed).
local counts, total, sum = {}, 0, 0
for line in io.lines(arg[1]) do
  local word, number = line:match("^(%a+) (%d+)")
  counts[word] = (counts[word] or 0) + 1
  total = total + 1
  sum = sum + tonumber(number)
end
local words = {}
for w in pairs(counts) do words[#words + 1] = w end
table.sort(words, function(a, b)
  if counts[a] ~= counts[b] then return counts[a] > counts[b] end
  return a < b
end)
print("lines", total, "sum", sum, "distinct", #words)
for i = 1, 5 do print(i, words[i], counts[words[i]]) end

-- Primes from a coroutine pipeline.
local function gen(n)
  return coroutine.wrap(function() for i = 2, n do coroutine.yield(i) end end)
end
local function filter(p, src)
  return coroutine.wrap(function()
    for x in src do if x % p ~= 0 then coroutine.yield(x) end end
  end)
end
local src, primes = gen(500), {}
while true do
  local p = src()
  if p == nil then break end
  primes[#primes + 1] = p
  src = filter(p, src)
end
print("primes", #primes, primes[#primes])

-- Metatables: a small vector type.
local V = {}
V.__index = V
V.__add = function(a, b) return setmetatable({x = a.x + b.x, y = a.y + b.y}, V) end
V.__tostring = function(v) return string.format("(%g, %g)", v.x, v.y) end
function V.len(v) return math.sqrt(v.x * v.x + v.y * v.y) end
local acc = setmetatable({x = 0, y = 0}, V)
for i = 1, 10000 do acc = acc + setmetatable({x = math.random(), y = math.random(-5, 5)}, V) end
print("vector", tostring(acc), string.format("%.6f", acc:len()))

-- Integers, floats and string formatting.
print(7 // 2, 7.0 // 2, 7 % -3, 2^53, math.maxinteger, math.mininteger // -1, 1e308 * 10)
print(string.format("%5.2f|%-6d|%x|%q|%a", math.pi, 42, 255, "a\nb", 0.5))
local fact = 1
for i = 1, 20 do fact = fact * i end
print("20!", fact, "21! wraps to", fact * 21)

-- Patterns, gsub with a function, string.pack and utf8.
local s = ("the quick brown fox jumps over the lazy dog "):rep(200)
local n = select(2, s:gsub("%f[%a]%a", string.upper))
print("capitalised", n, s:gsub("%f[%a]%a", string.upper):sub(1, 44))
local packed = string.pack("<i4 d z", -2, 1.5, "lua")
print("pack", #packed, string.unpack("<i4 d z", packed))
print("utf8", utf8.len("h\u{e9}llo \u{4e16}\u{754c}"), utf8.char(72, 228, 8364))

-- pcall and error objects.
local ok, e = pcall(function() error({code = 7}) end)
print("pcall", ok, type(e), e.code)
print("pcall", select(2, pcall(function() local t = nil; return t.x end)))
io.stderr:write("about to fail\n")
error("deliberate failure at the end")
"##;

/// Lua 5.4: pattern matching over the input, coroutines, metatables, integer and float
/// arithmetic, string.pack and utf8; ends with an uncaught error (status 1, traceback).
#[test]
fn lua54_interpreter() {
    script("workload.lua", LUA_SCRIPT);
    check(
        &LUA54,
        &["workload.lua", "words.txt"],
        Expect {
            status: Termination::Exited(1),
            stdout: &["primes\t95\t499", "pcall\tfalse\ttable\t7"],
            stderr: &["deliberate failure at the end", "stack traceback:"],
        },
    );
}

const LUAJIT_SCRIPT: &str = r##"-- hotpath e2e: LuaJIT compiles hot loops to machine code at run time (traces), and calls C
-- through the FFI. Every result is printed; whether a trace was compiled is printed too.
local ffi = require("ffi")
local jit_util = require("jit.util")
ffi.cdef[[
size_t strlen(const char *s);
int snprintf(char *buf, size_t size, const char *fmt, ...);
typedef struct { double x, y; } point;
]]

print("jit enabled", (jit.status()))

-- A numeric loop hot enough to be recorded and compiled (hotloop is 56 iterations).
local function mix(n)
  local h, acc = 2166136261, 0.0
  for i = 1, n do
    h = bit.bxor(h, i % 251)
    h = bit.band(h * 16777619, 0xffffffff)
    acc = acc + (i % 7) * 0.5 - (h % 3)
  end
  return h, acc
end
local h, acc = mix(3000000)
print("mix", h, acc)

-- FFI: C arrays of structs in a hot loop, and calls into libc.
local n = 100000
local pts = ffi.new("point[?]", n)
for i = 0, n - 1 do
  pts[i].x = i * 0.25
  pts[i].y = (n - i) * 0.5
end
local sx, sy = 0, 0
for i = 0, n - 1 do
  sx = sx + pts[i].x
  sy = sy + pts[i].y * 2
end
print("points", sx, sy)
local buf = ffi.new("char[64]")
local len = ffi.C.snprintf(buf, 64, "%s-%d-%.3f", "ffi", ffi.new("int", 42), 2.5)
print("snprintf", len, ffi.string(buf), tonumber(ffi.C.strlen(buf)))

-- String building and table work in loops (traces with calls into the runtime).
local parts = {}
for i = 1, 20000 do parts[#parts + 1] = string.char(65 + i % 26) end
local s = table.concat(parts)
local count = 0
for _ in s:gmatch("ABC") do count = count + 1 end
print("string", #s, count, s:sub(1, 30))

-- Trace 1 exists only if the JIT compiled something.
print("trace compiled", jit_util.traceinfo(1) ~= nil)
"##;

/// LuaJIT: loops hot enough to be traced and compiled to machine code at run time (the
/// script prints whether trace 1 exists: `luajit -jv workload_jit.lua` lists the traces), FFI
/// structs in a compiled loop and FFI calls into libc.
#[test]
fn luajit_compiles_hot_loops() {
    script("workload_jit.lua", LUAJIT_SCRIPT);
    check(
        &LUAJIT,
        &["workload_jit.lua"],
        Expect {
            status: Termination::Exited(0),
            stdout: &[
                "jit enabled\ttrue",
                "snprintf\t12\tffi-42-2.500\t12",
                "trace compiled\ttrue",
            ],
            stderr: &[],
        },
    );
}

const AWK_SCRIPT: &str = r##"# hotpath e2e: gawk's arrays, regular expressions, printf, user functions, gawk extensions
# (sorted traversal, gensub, asort, strftime on a fixed time, bit functions); exits with 4.
BEGIN { PROCINFO["sorted_in"] = "@ind_str_asc"; srand(7) }
{
    words[$1]++
    total += $2
    if ($2 > max) { max = $2; maxline = NR }
    suffix = $3; sub(/^[a-z]+/, "", suffix)
    suffixes[suffix % 10]++
    xs += length($4)
    if ($0 ~ /^(alpha|omega) [0-9]*7 /) sevens++
}
function fib(n,    a, b, t) { a = 0; b = 1; while (n-- > 0) { t = a + b; a = b; b = t } return a }
function ack(m, n) { return m == 0 ? n + 1 : n == 0 ? ack(m - 1, 1) : ack(m - 1, ack(m, n - 1)) }
END {
    printf "lines %d total %d max %d at line %d sevens %d xs %d\n", NR, total, max, maxline, sevens, xs
    for (w in words) printf "%-8s %5d %6.2f%%\n", w, words[w], 100 * words[w] / NR
    for (d in suffixes) line = line " " d ":" suffixes[d]
    print "suffix digits" line
    n = asort(words, sorted)
    print "asort", n, sorted[1], sorted[n]
    print "gensub", gensub(/([a-z]+) ([0-9]+)/, "\\2=\\1", "g", "alpha 1 beta 22 gamma 333")
    print "split", split("a:b::c", parts, ":"), parts[3] == "" ? "empty" : "set"
    print "toupper", toupper("mixed Case"), "index", index("haystack", "st"), "substr", substr("hotpath", 4)
    printf "numbers %.10g %e %x %o %c|%5s|%-5s|\n", atan2(0, -1), 1e100 / 3, 48879, 8, 65, "r", "l"
    print "fib(80)", fib(80), "ack(2,200)", ack(2, 200)
    print "bits", and(0xff0, 0x0ff), or(1, 6), xor(5, 3), lshift(1, 40), rshift(1024, 3), (compl(0) > 0)
    print "rand", int(rand() * 1000000), int(rand() * 1000000)
    print "strftime", strftime("%Y-%m-%d %H:%M:%S", 1000000000, 1)
    cmd = "sort -r | head -3"
    for (w in words) print w |& cmd
    close(cmd, "to")
    while ((cmd |& getline line) > 0) print "coprocess", line
    close(cmd)
    print "warning on stderr" > "/dev/stderr"
    exit 4
}
"##;

/// gawk: associative arrays traversed in sorted order, regular expressions, printf, recursive
/// user functions, gensub/asort/strftime/bit functions, and a two-way coprocess (`|&`, a
/// forked `sh -c "sort -r | head -3"`); exits with status 4.
#[test]
fn gawk_program() {
    script("workload.awk", AWK_SCRIPT);
    check(
        &GAWK,
        &["-f", "workload.awk", "words.txt"],
        Expect {
            status: Termination::Exited(4),
            stdout: &[
                "gensub 1=alpha 22=beta 333=gamma",
                "ack(2,200) 403",
                "strftime 2001-09-09 01:46:40",
                "bits 240 7 6 1099511627776 128 1",
                "coprocess ",
            ],
            stderr: &["warning on stderr"],
        },
    );
}

/// A compressor's command lines, for [`check_compressor`].
struct Compressor {
    program: Program,
    /// The compressed file's extension.
    extension: &'static str,
    /// Options that compress the file named after them to stdout.
    compress: &'static [&'static str],
    /// The first bytes of a compressed stream.
    magic: &'static [u8],
    /// Options that decompress the file named after them to stdout.
    decompress: &'static [&'static str],
    /// Options that test the integrity of the file named after them.
    test: &'static [&'static str],
    /// How testing a corrupted file ends natively: exit status, and a text of its message.
    corrupt_status: i32,
    corrupt_message: &'static str,
}

/// Compresses `words.txt` to stdout, decompresses the result (which must be `words.txt`
/// again), and tests a corrupted copy, each natively and under hotpath. Returns the name of
/// the compressed file, in the scratch directory.
fn check_compressor(c: &Compressor) -> String {
    let ok = || Expect {
        status: Termination::Exited(0),
        stdout: &[],
        stderr: &[],
    };
    let compressed_name = format!("words.txt.{}", c.extension);
    let corrupt_name = format!("corrupt.{}", c.extension);
    fn with_file<'a>(options: &[&'a str], file: &'a str) -> Vec<&'a str> {
        options.iter().copied().chain([file]).collect()
    }

    let args = with_file(c.compress, "words.txt");
    let compressed = check(&c.program, &args, ok());
    assert!(
        compressed.stdout.starts_with(c.magic),
        "{} {args:?} wrote no compressed stream natively",
        c.program.path
    );
    write(&scratch().join(&compressed_name), &compressed.stdout);
    corrupt_copy(&compressed.stdout, &corrupt_name);

    let args = with_file(c.decompress, &compressed_name);
    let decompressed = check(&c.program, &args, ok());
    assert!(
        decompressed.stdout == words(),
        "{} {args:?} does not give words.txt back natively",
        c.program.path
    );

    let args = with_file(c.test, &corrupt_name);
    let message = format!("{corrupt_name}{}", c.corrupt_message);
    check(
        &c.program,
        &args,
        Expect {
            status: Termination::Exited(c.corrupt_status),
            stdout: &[],
            stderr: &[&message],
        },
    );
    compressed_name
}

/// xz (liblzma): compress, decompress, list, and test a corrupted copy (status 1), single
/// threaded (`-T1`); threads.rs runs `xz -T2`.
#[test]
fn xz_compress_decompress_and_corrupt() {
    let compressed = check_compressor(&Compressor {
        program: XZ,
        extension: "xz",
        compress: &["-c", "-T1", "-6"],
        magic: b"\xfd7zXZ\0",
        decompress: &["-dc", "-T1"],
        test: &["-t", "-T1"],
        corrupt_status: 1,
        corrupt_message: ": Compressed data is corrupt",
    });
    check(
        &XZ,
        &["-l", &compressed],
        Expect {
            status: Termination::Exited(0),
            stdout: &["CRC64   words.txt.xz"],
            stderr: &[],
        },
    );
}

/// bzip2 (libbz2): compress, decompress, and test a corrupted copy (status 2).
#[test]
fn bzip2_compress_decompress_and_corrupt() {
    check_compressor(&Compressor {
        program: BZIP2,
        extension: "bz2",
        compress: &["-c", "-9"],
        magic: b"BZh9",
        decompress: &["-dc"],
        test: &["-t"],
        corrupt_status: 2,
        corrupt_message: ": data integrity (CRC) error in data",
    });
}

/// zstd: compress, decompress, and test a corrupted copy (status 1), with no thread at all
/// (`--single-thread --no-asyncio`: zstd 1.5 otherwise starts I/O threads); threads.rs runs
/// `zstd -T2`.
#[test]
fn zstd_compress_decompress_and_corrupt() {
    check_compressor(&Compressor {
        program: ZSTD,
        extension: "zst",
        compress: &["-q", "-c", "-12", "--single-thread", "--no-asyncio"],
        magic: &[0x28, 0xb5, 0x2f, 0xfd],
        decompress: &["-q", "-dc", "--no-asyncio"],
        test: &["-t", "--no-asyncio"],
        corrupt_status: 1,
        corrupt_message: " : Decoding error",
    });
}

const PERL_SCRIPT: &str = r##"# hotpath e2e: Perl's regular expressions, hashes (printed in sorted order: Perl randomises
# hash order per process), sprintf, pack, sort, local subs, and XS modules that DynaLoader
# loads with dlopen (Digest::MD5, Digest::SHA, List::Util, POSIX, Storable, Data::Dumper,
# MIME::Base64, Encode); ends with die (exit status 255, message on stderr).
use strict;
use warnings;
use Data::Dumper;
use Digest::MD5 qw(md5_hex);
use Digest::SHA qw(sha256_hex);
use Encode qw(encode decode);
use List::Util qw(sum max min reduce shuffle first);
use MIME::Base64 qw(encode_base64);
use POSIX qw(floor ceil fmod strftime);
use Storable qw(freeze thaw);

$Data::Dumper::Sortkeys = 1;
$Data::Dumper::Indent = 1;

my (%count, %longest, @numbers);
open(my $in, '<', $ARGV[0]) or die "cannot open $ARGV[0]: $!";
while (my $line = <$in>) {
    chomp $line;
    my ($word, $number, $tag, $filler) = split / /, $line;
    $count{$word}++;
    push @numbers, $number;
    $longest{$word} = length($filler // '') if length($filler // '') > ($longest{$word} // -1);
}
close $in;
printf "lines %d sum %d max %d min %d\n", scalar(@numbers), sum(@numbers), max(@numbers), min(@numbers);
for my $w ((sort { $count{$b} <=> $count{$a} or $a cmp $b } keys %count)[0 .. 4]) {
    printf "%-8s %4d longest filler %2d\n", $w, $count{$w}, $longest{$w};
}
my $text = join("\n", @numbers);
print "md5 ", md5_hex($text), " sha256 ", substr(sha256_hex($text), 0, 32), "\n";
print "base64 ", encode_base64(pack("N n C a4", 0xdeadbeef, 513, 7, "perl"), ""), "\n";

# Regular expressions: captures, named groups, global matches, substitutions with code.
my $s = "2024-01-15 alpha=1 beta=22 gamma=333 2023-12-31";
my @dates = $s =~ /(\d{4})-(\d\d)-(\d\d)/g;
print "dates @dates\n";
my %kv = $s =~ /(\w+)=(\d+)/g;
print "pairs ", join(",", map { "$_:$kv{$_}" } sort keys %kv), "\n";
(my $t = $s) =~ s/(\d+)/$1 * 2/ge;
print "doubled $t\n";
if ("version 5.36.0" =~ /(?<major>\d+)\.(?<minor>\d+)/) { print "named $+{major} $+{minor}\n" }
my $tr = ($s =~ tr/a-z//);
print "letters $tr\n";

# Numbers, POSIX, sprintf.
printf "posix %d %d %.4f %s\n", floor(-2.5), ceil(2.1), fmod(10, 3.3), strftime("%Y-%m-%d %H:%M:%S", gmtime(1000000000));
printf "sprintf %5.2f|%-5s|%05d|%x|%o|%e|%b\n", 3.14159, "ab", 42, 255, 8, 12345.678, 10;
my $fact = reduce { $a * $b } 1 .. 20;
print "20! $fact, 2**64 ", 2**64, "\n";
my $big = 1; $big *= 3 for 1 .. 30;
print "3**30 $big\n";

# Data structures: Storable round trip and Data::Dumper with sorted keys.
my $data = { list => [1 .. 5], nested => { a => [qw(x y)], b => { c => 3 } }, words => \%count };
my $copy = thaw(freeze($data));
print "storable ", ($copy->{nested}{b}{c} == 3 && @{ $copy->{list} } == 5 ? "ok" : "broken"), "\n";
local $Data::Dumper::Terse = 1;
print "dumper ", Dumper($copy->{nested});

# Encode: UTF-8 round trip.
my $unicode = decode("UTF-8", "h\xc3\xa9llo \xe4\xb8\x96\xe7\x95\x8c");
printf "encode %d chars %d bytes\n", length($unicode), length(encode("UTF-8", $unicode));

# A closure-heavy computation: memoised partition numbers.
my %memo;
no warnings "recursion";
my $p; $p = sub {
    my ($n, $k) = @_;
    return 1 if $n == 0;
    return 0 if $n < 0 || $k == 0;
    return $memo{"$n,$k"} //= $p->($n - $k, $k) + $p->($n, $k - 1);
};
print "partitions(100) ", $p->(100, 100), "\n";

warn "a warning on stderr\n";
die "deliberate failure at the end\n";
"##;

/// Perl: regular expressions, hashes (printed sorted: Perl randomises hash order per process),
/// sprintf, pack, closures, and XS modules DynaLoader dlopens (Digest::MD5, Digest::SHA,
/// List::Util, POSIX, Storable, Data::Dumper, MIME::Base64, Encode); ends with `die`
/// (status 255, the message on stderr).
#[test]
fn perl_with_xs_modules() {
    script("workload.pl", PERL_SCRIPT);
    check(
        &PERL,
        &["workload.pl", "words.txt"],
        Expect {
            status: Termination::Exited(255),
            stdout: &[
                "doubled 4048-2-30 alpha=2 beta=44 gamma=666 4046-24-62",
                "storable ok",
                "partitions(100) 190569292",
            ],
            stderr: &["a warning on stderr", "deliberate failure at the end"],
        },
    );
}

const DASH_SCRIPT: &str = r##"# hotpath e2e: dash running its builtins and pipelines of other dynamically linked programs
# (each exec'd from a forked dash); ends with status 7 after an EXIT trap.
set -eu
PATH=/usr/bin:/bin
trap 'echo "exit trap, status $?"' EXIT

echo "== gawk | sort | head"
gawk '{ print $1 }' words.txt | sort | uniq -c | sort -k1,1nr -k2 | head -5

echo "== round trip through xz, bzip2 and zstd"
xz -c -T1 -3 words.txt | xz -dc -T1 | bzip2 -c -6 | bzip2 -dc \
    | zstd -q -c -5 --single-thread --no-asyncio | zstd -q -dc --no-asyncio > roundtrip.txt
cmp words.txt roundtrip.txt && echo "identical after the round trip"
echo "xz size $(xz -c -T1 -3 < words.txt | wc -c)"

echo "== builtins"
total=0 i=0
while read -r word number rest; do
    i=$((i + 1))
    case $word in
        alpha|beta) total=$((total + number % 1000)) ;;
        *) ;;
    esac
    [ "$i" -ge 400 ] && break
done < words.txt
echo "first $i lines, alpha/beta total $total"
add_square() { s=$((s + $1 * $1)); }
s=0
for n in 1 2 3 4 5 6 7 8 9 10; do add_square "$n"; done
echo "sum of squares $s"
(cd / && pwd; exit 3) || echo "subshell ended with $?"
cat <<END | tr a-z A-Z
here-document with $((6 * 7)) and ${HOTPATH_E2E_OTHER:-unset}
END
set -- one "two words" three
echo "$# arguments, second: $2"

echo "== other interpreters"
lua5.4 -e 'local t = {} for i = 1, 10 do t[i] = i * i end print("lua", table.concat(t, ","))'
perl -e 'printf "perl %s\n", join ",", map { $_ ** 3 } 1 .. 6'
sqlite3 :memory: "WITH RECURSIVE c(x) AS (SELECT 1 UNION ALL SELECT x * 2 FROM c WHERE x < 1000) SELECT 'sqlite ' || group_concat(x, ',') FROM c"
python3 -I -c 'import zlib, sys; print("python", zlib.crc32(open(sys.argv[1], "rb").read()))' words.txt

echo "to stderr" >&2
if gawk 'BEGIN { exit 5 }'; then echo "unexpected"; else echo "gawk exited with $?"; fi
exit 7
"##;

/// dash running a script: builtins, functions, a subshell, a here-document, and pipelines
/// that exec gawk, sort, xz, bzip2, zstd, lua5.4, perl, sqlite3 and python3 (forked dash
/// children stay under translation, and so do the programs they exec: hotpath follows exec
/// unless `--no-follow-exec`); ends with status 7 from an EXIT trap.
#[test]
fn dash_script_execs_the_others() {
    for program in [&GAWK, &XZ, &BZIP2, &ZSTD, &LUA54, &PERL, &SQLITE3, &PYTHON3] {
        program.installed();
    }
    script("workload.sh", DASH_SCRIPT);
    check(
        &DASH,
        &["workload.sh"],
        Expect {
            status: Termination::Exited(7),
            stdout: &[
                "identical after the round trip",
                "xz size ",
                "sum of squares 385",
                "HERE-DOCUMENT WITH 42 AND 1",
                "lua\t1,4,9,16,25,36,49,64,81,100",
                "perl 1,8,27,64,125,216",
                "sqlite 1,2,4,8,16,32,64,128,256,512,1024",
                "python ",
                "gawk exited with 5",
                "exit trap, status 7",
            ],
            stderr: &["to stderr"],
        },
    );
}

// ---------------------------------------------------------------------------------------------
// dlopen and ld.so

/// What `dlopen_twice` prints: the library's results recomputed here from its source
/// (guest-samples/dlopen_lib.c), so a broken sample or toolchain is caught natively.
fn dlopen_twice_expected_stdout() -> String {
    let mut out = String::new();
    for round in 1..=2u32 {
        let n = 100_000 * round;
        let mut composite = vec![false; n as usize];
        let (mut count, mut squares) = (0u32, 0u64);
        for i in 2..n as usize {
            if composite[i] {
                continue;
            }
            count += 1;
            squares = squares.wrapping_add((i as u64) * (i as u64));
            for j in (i * i..n as usize).step_by(i) {
                composite[j] = true;
            }
        }
        let values = 5000 * round;
        let mut rng = Rng(0x9e37_79b9_7f4a_7c15 + u64::from(round));
        let mut sorted: Vec<u64> = (0..values).map(|_| rng.next()).collect();
        sorted.sort_unstable();
        let mut hash = 0xcbf2_9ce4_8422_2325u64;
        for v in sorted {
            for byte in v.to_le_bytes() {
                hash = (hash ^ u64::from(byte)).wrapping_mul(0x100_0000_01b3);
            }
        }
        let _ = write!(
            out,
            "lib: constructor, loads of this copy: 1\n\
             round {round}: dl_version 7\n\
             round {round}: {count} primes below {n}, sum of squares {squares}\n\
             round {round}: {values} sorted values hash to {hash:016x}\n\
             round {round}: calls into this copy: 2\n\
             lib: destructor, calls in this copy: 2\n\
             round {round}: loaded after dlclose: no\n"
        );
    }
    out.push_str(
        "lib: constructor, loads of this copy: 1\n\
         missing symbol: NULL, undefined symbol: dl_no_such_symbol\n\
         lib: destructor, calls in this copy: 0\n\
         missing library: NULL, cannot open shared object file: No such file or directory\n",
    );
    out
}

/// A program whose library is found through `RUNPATH $ORIGIN/lib`, run through a symlink in
/// another directory (`/usr/bin/java` is one: a link to the JDK's launcher, which finds
/// `libjli.so` beside its own file): the dynamic linker takes `$ORIGIN` from
/// `/proc/self/exe`, which names the file with the link resolved, as the kernel names it.
/// Under hotpath it named the link, so the library was not found (exit 127).
#[test]
fn a_program_run_through_a_symlink_finds_its_origin_libraries() {
    let dir = scratch().join("origin");
    let (lib_dir, bin_dir) = (dir.join("lib"), dir.join("bin"));
    for d in [&lib_dir, &bin_dir] {
        fs::create_dir_all(d).unwrap_or_else(|e| panic!("{}: {e}", d.display()));
    }
    let samples = paths::samples_dir();
    let lib = lib_dir.join("liborigin.so");
    let prog = dir.join("origin_prog");
    let path = |p: &Path| p.display().to_string();
    gcc(&[
        "-shared".into(),
        "-fPIC".into(),
        "-o".into(),
        path(&lib),
        path(&samples.join("origin_lib.c")),
    ]);
    gcc(&[
        "-o".into(),
        path(&prog),
        path(&samples.join("origin_prog.c")),
        "-L".into(),
        path(&lib_dir),
        "-lorigin".into(),
        "-Wl,-rpath,$ORIGIN/lib".into(),
    ]);
    let link = bin_dir.join("origin_prog");
    let _ = fs::remove_file(&link);
    std::os::unix::fs::symlink("../origin_prog", &link).expect("a symlink");
    let (native, verdict) = compare_with_native(&link, &[], scratch());
    let want = format!(
        "answer 42\nexe {}\n",
        prog.canonicalize().expect("the program").display()
    );
    assert!(
        native.termination == Termination::Exited(0) && native.stdout == want.as_bytes(),
        "the NATIVE run of {} is not what its source says ({}): {}",
        link.display(),
        native.termination,
        String::from_utf8_lossy(&native.stdout)
    );
    if let Err(report) = verdict {
        panic!("origin_prog through a symlink:{report}");
    }
}

/// `dlopen_twice` (dynamically linked) and the library it loads, built into the build dir.
fn dlopen_twice() -> (PathBuf, String) {
    let lib = guest_build::build_shared_library("dlopen_lib.c").unwrap_or_else(|e| panic!("{e}"));
    let exe =
        guest_build::build("dlopen_twice.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    (exe, lib.display().to_string())
}

/// dlopen a library, call it through dlsym (a sieve, and a qsort calling back into the
/// library), check its data and its TLS, dlclose it (its destructor runs, RTLD_NOLOAD finds
/// it gone), dlopen it again lazily and do it all again; then a missing symbol and a missing
/// library.
#[test]
fn dlopen_dlclose_dlopen_again() {
    let (exe, lib) = dlopen_twice();
    let (native, verdict) = compare_with_native(&exe, &[&lib], scratch());
    let expected = dlopen_twice_expected_stdout();
    assert!(
        native.termination == Termination::Exited(0)
            && native.stdout == expected.as_bytes()
            && native.stderr.is_empty(),
        "the NATIVE run of {} is not what its source says ({}; the sample or the toolchain is \
         at fault, not hotpath); stdout (- expected, + native):\n{}stderr:\n{}",
        exe.display(),
        native.termination,
        compare::diff(expected.as_bytes(), &native.stdout),
        String::from_utf8_lossy(&native.stderr)
    );
    if let Err(report) = verdict {
        panic!("dlopen_twice {lib}:{report}");
    }
}

/// `--report FILE` is written for a program that dlopens and dlcloses: it parses as JSON and
/// names its schema; the guest's output is still the native one.
#[test]
fn dlopen_report_is_written() {
    let (exe, lib) = dlopen_twice();
    let run = run_with_report(&exe, &[&lib], scratch(), "dlopen_twice", &[]);
    assert!(
        run.report.json["schema"].is_string(),
        "the report {} has no \"schema\"",
        run.file.display()
    );
    let expected = dlopen_twice_expected_stdout();
    assert!(
        run.outcome.termination == Termination::Exited(0)
            && run.outcome.stdout == expected.as_bytes(),
        "hotpath --report: {}, stdout (- expected, + hotpath):\n{}stderr:\n{}",
        run.outcome.termination,
        compare::diff(expected.as_bytes(), &run.outcome.stdout),
        String::from_utf8_lossy(&run.outcome.stderr)
    );
    // The profile names the library in every incarnation: a module entry per dlopen, the
    // first unloaded by dlclose, and its functions' blocks named `module!function`.
    let lib_path = std::fs::canonicalize(&lib).unwrap_or_else(|e| panic!("{lib}: {e}"));
    let modules = run.report.json["modules"]
        .as_array()
        .unwrap_or_else(|| panic!("the report {} has no modules[]", run.file.display()));
    let incarnations: Vec<usize> = modules
        .iter()
        .enumerate()
        .filter(|(_, m)| m["path"].as_str() == lib_path.to_str())
        .map(|(i, _)| i)
        .collect();
    // dlopen_twice loads the library once per round and once more at the end, closing it
    // each time.
    assert!(
        incarnations.len() >= 2,
        "want a module per dlopen of {} (dlopen, dlclose, dlopen), got modules {modules:#?}",
        lib_path.display()
    );
    assert_eq!(modules[incarnations[0]]["unloaded"], true, "{modules:#?}");
    assert!(
        modules[0]["path"].as_str() == exe.canonicalize().unwrap().to_str(),
        "module 0 is not the program: {:?}",
        modules[0]
    );
    let file = lib_path.file_name().unwrap().to_string_lossy().into_owned();
    let blocks = run.report.json["blocks"].as_array().expect("blocks[]");
    for f in ["dl_primes", "dl_sorted_hash", "dl_calls"] {
        let want = format!("{file}!{f}");
        let named: Vec<&serde_json::Value> = blocks
            .iter()
            .filter(|b| b["symbol"].as_str() == Some(want.as_str()))
            .collect();
        assert!(!named.is_empty(), "no block is named {want}");
        for b in named {
            let m = b["module"].as_u64().expect("module index") as usize;
            assert!(incarnations.contains(&m), "{want} in module {m}: {b}");
        }
    }
}

/// A path of a function that jumps into another module's code (a PLT stub, which the
/// guest's calling contexts count as the function it is called as, going on into the library
/// function it leads to) names those blocks by their own module and symbol, as the report's
/// blocks are named, not as the stub's name plus an offset across modules
/// (`libc.so.6+0x262c0+0xe94fd0`).
#[test]
fn path_blocks_are_named_by_their_own_module() {
    let exe =
        guest_build::build("count_libc.c", Linkage::Dynamic).unwrap_or_else(|e| panic!("{e}"));
    let run = run_with_report(&exe, &[], scratch(), "count_libc_paths", &["--paths"]);
    assert_eq!(run.outcome.termination, Termination::Exited(0));
    let json = &run.report.json;
    let addr = |v: &serde_json::Value| {
        u64::from_str_radix(v.as_str().expect("an address").trim_start_matches("0x"), 16)
            .expect("a hex address")
    };
    let modules: Vec<(u64, u64, String)> = json["modules"]
        .as_array()
        .expect("modules[]")
        .iter()
        .map(|m| {
            let path = m["path"].as_str().unwrap_or_default();
            let file = path.rsplit('/').next().unwrap_or(path).to_string();
            (addr(&m["base"]), m["size"].as_u64().unwrap_or(0), file)
        })
        .collect();
    let module_of = |a: u64| modules.iter().rposition(|m| a >= m.0 && a < m.0 + m.1);
    let mut across = 0;
    for p in json["path_profile"]["paths"].as_array().expect("paths[]") {
        let function = p["function"].as_str().unwrap_or_default();
        let home = module_of(addr(&p["function_addr"]));
        let names = p["names"].as_array().expect("names[]");
        for (b, name) in p["blocks"].as_array().expect("blocks[]").iter().zip(names) {
            let (m, name) = (module_of(addr(b)), name.as_str().unwrap_or_default());
            if m == home || m.is_none() {
                continue;
            }
            across += 1;
            // The program's own symbols are named without its file name.
            let file = &modules[m.unwrap()].2;
            assert!(
                !name.starts_with(function) && (m == Some(0) || name.starts_with(file.as_str())),
                "block {b} of {function} is in {file} but named {name}"
            );
        }
    }
    assert!(across > 0, "no path went from one module into another");
}

/// Runs gcc with `args`.
///
/// # Panics
///
/// When gcc cannot run or fails (with its messages).
fn gcc(args: &[String]) {
    let out = Command::new("gcc")
        .args(args)
        .output()
        .unwrap_or_else(|e| panic!("cannot run gcc: {e}"));
    assert!(
        out.status.success(),
        "gcc {} failed:\n{}",
        args.join(" "),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A program linked against a shared library that is then deleted: ld.so prints
/// `PROGRAM: error while loading shared libraries: LIB: cannot open shared object file: ...`
/// (PROGRAM is argv[0], the same path in every run) and exits with status 127, before the
/// program's own code runs. Under hotpath the guest's ld.so must do exactly that.
#[test]
fn missing_library_fails_in_ld_so_as_natively() {
    let dir = scratch().join("missing-library");
    fs::create_dir_all(&dir).unwrap_or_else(|e| panic!("creating {}: {e}", dir.display()));
    let samples = paths::samples_dir();
    let lib = dir.join("libhotpath_gone.so");
    let exe = dir.join("needs_gone_library");
    let mut lib_args = guest_build::shared_library_gcc_args();
    lib_args.extend([
        "-Wl,-soname,libhotpath_gone.so".to_string(),
        "-o".into(),
        lib.display().to_string(),
        samples.join("dlopen_lib.c").display().to_string(),
    ]);
    gcc(&lib_args);
    // dlopen_twice.c calls nothing in the library: --no-as-needed keeps it in DT_NEEDED.
    let mut exe_args = guest_build::gcc_args("dlopen_twice.c", Linkage::Dynamic);
    exe_args.extend([
        "-o".into(),
        exe.display().to_string(),
        samples.join("dlopen_twice.c").display().to_string(),
        format!("-L{}", dir.display()),
        format!("-Wl,-rpath,{}", dir.display()),
        "-Wl,--no-as-needed".into(),
        "-lhotpath_gone".into(),
    ]);
    gcc(&exe_args);
    let lib_arg = lib.display().to_string();

    // With the library there, the program runs (its constructor runs before main).
    let mut cmd = Command::new(&exe);
    cmd.arg(&lib_arg);
    set_guest_environment(&mut cmd, &dir);
    let present = runner::run(&mut cmd, run_timeout()).unwrap_or_else(|e| panic!("{e}"));
    assert_eq!(
        present.termination,
        Termination::Exited(0),
        "{} does not run natively with its library present: {}",
        exe.display(),
        String::from_utf8_lossy(&present.stderr)
    );

    fs::remove_file(&lib).unwrap_or_else(|e| panic!("removing {}: {e}", lib.display()));
    let (native, verdict) = compare_with_native(&exe, &[&lib_arg], &dir);
    let message = format!(
        "{}: error while loading shared libraries: libhotpath_gone.so: cannot open shared \
         object file",
        exe.display()
    );
    assert!(
        native.termination == Termination::Exited(127)
            && native.stdout.is_empty()
            && String::from_utf8_lossy(&native.stderr).starts_with(&message),
        "natively, ld.so should refuse {} with exit status 127 and `{message}...`; it ended \
         with {}, stderr:\n{}",
        exe.display(),
        native.termination,
        String::from_utf8_lossy(&native.stderr)
    );
    if let Err(report) = verdict {
        panic!("{}:{report}", exe.display());
    }
}
