//! Reading hotpath's JSON report (`--report FILE`, schema in docs/report-schema.md) in tests:
//! running a guest with a report, looking blocks, edges and indirect sites up by symbol, and
//! the consistency every report must have (totals add up, control flow is conserved).

use std::collections::HashMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::process::Command;

use serde_json::Value;

use crate::{hotpath_bin, runner, set_guest_environment, Outcome};

/// A guest run under `hotpath run --quiet --report FILE`, and the parsed report.
pub struct ReportRun {
    pub outcome: Outcome,
    pub report: Report,
    /// Where the report was written (children's reports are `<file>.<pid>`).
    pub file: PathBuf,
}

/// Runs `exe args` under `hotpath run --quiet [hotpath_args] --report <dir>/<name>.json` with
/// the guest environment, in `dir`.
///
/// # Panics
///
/// When hotpath cannot run, or writes no report or one that is not JSON.
pub fn run_with_report(
    exe: &Path,
    args: &[&str],
    dir: &Path,
    name: &str,
    hotpath_args: &[&str],
) -> ReportRun {
    let hotpath =
        hotpath_bin::hotpath().unwrap_or_else(|e| panic!("no hotpath binary to test: {e}"));
    let file = dir.join(format!("{name}.json"));
    let _ = fs::remove_file(&file);
    let mut cmd = Command::new(&hotpath);
    cmd.arg("run")
        .arg("--quiet")
        .args(hotpath_args)
        .arg("--report")
        .arg(&file)
        .arg("--")
        .arg(exe)
        .args(args);
    set_guest_environment(&mut cmd, dir);
    let what = runner::describe(&cmd);
    let outcome =
        runner::run(&mut cmd, crate::run_timeout()).unwrap_or_else(|e| panic!("{what}: {e}"));
    let report = Report::read(&file).unwrap_or_else(|e| {
        panic!(
            "{what} ({}): {e}\nstderr: {}",
            outcome.termination,
            String::from_utf8_lossy(&outcome.stderr)
        )
    });
    ReportRun {
        outcome,
        report,
        file,
    }
}

/// A parsed report.
pub struct Report {
    pub json: Value,
}

/// A report value as u64 (counts, and `"0x…"` addresses).
pub fn as_u64(v: &Value) -> u64 {
    if let Some(n) = v.as_u64() {
        return n;
    }
    let s = v
        .as_str()
        .unwrap_or_else(|| panic!("not a number or address: {v}"));
    u64::from_str_radix(s.trim_start_matches("0x"), 16)
        .unwrap_or_else(|e| panic!("bad address {s}: {e}"))
}

impl Report {
    /// Reads and parses a report file.
    ///
    /// # Errors
    ///
    /// A message when the file is missing or not JSON.
    pub fn read(file: &Path) -> Result<Report, String> {
        let text =
            fs::read_to_string(file).map_err(|e| format!("no report {}: {e}", file.display()))?;
        let json = serde_json::from_str(&text)
            .map_err(|e| format!("report {} is not JSON: {e}", file.display()))?;
        Ok(Report { json })
    }

    pub fn total(&self, field: &str) -> u64 {
        as_u64(&self.json["totals"][field])
    }

    pub fn blocks(&self) -> &[Value] {
        self.json["blocks"]
            .as_array()
            .map(Vec::as_slice)
            .expect("blocks is an array")
    }

    pub fn edges(&self) -> &[Value] {
        self.json["edges"]
            .as_array()
            .map(Vec::as_slice)
            .expect("edges is an array")
    }

    pub fn indirect_sites(&self) -> &[Value] {
        self.json["indirect_jumps"]
            .as_array()
            .map(Vec::as_slice)
            .expect("indirect_jumps is an array")
    }

    pub fn syscalls(&self) -> &[Value] {
        self.json["syscalls"]
            .as_array()
            .map(Vec::as_slice)
            .expect("syscalls is an array")
    }

    /// The one block whose `symbol` is exactly `symbol` (`name` or `name+0xOFF`).
    ///
    /// # Panics
    ///
    /// When there is none or more than one.
    pub fn block(&self, symbol: &str) -> &Value {
        let found: Vec<&Value> = self
            .blocks()
            .iter()
            .filter(|b| b["symbol"].as_str() == Some(symbol))
            .collect();
        match found.as_slice() {
            [b] => b,
            [] => panic!(
                "no block named {symbol} in the report; blocks: {}",
                self.block_names()
            ),
            _ => panic!("{} blocks named {symbol}", found.len()),
        }
    }

