//! What code the translators put where, for host profilers (`--perf-map`): one record per
//! translated block, superblock block, context stub, jump-table stub and gateway, kept in
//! the order it was made. The embedder names each record's guest address and writes the map
//! perf reads (`/tmp/perf-PID.map`, the format of perf's `jit` interface, as QEMU's `-perfmap`
//! writes it).

/// What a stretch of the code cache holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum CodeKind {
    /// A basic block's translation.
    Block,
    /// One block of a superblock.
    Superblock,
    /// A calling-context stub at a function entry.
    ContextStub,
    /// The stub a `switch` index of a jump-table site goes to (`jump_table`).
    JumpTableStub,
    /// The gateway: hotpath's own routines between the dispatcher and translated code.
    Gateway,
}

/// One stretch of translated code.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct CodeRecord {
    /// Host address of its first byte and one past its last (the executable view).
    pub host_start: u64,
    pub host_end: u64,
    /// Guest address it translates (0 for the gateway).
    pub guest: u64,
    pub kind: CodeKind,
}

/// The records of a process, when `--perf-map` asked for them.
#[derive(Debug, Default)]
pub struct CodeLog {
    records: Vec<CodeRecord>,
}

impl CodeLog {
    /// Adds a record (code just put in a cache; it may reuse a flushed cache's addresses).
    pub fn push(&mut self, r: CodeRecord) {
        if r.host_end > r.host_start {
            self.records.push(r);
        }
    }

    /// The records whose code is still where they say, by host address: of overlapping
    /// records (a cache flushed and filled again), the later one.
    pub fn current(&self) -> Vec<CodeRecord> {
        let mut by_start: std::collections::BTreeMap<u64, CodeRecord> = Default::default();
        for r in &self.records {
            // Every record that overlaps `r` is older: remove it. Records do not overlap each
            // other in the map, so at most one starts before `r` and reaches into it.
            let before = by_start
                .range(..r.host_start)
                .next_back()
                .filter(|(_, o)| o.host_end > r.host_start)
                .map(|(&s, _)| s);
            let inside: Vec<u64> = by_start
                .range(r.host_start..r.host_end)
                .map(|(&s, _)| s)
                .collect();
            for s in before.into_iter().chain(inside) {
                by_start.remove(&s);
            }
            by_start.insert(r.host_start, *r);
        }
        by_start.into_values().collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rec(s: u64, e: u64, guest: u64) -> CodeRecord {
        CodeRecord {
            host_start: s,
            host_end: e,
            guest,
            kind: CodeKind::Block,
        }
    }

    #[test]
    fn later_code_replaces_what_it_overlaps() {
        let mut log = CodeLog::default();
        log.push(rec(0, 16, 1));
        log.push(rec(16, 48, 2));
        log.push(rec(48, 64, 3));
        log.push(rec(70, 70, 9)); // empty: not kept
                                  // A flush, then new code over the first two and part of the third.
        log.push(rec(8, 50, 4));
        log.push(rec(100, 120, 5));
        let cur: Vec<u64> = log.current().iter().map(|r| r.guest).collect();
        assert_eq!(cur, vec![4, 5]);
        let mut log = CodeLog::default();
        log.push(rec(0, 16, 1));
        log.push(rec(16, 32, 2));
        assert_eq!(log.current().len(), 2, "adjacent records do not overlap");
    }
}
