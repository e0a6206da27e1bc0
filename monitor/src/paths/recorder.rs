//! The recorder: its configuration, its state, and the per-block step (the reference the sums
//! recorder is checked against, and what it falls back on).

use hotpath_events::is_id;

use super::frames::{
    Activation, CallNode, Resync, ANY_FUNC, CALL_CACHE_SLOTS, K_CALL, K_INDIRECT, K_RET,
};
use super::function::{Function, FunctionSymbol};
use super::ids::{FxMap, NONE};
use super::numbering::Spelled;
use super::pap_runs::PapRuns;
use super::programs::Pairs;
use super::runs::Runs;
use super::trie::{PathRec, TrieNode, NO_END, START_HEAD};
use crate::tables::Expander;
use crate::Tables;

/// Path ends (of any activation) after which a function is hot and its new activations also
/// record PAP runs. Default; `--pap-threshold` overrides it.
pub const DEFAULT_PAP_THRESHOLD: u64 = 1000;

/// What to record besides the tables.
#[derive(Clone, Debug)]
pub struct PathConfig {
    /// Path ends after which a function records PAP runs (0: every function; `u64::MAX`:
    /// none).
    pub pap_threshold: u64,
    /// Whether the calling-context tree is kept (folded stacks for flame graphs, callgrind's
    /// inclusive costs, pprof's contexts); without it every activation counts in the root.
    pub call_tree: bool,
    /// Ball-Larus paths per k-iteration path (`--k`); 0 keeps no k-slab forest.
    pub k: usize,
    /// Function symbols, sorted by address.
    pub symbols: Vec<FunctionSymbol>,
    /// Which recorder keeps the paths.
    pub recorder: Recorder,
}

/// The path recorders: every one gives the same profile.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub enum Recorder {
    /// The shadow stack and the path trie stepped once per basic block: the reference the
    /// others are checked against (several times slower).
    PerBlock,
    /// Ball-Larus sums: each activation keeps its path as a sum of edge values under its
    /// function's numbering as seen so far (`numbering.rs`, `sums.rs`), a run of blocks is a
    /// program per pair of events (`pairs.rs`); counted per id, spelled only when the
    /// numbering changes and at the end. The default.
    #[default]
    Sums,
}

impl Default for PathConfig {
    fn default() -> Self {
        PathConfig {
            pap_threshold: DEFAULT_PAP_THRESHOLD,
            call_tree: true,
            k: 0,
            symbols: Vec::new(),
            recorder: Recorder::Sums,
        }
    }
}

