//! What the code cache holds besides code: each translation's layout (host addresses back to
//! guest state, for the dispatcher and the signal handler) and its exits (where it leaves the
//! cache, and the link sites chaining patches). The emitters make them; the cache, the
//! dispatcher and the signal handler read them.

use hotpath_ir::{BlockId, GuestAddr, HostAddr, TrapKind};

use super::sorted_runs::{RunsView, SortedRuns};

/// Why a block's exit stub leaves the code cache.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ExitKind {
    /// A direct branch not yet chained: translate `target`, patch the rel32 at `site`.
    /// `stub` is the exit stub the rel32 points at until then (and again after an unlink).
    /// `call`: the jump of a `call` to its callee. `from`: the guest start of the basic block
    /// whose terminator this is.
    Direct {
        target: GuestAddr,
        from: GuestAddr,
        site: HostAddr,
        stub: HostAddr,
        call: bool,
    },
    /// The guest executed `syscall` at `at`; it resumes at `next`.
    Syscall { at: GuestAddr, next: GuestAddr },
    /// A superblock's side exit found the ring's lap full: enqueue `marker`, then go on at
    /// guest `target` (the dispatcher does what the side exit's enqueue stub would have).
    SideExit { marker: BlockId, target: GuestAddr },
    /// The same for a `ret` inlined in a superblock whose return address was not the
    /// predicted one: enqueue `marker`, then return (pop the address and `pop - 8` more bytes)
    /// as the `ret` at guest `at` does.
    SideExitReturn {
        marker: BlockId,
        at: GuestAddr,
        pop: u32,
    },
    /// The same for an indirect `jmp` (`return_to` `None`) or `call` (pushing `return_to`)
    /// at guest `at` inlined in a superblock whose target, in `ibl_target`, was not the
    /// trace's next block: enqueue `marker`, then branch there as the instruction does.
    SideExitIndirect {
        marker: BlockId,
        at: GuestAddr,
        return_to: Option<GuestAddr>,
    },
    /// Jump-table site `site`'s table had no stub for the `switch` index in the thread area's
    /// `jump_table_index` (the guest's `add` done, the case's address in the `jmp`'s
    /// register): the runtime makes one and goes on at the case (`jump_table`).
    JumpTableFill { site: u32 },
    /// The guest reached a trapping instruction at `at`; `next` is the address after it.
    Trap {
        kind: TrapKind,
        at: GuestAddr,
        next: GuestAddr,
    },
}

impl ExitKind {
    /// The patchable rel32 of a linkable exit and the exit stub it aims at when unlinked.
    pub fn link_site(&self) -> Option<(HostAddr, HostAddr)> {
        match *self {
            ExitKind::Direct { site, stub, .. } => Some((site, stub)),
            _ => None,
        }
    }
}

/// One exit of an emitted block.
#[derive(Clone, Copy, Debug)]
pub struct Exit {
    /// The block the exit belongs to.
    pub block: BlockId,
    /// What to do when it is taken.
    pub kind: ExitKind,
}

/// Where the parts of a block's host code are, so a fault or signal at a host address can be
/// mapped back to a precise guest state.
#[derive(Clone, Debug, Default)]
pub struct HostLayout {
    /// Host address of the first byte of the block's code (the ring slow path, if any).
    pub code_start: u64,
    /// Host address of the block entry.
    pub entry: u64,
    /// Guest address of the block.
    pub guest_start: u64,
    /// One past the last byte.
    pub code_end: u64,
    /// `(host address, guest address)` of every body instruction, in order.
    pub body: Vec<(u64, u64)>,
    /// Host address where the terminator's code starts.
    pub term_start: u64,
    /// Guest address of the terminating instruction (the block's end when it has none).
    pub term_guest: u64,
    /// From this host address on (to the end), RCX holds a borrowed value; the guest's is in
    /// `scratch_rcx`.
    pub rcx_borrowed_from: Option<u64>,
    /// `(host address, register number)` of each instruction that runs with a register
    /// borrowed to address a far RIP-relative operand (see `emit::encode_at`): at a fault there,
    /// the guest's value of that register is in the thread area's `scratch_far` slot.
    pub far_borrows: Vec<(u64, u8)>,
    /// For one block of a superblock: the side-exit event that says "the superblock ended
    /// after this block", which the dispatcher enqueues when a fault here ends the trace.
    pub trace_exit: Option<u32>,
}

/// `(guest target, exit index)` of each direct exit a dispatcher linked (some since unlinked):
/// where another thread that wants the guest out of the cache at a target finds the links
/// into it without reading every exit. A reader in another thread or a signal handler reads
/// it through [`SortedRuns::view`], published while the owner does not change it.
pub type LinkedExits = SortedRuns<(u64, u32)>;

/// The exits linked to one of `targets` in `linked` (an exit linked twice may come twice).
pub fn exits_into<'a>(
    linked: RunsView<'a, (u64, u32)>,
    targets: &'a [u64],
) -> impl Iterator<Item = u32> + 'a {
    let in_runs = linked.runs().flat_map(move |run| {
        targets.iter().flat_map(move |&t| {
            let from = run.partition_point(|&(target, _)| target < t);
            let to = run.partition_point(|&(target, _)| target <= t);
            run[from..to].iter().map(|&(_, e)| e)
        })
    });
    let recent = linked
        .tail()
        .iter()
        .filter(move |(target, _)| targets.contains(target))
        .map(|&(_, e)| e);
    in_runs.chain(recent)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every target's exits are found, against a brute-force scan of every link pushed.
    #[test]
    fn linked_exits_find_every_link() {
        let mut l = LinkedExits::default();
        let mut all = Vec::new();
        let mut x: u64 = 12345;
        for exit in 0..100_000u32 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let target = 0x400000 + (x >> 33) % 30_000;
            // Some links are made twice.
            let exit = if exit % 7 == 0 { exit / 2 } else { exit };
            l.push((target, exit));
            all.push((target, exit));
            if exit % 9_973 == 0 {
                let targets = [target, 0x400000 + (x >> 40) % 30_000, 1];
                let mut found: Vec<u32> = exits_into(l.view(), &targets).collect();
                found.sort_unstable();
                found.dedup();
                let mut want: Vec<u32> = all
                    .iter()
                    .filter(|(t, _)| targets.contains(t))
                    .map(|&(_, e)| e)
                    .collect();
                want.sort_unstable();
                want.dedup();
                assert_eq!(found, want);
            }
        }
    }
}
