//! Exact counts in the monitor's report (DESIGN.md invariant 2), for freestanding guests whose
//! counts follow from their source (`guest-samples/count_*.S`, each block at a named label; the
//! expected numbers are derived in each sample's header comment): block executions, taken /
//! not-taken edges, indirect-jump and indirect-call targets, returns, syscalls and their sites.
//! Static and static-pie: blocks are found by symbol, instruction sites by `nm` address plus
//! the load bias (block address minus symbol value).
//!
//! And the instruction total, for freestanding samples: equal to valgrind's independent count
//! (`--tool=lackey`), exactly. These guests run no cpuid and no ifunc-selected code; the only
//! known difference is `rep` string instructions, which valgrind counts once per iteration
//! (asm_flags has one, accounted for exactly). glibc and busybox: `valgrind.rs`.

use std::collections::HashMap;
use std::path::{Path, PathBuf};

use hotpath_e2e::report::{
    as_u64, check_consistency, nm, run_with_report, valgrind_instructions, Report,
};
use hotpath_e2e::{guest_build, paths, Linkage, Termination};

fn scratch() -> PathBuf {
    static DIR: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    DIR.get_or_init(|| paths::scratch_dir("counts")).clone()
}

/// A run of a count sample with what is needed to name its addresses.
struct Counted {
    exe: PathBuf,
    report: Report,
    symbols: HashMap<String, u64>,
    /// Load address minus link address (0 for static).
    bias: u64,
    linkage: Linkage,
}

impl Counted {
    fn run(source: &str, linkage: Linkage) -> Counted {
        let exe = guest_build::build(source, linkage).unwrap_or_else(|e| panic!("{e}"));
        let name = format!("{source}.{linkage}");
        let run = run_with_report(&exe, &[], &scratch(), &name, &[]);
        assert_eq!(run.outcome.termination, Termination::Exited(0), "{name}");
        check_consistency(&exe, &run.report, &name);
        let symbols = nm(&exe);
        // Any named block gives the bias; every count sample has a block at a function label.
        let named = run
            .report
            .blocks()
            .iter()
            .find_map(|b| {
                let sym = b["symbol"].as_str()?;
                (!sym.contains('+')).then(|| (sym.to_string(), as_u64(&b["addr"])))
            })
            .unwrap_or_else(|| panic!("{name}: no block starts at a symbol"));
        let bias = named.1.wrapping_sub(symbols[&named.0]);
        if linkage == Linkage::Static {
            assert_eq!(bias, 0, "{name}: a static binary runs at its link address");
        }
        Counted {
            exe,
            report: run.report,
            symbols,
            bias,
            linkage,
        }
    }

    /// The run-time address of a symbol (e.g. the label of an indirect jmp).
    fn at(&self, symbol: &str) -> u64 {
        self.symbols
            .get(symbol)
            .unwrap_or_else(|| panic!("no symbol {symbol} in {}", self.exe.display()))
            .wrapping_add(self.bias)
    }

    fn what(&self) -> String {
        format!("{} ({})", self.exe.display(), self.linkage)
    }

    fn expect_blocks(&self, want: &[(&str, u64)]) {
        for &(symbol, count) in want {
            assert_eq!(
                self.report.count(symbol),
                count,
                "{}: executions of block {symbol}",
                self.what()
            );
        }
    }

    /// All edges leaving `from`, exactly: (to, kind, count).
    fn expect_edges(&self, from: &str, want: &[(&str, &str, u64)]) {
        let mut want: Vec<(String, String, u64)> = want
            .iter()
            .map(|&(to, kind, n)| (to.to_string(), kind.to_string(), n))
            .collect();
        want.sort();
        assert_eq!(
            self.report.edges_from(from),
            want,
            "{}: edges leaving {from} (to, kind, count)",
            self.what()
        );
    }

    /// The indirect site at `site_symbol`: kind, count, predictability, targets in order.
    fn expect_indirect(
        &self,
        site_symbol: &str,
        kind: &str,
        predictability: &str,
        targets: &[(&str, u64)],
    ) {
        self.expect_indirect_at(
            self.at(site_symbol),
            site_symbol,
            kind,
            predictability,
            targets,
        );
    }