/// The online path recorder: shadow stack, functions, interned paths.
#[derive(Clone)]
pub struct PathRecorder {
    pub(crate) config: PathConfig,
    pub(crate) funcs: Vec<Function>,
    pub(crate) func_by_entry: FxMap<u64, u32>,
    /// Per block id: guest address, terminator class, return address of calls (placeholders
    /// for superblock and side-exit ids).
    pub(crate) id_addr: Vec<u64>,
    pub(crate) id_kind: Vec<u8>,
    pub(crate) id_ret: Vec<u64>,
    /// Per block id: the function whose entry it is, or NONE.
    pub(crate) id_entry: Vec<u32>,
    /// Per block id: (function, node) where it was last seen.
    pub(crate) id_node: Vec<(u32, u32)>,
    /// Per block id: the trie root of a path of `id_node`'s function starting at it after an
    /// entry (a call, tail call or resync), or [`NONE`].
    pub(crate) id_root: Vec<u32>,
    /// Guest address → the first block id with that address (to refresh `id_entry`); the
    /// others (the address translated again) in `more_ids_at`. One id per address is the
    /// rule: a `Vec` per address was an allocation per id, and each thread's recorder learns
    /// every id of the process.
    pub(crate) ids_at: FxMap<u64, u32>,
    /// Guest address → its block ids after the first.
    pub(crate) more_ids_at: FxMap<u64, Vec<u32>>,
    /// Guest address → the first function given a node there other than its entry (the sums
    /// recorder's: when a call makes the address an entry, the pair programs of every
    /// function that took it for a step of its paths are stale); the others in
    /// `more_funcs_at`.
    pub(crate) funcs_at: FxMap<u64, u32>,
    /// Guest address → the functions given a node there after the first.
    pub(crate) more_funcs_at: FxMap<u64, Vec<u32>>,
    pub(crate) stack: Vec<Activation>,
    /// The path trie.
    pub(crate) trie: Vec<TrieNode>,
    /// Trie roots by `(function, start tag, node)`.
    pub(crate) roots: FxMap<(u32, u32, u32), u32>,
    /// Trie children by `(parent, node)` (behind `TrieNode::last_child`).
    pub(crate) children: FxMap<(u32, u32), u32>,
    /// Path numbers by `(trie node, end tag)` (behind `TrieNode::last_end`).
    pub(crate) ends: FxMap<(u32, u32), u32>,
    pub(crate) paths: Vec<PathRec>,
    /// The PAP run trie.
    pub(crate) pap_runs: PapRuns,
    pub(crate) calltree: Vec<CallNode>,
    pub(crate) call_child: FxMap<(u32, u32), u32>,
    /// Direct-mapped cache in front of `call_child`: (parent, function, child).
    pub(crate) call_cache: Box<[(u32, u32, u32)]>,
    /// The last basic block stepped.
    pub(crate) prev: u32,
    /// What each event id stands for (see `runs`).
    pub(crate) runs: Runs,
    /// The sums recorder's pair programs.
    pub(crate) pairs: Pairs,
    /// Per function: bumped when pair programs compiled for it may no longer hold (see
    /// `pairs`).
    pub(crate) fepoch: Vec<u32>,
    /// The sums recorder's dense path counters: a block per function with few paths (see
    /// `Function::dense_base`).
    pub(crate) dense: Vec<u64>,
    /// Beside `dense`: each id's path number once looked up (for PAP runs), or [`NONE`].
    pub(crate) dense_numbers: Vec<u32>,
    /// A path spelled from its id (the sums recorder's buffer).
    pub(crate) spelled: Spelled,
    /// `per_block` mode: superblock events turned back into blocks.
    pub(crate) expander: Expander,
    pub(crate) expanded: Vec<u32>,
    /// [`Recorder::Sums`]: activations keep Ball-Larus sums (functions whose numbering
    /// overflowed keep trie nodes).
    pub(crate) sums: bool,
    /// Activations tally the blocks, guest instructions and path ends of their paths (into
    /// their call-tree node and function): only the call tree's folded stacks and the PAP
    /// threshold read them, so the default profile (neither) does not pay for it at every
    /// call, return and path end; the paths' counts say the same when the profile is taken.
    pub(crate) tallies: bool,
    /// Times the shadow stack had to be resynchronised (returns to another frame, unwinding,
    /// tail calls, returns to no frame).
    pub resyncs: u64,
    /// [`PathRecorder::resyncs`] by cause, indexed by [`Resync`].
    pub resync_kinds: [u64; Resync::ALL.len()],
    /// Shadow-stack frames dropped for exceeding [`SHADOW_STACK_MAX`].
    pub dropped_frames: u64,
}

impl PathRecorder {
    /// An empty recorder.
    pub fn new(mut config: PathConfig) -> PathRecorder {
        config.symbols.sort_by_key(|s| s.addr);
        let sums = config.recorder == Recorder::Sums;
        // Without a call tree the root is every activation's node.
        let (last_func, last_child) = if config.call_tree {
            (NONE, NONE)
        } else {
            (ANY_FUNC, 0)
        };
        PathRecorder {
            sums,
            tallies: config.call_tree || config.pap_threshold != u64::MAX,
            config,
            funcs: Vec::new(),
            func_by_entry: FxMap::default(),
            id_addr: Vec::new(),
            id_kind: Vec::new(),
            id_ret: Vec::new(),
            id_entry: Vec::new(),
            id_node: Vec::new(),
            id_root: Vec::new(),
            ids_at: FxMap::default(),
            more_ids_at: FxMap::default(),
            funcs_at: FxMap::default(),
            more_funcs_at: FxMap::default(),
            stack: Vec::new(),
            trie: Vec::new(),
            roots: FxMap::default(),
            children: FxMap::default(),
            ends: FxMap::default(),
            paths: Vec::new(),
            pap_runs: PapRuns::default(),
            calltree: vec![CallNode {
                parent: NONE,
                func: NONE,
                blocks: 0,
                instructions: 0,
                depth: 0,
                last_func,
                last_child,
            }],
            call_child: FxMap::default(),
            call_cache: vec![(NONE, NONE, NONE); CALL_CACHE_SLOTS].into_boxed_slice(),
            prev: NONE,
            runs: Runs::default(),
            pairs: Pairs::new(),
            dense: Vec::new(),
            dense_numbers: Vec::new(),
            spelled: Spelled::default(),
            fepoch: Vec::new(),
            expander: Expander::default(),
            expanded: Vec::new(),
            resyncs: 0,
            resync_kinds: [0; Resync::ALL.len()],
            dropped_frames: 0,
        }
    }