    /// Executions of the block named `symbol`.
    pub fn count(&self, symbol: &str) -> u64 {
        as_u64(&self.block(symbol)["count"])
    }

    /// Address of the block named `symbol`.
    pub fn addr(&self, symbol: &str) -> u64 {
        as_u64(&self.block(symbol)["addr"])
    }

    /// The block names, for messages.
    pub fn block_names(&self) -> String {
        let names: Vec<String> = self
            .blocks()
            .iter()
            .map(|b| self.name_of(as_u64(&b["addr"])))
            .collect();
        names.join(", ")
    }

    /// The symbol of the block at `addr`, or the address in hex.
    pub fn name_of(&self, addr: u64) -> String {
        self.blocks()
            .iter()
            .find(|b| as_u64(&b["addr"]) == addr)
            .and_then(|b| b["symbol"].as_str().map(str::to_string))
            .unwrap_or_else(|| format!("{addr:#x}"))
    }

    /// The edges leaving the block named `symbol`: (target block name, kind, count), sorted.
    pub fn edges_from(&self, symbol: &str) -> Vec<(String, String, u64)> {
        let from = self.addr(symbol);
        let mut out: Vec<(String, String, u64)> = self
            .edges()
            .iter()
            .filter(|e| as_u64(&e["from"]) == from)
            .map(|e| {
                (
                    self.name_of(as_u64(&e["to"])),
                    e["kind"].as_str().unwrap_or("?").to_string(),
                    as_u64(&e["count"]),
                )
            })
            .collect();
        out.sort();
        out
    }

    /// The indirect branch site at `site`.
    pub fn indirect_site(&self, site: u64) -> &Value {
        self.indirect_sites()
            .iter()
            .find(|s| as_u64(&s["site"]) == site)
            .unwrap_or_else(|| {
                panic!(
                    "no indirect site at {site:#x}; sites: {:?}",
                    self.indirect_sites()
                        .iter()
                        .map(|s| s["site"].clone())
                        .collect::<Vec<_>>()
                )
            })
    }

    /// The targets of an indirect site: (target block name, count), in report order.
    pub fn targets(&self, site: &Value) -> Vec<(String, u64)> {
        site["targets"]
            .as_array()
            .expect("targets is an array")
            .iter()
            .map(|t| (self.name_of(as_u64(&t["addr"])), as_u64(&t["count"])))
            .collect()
    }

    /// The syscall table row named `name`, if that syscall was made.
    pub fn syscall(&self, name: &str) -> Option<&Value> {
        self.syscalls().iter().find(|s| s["name"] == name)
    }
}

/// The ELF symbol table of `exe` as printed by `nm`: name → address.
///
/// # Panics
///
/// When nm cannot run.
pub fn nm(exe: &Path) -> HashMap<String, u64> {
    let out = Command::new("nm")
        .arg(exe)
        .output()
        .unwrap_or_else(|e| panic!("cannot run nm: {e}"));
    let mut map = HashMap::new();
    for line in String::from_utf8_lossy(&out.stdout).lines() {
        let mut parts = line.split_whitespace();
        if let (Some(addr), Some(_kind), Some(name)) = (parts.next(), parts.next(), parts.next()) {
            if let Ok(a) = u64::from_str_radix(addr, 16) {
                map.insert(name.to_string(), a);
            }
        }
    }
    map
}