    fn expect_indirect_at(
        &self,
        site: u64,
        label: &str,
        kind: &str,
        predictability: &str,
        targets: &[(&str, u64)],
    ) {
        let what = format!("{}: indirect site {label}", self.what());
        let s = self.report.indirect_site(site);
        assert_eq!(s["kind"], kind, "{what}: {s}");
        let total: u64 = targets.iter().map(|t| t.1).sum();
        assert_eq!(as_u64(&s["count"]), total, "{what}: {s}");
        assert_eq!(s["predictability"], predictability, "{what}: {s}");
        let want: Vec<(String, u64)> = targets.iter().map(|&(t, n)| (t.to_string(), n)).collect();
        assert_eq!(
            self.report.targets(s),
            want,
            "{what}: targets, most frequent first"
        );
    }

    /// A syscall's total and its sites (symbol, count), most frequent first.
    fn expect_syscall(&self, name: &str, sites: &[(&str, u64)]) {
        let what = format!("{}: syscall {name}", self.what());
        let row = self
            .report
            .syscall(name)
            .unwrap_or_else(|| panic!("{what}: not in the report"));
        let total: u64 = sites.iter().map(|s| s.1).sum();
        assert_eq!(as_u64(&row["count"]), total, "{what}: {row}");
        let got: Vec<(u64, u64)> = row["sites"]
            .as_array()
            .expect("sites")
            .iter()
            .map(|s| (as_u64(&s["addr"]), as_u64(&s["count"])))
            .collect();
        let want: Vec<(u64, u64)> = sites.iter().map(|&(sym, n)| (self.at(sym), n)).collect();
        let mut got_sorted = got.clone();
        let mut want_sorted = want.clone();
        got_sorted.sort();
        want_sorted.sort();
        assert_eq!(got_sorted, want_sorted, "{what}: sites (address, count)");
        assert!(
            got.windows(2).all(|w| w[0].1 >= w[1].1),
            "{what}: sites not most frequent first: {got:?}"
        );
    }

    /// The instruction total equals valgrind's count (when valgrind is installed).
    fn expect_valgrind_total(&self) {
        match valgrind_instructions(&self.exe, &[], &scratch()) {
            Some(n) => assert_eq!(
                self.report.total("guest_instructions"),
                n,
                "{}: guest instructions, report vs valgrind --tool=lackey",
                self.what()
            ),
            None => eprintln!(
                "valgrind is not installed: {} not cross-checked",
                self.what()
            ),
        }
    }
}

#[test]
fn counts_of_a_loop_and_a_loop_nest() {
    for linkage in Linkage::ALL {
        let c = Counted::run("count_branches.S", linkage);
        c.expect_blocks(&[
            ("loop_head", 10_000),
            ("loop_add", 7_500),
            ("loop_add+0x9", 1),
            ("loop_skip", 2_500),
            ("loop_done", 1),
            ("outer_head", 40),
            ("inner_head", 1_000),
            ("outer_tail", 40),
            ("report", 1),
        ]);
        c.expect_edges(
            "loop_head",
            &[
                ("loop_skip", "taken", 2_500),
                ("loop_add", "not_taken", 7_500),
            ],
        );
        c.expect_edges(
            "loop_add",
            &[
                ("loop_head", "taken", 7_499),
                ("loop_add+0x9", "not_taken", 1),
            ],
        );
        c.expect_edges("loop_add+0x9", &[("loop_done", "jump", 1)]);
        c.expect_edges("loop_skip", &[("loop_head", "taken", 2_500)]);
        c.expect_edges("outer_head", &[("inner_head", "jump", 40)]);
        c.expect_edges(
            "inner_head",
            &[
                ("inner_head", "taken", 960),
                ("outer_tail", "not_taken", 40),
            ],
        );
        c.expect_edges(
            "outer_tail",
            &[("outer_head", "taken", 39), ("report", "not_taken", 1)],
        );
        assert!(c.report.indirect_sites().is_empty(), "no indirect branches");
        c.expect_valgrind_total();
    }
}

