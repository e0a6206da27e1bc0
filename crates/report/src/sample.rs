//! A small report for the unit tests: a PIE loaded at `base` whose `main` calls `f` twice in
//! a loop of two iterations.

use crate::*;

/// The report of one run with the program's module at `base`.
pub(crate) fn pie_run(base: u64) -> Report {
    let a = |off: u64| Addr(base + off);
    let block = |off: u64, count: u64, instructions: u32, terminator, symbol: &str| Block {
        addr: a(off),
        count,
        instructions,
        bytes: 4 * instructions,
        terminator,
        symbol: Some(symbol.to_string()),
        module: Some(0),
        offset: Some(Addr(off)),
        code: None,
    };
    Report {
        schema: SCHEMA.to_string(),
        program: "/bin/prog".into(),
        argv: vec!["prog".into()],
        ending: Ending::Exited { code: 0 },
        totals: Totals {
            blocks_executed: 7,
            guest_instructions: 2 * 2 + 2 * 3 + 2 * 5 + 1,
            distinct_blocks: 4,
            ..Totals::default()
        },
        threads: vec![Thread {
            tid: 1,
            events: 7,
            blocks_executed: 7,
            guest_instructions: 21,
            ring_waits: 0,
            ring_wait_ns: 0,
            hottest: vec![Count {
                addr: a(0x100),
                count: 2,
            }],
            path_profile: None,
        }],
        blocks: vec![
            block(0x100, 2, 2, Terminator::Call, "main"),
            block(0x108, 2, 3, Terminator::Branch, "main+0x8"),
            block(0x114, 1, 1, Terminator::Syscall, "main+0x14"),
            block(0x200, 2, 5, Terminator::Return, "f"),
        ],
        modules: vec![Module {
            path: "/bin/prog".into(),
            base: Addr(base),
            size: 0x1000,
            build_id: Some("abcd".into()),
            unloaded: false,
        }],
        edges: vec![
            Edge {
                from: a(0x100),
                to: a(0x200),
                kind: EdgeKind::Call,
                count: 2,
            },
            Edge {
                from: a(0x108),
                to: a(0x100),
                kind: EdgeKind::Taken,
                count: 1,
            },
            Edge {
                from: a(0x108),
                to: a(0x114),
                kind: EdgeKind::NotTaken,
                count: 1,
            },
        ],
        indirect_jumps: vec![IndirectSite {
            site: a(0x210),
            kind: Terminator::Return,
            count: 2,
            predictability: Predictability::Monomorphic,
            targets: vec![Count {
                addr: a(0x108),
                count: 2,
            }],
        }],
        syscalls: vec![Syscall {
            nr: 231,
            name: "exit_group".into(),
            count: 1,
            sites: vec![Count {
                addr: a(0x116),
                count: 1,
            }],
        }],
        superblocks: Vec::new(),
        path_profile: None,
    }
}