/// Checks what every report must satisfy, and returns every violation (empty when fine):
/// - `schema`, and `program` naming `exe`;
/// - totals: `blocks_executed` = Σ count, `guest_instructions` = Σ count × instructions,
///   `distinct_blocks` = number of blocks;
/// - control flow is conserved (docs/report-schema.md): a block's count equals the counts of
///   its outgoing edges plus its indirect site's targets, plus one for the last block executed;
///   so over all blocks the surplus is 0 or 1 and never negative.
pub fn consistency_problems(exe: &Path, report: &Report) -> Vec<String> {
    let mut problems = Vec::new();
    let json = &report.json;
    if json["schema"] != "hotpath-report/2" {
        problems.push(format!("schema is {}", json["schema"]));
    }
    let program = json["program"].as_str().unwrap_or("");
    if fs::canonicalize(program).ok() != fs::canonicalize(exe).ok() {
        problems.push(format!(
            "program {program} is not the guest {}",
            exe.display()
        ));
    }
    let blocks = report.blocks();
    if blocks.is_empty() {
        problems.push("no blocks: nothing was translated?".into());
    }
    let executed: u64 = blocks.iter().map(|b| as_u64(&b["count"])).sum();
    let instructions: u64 = blocks
        .iter()
        .map(|b| as_u64(&b["count"]) * as_u64(&b["instructions"]))
        .sum();
    for (field, want) in [
        ("blocks_executed", executed),
        ("guest_instructions", instructions),
        ("distinct_blocks", blocks.len() as u64),
    ] {
        let got = report.total(field);
        if got != want {
            problems.push(format!(
                "totals.{field} is {got}, the blocks add up to {want}"
            ));
        }
    }

    // Conservation is checked per node: a block, except that blocks ending at the same
    // indirect site (overlapping blocks) form one node, as their targets are counted per site.
    let mut node_of: HashMap<u64, u64> = HashMap::new(); // block addr -> node id
    let mut nodes: HashMap<u64, (u64, u64, String)> = HashMap::new(); // id -> (count, outflow, name)
                                                                      // The blocks ending in an indirect branch, by their end: a site is the last instruction
                                                                      // of the blocks it ends, so they end within 15 bytes (an instruction's longest) after it
                                                                      // (a search of every block for every site took minutes on 100,000 blocks).
    let mut indirect_by_end: HashMap<u64, Vec<u64>> = HashMap::new();
    for b in blocks {
        if matches!(
            b["terminator"].as_str(),
            Some("indirect_jump" | "indirect_call" | "return")
        ) {
            let start = as_u64(&b["addr"]);
            indirect_by_end
                .entry(start + as_u64(&b["bytes"]))
                .or_default()
                .push(start);
        }
    }
    for site in report.indirect_sites() {
        let at = as_u64(&site["site"]);
        let targets: u64 = site["targets"]
            .as_array()
            .map(|t| t.iter().map(|t| as_u64(&t["count"])).sum())
            .unwrap_or(0);
        if targets != as_u64(&site["count"]) {
            problems.push(format!(
                "indirect site {at:#x}: count {} but its targets add up to {targets}",
                as_u64(&site["count"])
            ));
        }
        let mut owners = 0;
        for end in at + 1..=at + 15 {
            for &start in indirect_by_end.get(&end).into_iter().flatten() {
                if start <= at {
                    node_of.insert(start, at);
                    owners += 1;
                }
            }
        }
        if owners == 0 {
            problems.push(format!("indirect site {at:#x} ends no block"));
        }
        nodes.insert(at, (0, targets, format!("indirect site {at:#x}")));
    }
    for b in blocks {
        let addr = as_u64(&b["addr"]);
        let id = *node_of.entry(addr).or_insert(addr);
        let name = b["symbol"]
            .as_str()
            .map_or_else(|| format!("{addr:#x}"), str::to_string);
        let node = nodes.entry(id).or_insert((0, 0, name));
        node.0 += as_u64(&b["count"]);
    }
    for e in report.edges() {
        let from = as_u64(&e["from"]);
        match node_of.get(&from) {
            Some(id) => nodes.get_mut(id).expect("node").1 += as_u64(&e["count"]),
            None => problems.push(format!("edge from {from:#x}, which is not a block")),
        }
    }
    let mut surplus_total: i128 = 0;
    let mut bad = Vec::new();
    for (id, (count, out, name)) in &nodes {
        let surplus = i128::from(*count) - i128::from(*out);
        surplus_total += surplus;
        if !(0..=1).contains(&surplus) {
            bad.push(format!(
                "{name} ({id:#x}): ran {count} times, left {out} times"
            ));
        }
    }
    bad.sort();
    if !bad.is_empty() || !(0..=1).contains(&surplus_total) {
        bad.truncate(20);
        problems.push(format!(
            "control flow is not conserved (a block's count must equal its outgoing edges and \
             indirect targets, +1 for the last block; total surplus {surplus_total}):\n    {}",
            bad.join("\n    ")
        ));
    }
    problems
}

/// [`consistency_problems`], as an assertion.
///
/// # Panics
///
/// With every violation.
pub fn check_consistency(exe: &Path, report: &Report, what: &str) {
    let problems = consistency_problems(exe, report);
    assert!(
        problems.is_empty(),
        "{what}: the report is inconsistent:\n  {}",
        problems.join("\n  ")
    );
}