#[test]
fn counts_of_a_switch_through_a_jump_table() {
    for linkage in Linkage::ALL {
        let c = Counted::run("count_jumptable.S", linkage);
        c.expect_blocks(&[
            ("switch_head", 1_000),
            ("case_a", 400),
            ("case_b", 300),
            ("case_c", 200),
            ("case_d", 100),
            ("switch_next", 1_000),
            ("switch_count", 900),
        ]);
        assert!(
            c.report
                .blocks()
                .iter()
                .all(|b| b["symbol"].as_str() != Some("case_e")),
            "case_e is never selected"
        );
        c.expect_indirect(
            "switch_jmp",
            "indirect_jump",
            "polymorphic",
            &[
                ("case_a", 400),
                ("case_b", 300),
                ("case_c", 200),
                ("case_d", 100),
            ],
        );
        for case in ["case_a", "case_b", "case_c", "case_d"] {
            let n = c.report.count(case);
            c.expect_edges(case, &[("switch_next", "jump", n)]);
        }
        c.expect_edges(
            "switch_next",
            &[
                ("switch_count", "taken", 900),
                ("switch_next+0xa", "not_taken", 100),
            ],
        );
        c.expect_valgrind_total();
    }
}

#[test]
fn counts_of_indirect_calls_through_a_function_table() {
    for linkage in Linkage::ALL {
        let c = Counted::run("count_calls.S", linkage);
        c.expect_blocks(&[
            ("call_head", 600),
            ("call_return", 600),
            ("f_one", 300),
            ("f_two", 200),
            ("f_three", 100),
            ("leaf", 600),
        ]);
        c.expect_indirect(
            "call_site",
            "indirect_call",
            "polymorphic",
            &[("f_one", 300), ("f_two", 200), ("f_three", 100)],
        );
        // Each callee's direct call to leaf, and the returns: every f_* returns to call_return,
        // leaf returns into the three callers.
        for (f, n) in [("f_one", 300), ("f_two", 200), ("f_three", 100)] {
            c.expect_edges(f, &[("leaf", "call", n)]);
            let ret = c.at(f) + 9; // add $k,%r14d (4 bytes) + call leaf (5 bytes)
            c.expect_indirect_at(
                ret,
                &format!("{f}'s ret"),
                "return",
                "monomorphic",
                &[("call_return", n)],
            );
        }
        let leaf_ret = c.at("leaf") + 4;
        c.expect_indirect_at(
            leaf_ret,
            "leaf's ret",
            "return",
            "polymorphic",
            &[("f_one+0x9", 300), ("f_two+0x9", 200), ("f_three+0x9", 100)],
        );
        c.expect_valgrind_total();
    }
}

#[test]
fn counts_of_write_and_getpid_syscalls() {
    for linkage in Linkage::ALL {
        let c = Counted::run("count_syscalls.S", linkage);
        c.expect_syscall("write", &[("write_site", 7)]);
        c.expect_syscall(
            "getpid",
            &[
                ("getpid_site_a", 9),
                ("getpid_first", 1),
                ("getpid_site_b", 1),
                ("getpid_site_c", 1),
                ("getpid_site_d", 1),
            ],
        );
        let exit_group = c.report.syscall("exit_group").expect("exit_group");
        assert_eq!(as_u64(&exit_group["count"]), 1);
        assert_eq!(
            c.report.syscalls().len(),
            3,
            "only write, getpid, exit_group: {:?}",
            c.report.syscalls()
        );
        c.expect_blocks(&[
            ("write_loop", 7),
            ("getpid_loop", 9),
            ("getpid_straight", 1),
        ]);
        c.expect_edges("write_loop", &[("write_loop+0x18", "syscall", 7)]);
        c.expect_edges("getpid_loop", &[("getpid_loop+0x7", "syscall", 9)]);
        c.expect_valgrind_total();
    }
}