    /// Continues the top activation with block `id` (an intra-procedural edge): a back edge
    /// (to an address not above the last block's) ends the path and starts the next at `id`.
    /// Returns the number of the path it ended, or [`NONE`].
    #[inline]
    pub(crate) fn step_intra(&mut self, id: u32, tables: &Tables) -> u32 {
        let a = *self.stack.last().expect("an activation");
        let node = self.node_of(a.func, id, tables);
        let addr = self.id_addr[id as usize];
        if self.by_sums(a.func) {
            if let Some(p) = self.sums_intra(a.func, node, addr) {
                return p;
            }
        }
        let a = *self.stack.last().expect("an activation");
        if addr <= a.last_addr {
            // A back edge: the path ends here and the next starts at its head, `node`.
            let p = self.end_path(node);
            let root = match self.paths[p as usize].next_root {
                NONE => {
                    let r = self.root(a.func, START_HEAD, node);
                    self.paths[p as usize].next_root = r;
                    r
                }
                r => r,
            };
            let top = self.stack.last_mut().expect("an activation");
            top.cur = root;
            top.len = 1;
            top.last_addr = addr;
            p
        } else {
            let cur = self.trie_step(a.cur, node);
            let top = self.stack.last_mut().expect("an activation");
            top.cur = cur;
            top.len += 1;
            top.last_addr = addr;
            NONE
        }
    }

    /// Accounts a run of events in ring order (block, superblock and side-exit ids, and
    /// syscall events), every id of which `tables` knows. A superblock event waits for the
    /// next event to say how far its trace ran (see [`PathRecorder::end_of_stream`]).
    pub fn record(&mut self, events: &[u32], tables: &Tables) {
        if self.sums {
            self.record_pairs(events, tables);
        } else {
            if let Some(&max) = events.iter().filter(|&&e| is_id(e)).max() {
                if max as usize >= self.id_addr.len() {
                    self.learn_known(tables);
                }
            }
            let mut expanded = std::mem::take(&mut self.expanded);
            expanded.clear();
            self.expander.expand(tables, events, &mut expanded);
            self.record_blocks(&expanded, tables);
            self.expanded = expanded;
        }
    }

    /// The stream has ended: a superblock still waiting for its next event ran to its end.
    pub fn end_of_stream(&mut self, tables: &Tables) {
        if self.sums {
            self.flush_pending_pair(tables);
        } else {
            let mut expanded = std::mem::take(&mut self.expanded);
            expanded.clear();
            self.expander.finish(tables, &mut expanded);
            self.record_blocks(&expanded, tables);
        }
    }

    /// Steps every basic block of `blocks` (syscall events are skipped; ids with no metadata,
    /// which only a translator gone mid-run leaves, too).
    pub(crate) fn record_blocks(&mut self, blocks: &[u32], tables: &Tables) {
        for &id in blocks {
            if is_id(id) && (id as usize) < self.id_addr.len() {
                self.step(id, tables);
            }
        }
    }

    /// Steps basic block `id` through the shadow stack and the current path.
    #[inline]
    pub(crate) fn step(&mut self, id: u32, tables: &Tables) {
        let prev = std::mem::replace(&mut self.prev, id);
        if prev == NONE || self.stack.is_empty() {
            let f = self.function_containing(self.id_addr[id as usize]);
            self.push_bottom(f, id, tables);
            return;
        }
        match self.id_kind[prev as usize] {
            // A call whose next block is its own return point ran no block of its callee: the
            // runtime carried it out (the vsyscall page's entries). The caller goes on.
            K_CALL if self.id_addr[id as usize] == self.id_ret[prev as usize] => {
                self.step_intra(id, tables);
            }
            K_CALL => {
                let f = match self.id_entry[id as usize] {
                    NONE => self.called_function_at(self.id_addr[id as usize]),
                    f => f,
                };
                let parent = self.stack.last().expect("an activation").call_node;
                self.push_activation(f, self.id_ret[prev as usize], parent, id, tables);
            }
            K_RET => self.step_return(id, tables),
            kind => {
                let entry = self.id_entry[id as usize];
                let top = self.stack.last().expect("an activation");
                if entry != NONE && entry != top.func {
                    // A jump to another function's entry: a tail call.
                    self.resync(Resync::TailCall);
                    self.replace_activation(entry, id, tables);
                } else if kind == K_INDIRECT
                    && (self.id_addr[id as usize] == top.return_to
                        || (self.id_node[id as usize].0 != top.func
                            && !self.owns(top.func, self.id_addr[id as usize])))
                {
                    // Out of the function, or to its activation's return address (a jump
                    // within its function is a step of its path, whichever function the block
                    // was last seen in).
                    self.step_indirect(id, tables);
                } else {
                    self.step_intra(id, tables);
                }
            }
        }
    }