/// The parts of a report that describe the guest's execution, not how it was observed:
/// everything a run's report must share with another run of the same program, without the
/// timing-dependent `totals.ring_waits`, `ring_wait_ns`, `monitor_busy_ns`, `translation_ns`
/// and `events` (how many events there were depends on when superblocks formed) and without
/// `superblocks`.
pub fn execution(report: &Report) -> Value {
    let j = &report.json;
    let mut totals = j["totals"].clone();
    let t = totals.as_object_mut().expect("totals");
    for timing in [
        "ring_waits",
        "ring_wait_ns",
        "events",
        "monitor_busy_ns",
        "translation_ns",
    ] {
        t.remove(timing);
    }
    serde_json::json!({
        "totals": totals,
        "blocks": j["blocks"],
        "edges": j["edges"],
        "indirect_jumps": j["indirect_jumps"],
        "syscalls": j["syscalls"],
        "ending": j["ending"],
    })
}

/// Asserts that two runs' reports describe the same execution ([`execution`]), naming the
/// first field that differs: `what` says which program, `a` and `b` label the two runs.
///
/// # Panics
///
/// When a field differs.
pub fn assert_same_execution(first: &Report, second: &Report, what: &str, labels: (&str, &str)) {
    let (a, b) = (execution(first), execution(second));
    for field in [
        "totals",
        "blocks",
        "edges",
        "indirect_jumps",
        "syscalls",
        "ending",
    ] {
        assert!(
            a[field] == b[field],
            "{what}: `{field}` differs between {} and {}:\n{}: {}\n{}: {}",
            labels.0,
            labels.1,
            labels.0,
            a[field],
            labels.1,
            b[field]
        );
    }
}

/// valgrind's count of guest instructions executed by `exe args` (`--tool=lackey
/// --basic-counts=yes`, its "guest instrs" line), or `None` without valgrind.
pub fn valgrind_instructions(exe: &Path, args: &[&str], cwd: &Path) -> Option<u64> {
    let mut cmd = Command::new("valgrind");
    cmd.args(["--tool=lackey", "--basic-counts=yes"])
        .arg(exe)
        .args(args);
    set_guest_environment(&mut cmd, cwd);
    let out = cmd.output().ok()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    let line = stderr.lines().find(|l| l.contains("guest instrs:"))?;
    let digits: String = line
        .rsplit(':')
        .next()?
        .chars()
        .filter(char::is_ascii_digit)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    /// A loop: `head` (branch) runs 3 times, taken twice back to itself, then `tail` (syscall,
    /// the last block) once; `head` is entered once from nowhere (the entry).
    fn looping_report() -> Report {
        Report {
            json: json!({
                "schema": "hotpath-report/2",
                "program": "/proc/self/exe",
                "totals": {"blocks_executed": 4, "guest_instructions": 7, "distinct_blocks": 2},
                "blocks": [
                    {"addr": "0x1000", "count": 3, "instructions": 2, "bytes": 6, "terminator": "branch", "symbol": "head"},
                    {"addr": "0x1006", "count": 1, "instructions": 1, "bytes": 2, "terminator": "syscall", "symbol": "tail"}
                ],
                "edges": [
                    {"from": "0x1000", "to": "0x1000", "kind": "taken", "count": 2},
                    {"from": "0x1000", "to": "0x1006", "kind": "not_taken", "count": 1}
                ],
                "indirect_jumps": [],
                "syscalls": []
            }),
        }
    }

    #[test]
    fn a_consistent_report_passes() {
        let exe = std::env::current_exe().expect("exe");
        let problems = consistency_problems(&exe, &looping_report());
        assert!(
            problems.iter().all(|p| p.contains("program")),
            "{problems:?}"
        );
    }

    #[test]
    fn a_lost_edge_or_a_wrong_total_is_caught() {
        let exe = std::env::current_exe().expect("exe");
        let mut r = looping_report();
        r.json["edges"][0]["count"] = json!(1);
        let problems = consistency_problems(&exe, &r);
        assert!(
            problems.iter().any(|p| p.contains("not conserved")),
            "{problems:?}"
        );
        let mut r = looping_report();
        r.json["totals"]["guest_instructions"] = json!(8);
        let problems = consistency_problems(&exe, &r);
        assert!(
            problems.iter().any(|p| p.contains("guest_instructions")),
            "{problems:?}"
        );
    }
}