/// The other freestanding samples: instruction totals equal valgrind's, once `rep_extra`, the
/// instructions valgrind counts for the iterations of `rep`-prefixed instructions, is added.
///
/// valgrind (VEX) runs `rep movsb` with rcx = n as n + 1 executions of the instruction (one
/// per iteration, and a last one that finds rcx = 0); hotpath counts it once, as the hardware
/// retires it once. So each execution with count n adds exactly n to valgrind's total.
fn check_valgrind_total(source: &str, rep_extra: u64) {
    for linkage in Linkage::ALL {
        let exe = guest_build::build(source, linkage).unwrap_or_else(|e| panic!("{e}"));
        let name = format!("{source}.{linkage}");
        let run = run_with_report(&exe, &[], &scratch(), &name, &[]);
        assert_eq!(run.outcome.termination, Termination::Exited(0), "{name}");
        check_consistency(&exe, &run.report, &name);
        assert_eq!(run.report.json["ending"]["status"], "exited", "{name}");
        match valgrind_instructions(&exe, &[], Path::new("/")) {
            Some(n) => assert_eq!(
                run.report.total("guest_instructions") + rep_extra,
                n,
                "{name}: guest instructions, report (+ {rep_extra} rep iterations) vs valgrind --tool=lackey"
            ),
            None => eprintln!("valgrind is not installed: {name} not cross-checked"),
        }
    }
}

#[test]
fn instruction_count_is_exact_asm_retaddr() {
    check_valgrind_total("asm_retaddr.S", 0);
}

#[test]
fn instruction_count_is_exact_asm_redzone() {
    check_valgrind_total("asm_redzone.S", 0);
}

/// asm_flags has one `rep movsb`, in check 12, copying 8 bytes in each of its 6000 rounds.
#[test]
fn instruction_count_is_exact_asm_flags() {
    check_valgrind_total("asm_flags.S", 8 * 6000);
}

/// Indirect calls to four functions whose addresses share their low 16 bits (one slot of the
/// indirect branch lookup table), in turn: the victim table behind the lookup table keeps the
/// ones a fill pushes out, so after the first round the calls stay in the code cache (before
/// it, each of the 400,000 calls left it), and every call is still counted exactly.
#[test]
fn indirect_calls_to_colliding_targets_stay_in_the_code_cache() {
    let hotpath = hotpath_e2e::hotpath_bin::hotpath().unwrap_or_else(|e| panic!("{e}"));
    for linkage in Linkage::ALL {
        let exe = guest_build::build("ibl_collisions.c", linkage).unwrap_or_else(|e| panic!("{e}"));
        let name = format!("ibl_collisions.c.{linkage}");
        let out = std::process::Command::new(&hotpath)
            .args(["run", "--no-monitor", "--"])
            .arg(&exe)
            .output()
            .unwrap_or_else(|e| panic!("{name}: {e}"));
        let stdout = String::from_utf8_lossy(&out.stdout);
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(out.status.success(), "{name}: {stderr}");
        assert!(
            stdout.contains("after 100000 rounds; low 16 bits of the targets all zero"),
            "{name}: the targets do not collide as the test needs: {stdout}"
        );
        let misses: u64 = stderr
            .split(" indirect lookup misses")
            .next()
            .and_then(|s| s.rsplit(' ').next())
            .and_then(|n| n.parse().ok())
            .unwrap_or_else(|| panic!("{name}: no lookup misses in the summary: {stderr}"));
        // The program's own first misses (every return and indirect call target once, a
        // dynamic program's start-up in ld.so and libc): a few hundred.
        assert!(
            misses < 5_000,
            "{name}: {misses} lookup misses for 400,000 calls to 4 colliding targets"
        );
        let run = run_with_report(&exe, &[], &scratch(), &name, &[]);
        assert_eq!(run.outcome.termination, Termination::Exited(0), "{name}");
        for f in ["f0", "f1", "f2", "f3"] {
            assert_eq!(run.report.count(f), 100_000, "{name}: executions of {f}");
        }
    }
}