    /// Ends every activation (the guest has ended, [`PathRecorder::end_of_stream`] was
    /// called): every block executed is then on a counted path. Adds the runs of the pair
    /// programs to their paths' counts.
    pub fn finish(&mut self) {
        while !self.stack.is_empty() {
            self.pop_activation();
        }
        self.prev = NONE;
        self.settle_pairs();
        self.flush_all_sums();
    }

    /// Distinct paths recorded so far.
    pub fn path_count(&self) -> usize {
        self.paths.len()
    }
}

impl PathRecorder {
    /// The trie root of paths of `func` starting with `node` after `start_tag`.
    pub(crate) fn root(&mut self, func: u32, start_tag: u32, node: u32) -> u32 {
        if let Some(&r) = self.roots.get(&(func, start_tag, node)) {
            return r;
        }
        let r = self.new_trie_node(NONE, node, func, start_tag);
        self.roots.insert((func, start_tag, node), r);
        r
    }

    pub(crate) fn new_trie_node(
        &mut self,
        parent: u32,
        node: u32,
        func: u32,
        start_tag: u32,
    ) -> u32 {
        let t = self.trie.len() as u32;
        let before = match parent {
            NONE => 0,
            p => self.trie[p as usize].instr,
        };
        let instr = before + self.funcs[func as usize].node_instr[node as usize] as u64;
        self.trie.push(TrieNode {
            instr,
            parent,
            node,
            func,
            start_tag,
            last_child_node: NONE,
            last_child: NONE,
            last_end: NO_END,
            last_end_path: NONE,
        });
        t
    }

    /// The trie node of prefix `t` extended by `node`.
    #[inline]
    pub(crate) fn trie_step(&mut self, t: u32, node: u32) -> u32 {
        let n = &self.trie[t as usize];
        if n.last_child_node == node {
            return n.last_child;
        }
        self.trie_step_slow(t, node)
    }

    #[cold]
    pub(crate) fn trie_step_slow(&mut self, t: u32, node: u32) -> u32 {
        let c = match self.children.get(&(t, node)) {
            Some(&c) => c,
            None => {
                let (func, tag) = (self.trie[t as usize].func, self.trie[t as usize].start_tag);
                let c = self.new_trie_node(t, node, func, tag);
                self.children.insert((t, node), c);
                c
            }
        };
        let n = &mut self.trie[t as usize];
        n.last_child_node = node;
        n.last_child = c;
        c
    }

    /// The path number of prefix `t` ended by `end`, interned if new.
    #[inline]
    pub(crate) fn path_of(&mut self, t: u32, end: u32) -> u32 {
        let n = &self.trie[t as usize];
        if n.last_end == end {
            return n.last_end_path;
        }
        self.path_of_slow(t, end)
    }

    #[cold]
    pub(crate) fn path_of_slow(&mut self, t: u32, end: u32) -> u32 {
        let p = match self.ends.get(&(t, end)) {
            Some(&p) => p,
            None => {
                let mut nodes = Vec::new();
                let mut i = t;
                while i != NONE {
                    nodes.push(self.trie[i as usize].node);
                    i = self.trie[i as usize].parent;
                }
                let n = &self.trie[t as usize];
                let mut key = vec![n.func, n.start_tag];
                key.extend(nodes.iter().rev());
                key.push(end);
                let p = self.paths.len() as u32;
                if let Some(fun) = self.funcs.get_mut(n.func as usize) {
                    fun.paths.push(p);
                }
                self.paths.push(PathRec {
                    key: key.into(),
                    count: 0,
                    next_root: NONE,
                });
                self.ends.insert((t, end), p);
                p
            }
        };
        let n = &mut self.trie[t as usize];
        n.last_end = end;
        n.last_end_path = p;
        p
    }

    /// Guest instructions of the blocks on prefix `t` (0 for [`NONE`]).
    #[inline]
    pub(crate) fn path_instructions(&self, t: u32) -> u64 {
        self.trie.get(t as usize).map_or(0, |n| n.instr)
    }
}
