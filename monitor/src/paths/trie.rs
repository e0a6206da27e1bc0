//! The path trie: every activation's current path is a node of a prefix tree of the paths seen
//! so far; a path end interns the prefix and its end as a dense path number.

use super::ids::NONE;
use super::recorder::PathRecorder;

/// Path-key tag: the path starts at the function's entry.
pub(crate) const START_ENTRY: u32 = 0;
/// Path-key tag: the path starts just after a back edge (or mid-function after a resync).
pub(crate) const START_HEAD: u32 = 1;
/// Path-key end tag: the path ends with its activation (return, tail call, unwinding, exit).
pub(crate) const END_EXIT: u32 = u32::MAX;

/// One interned path.
#[derive(Clone, Debug)]
pub(crate) struct PathRec {
    /// `[function, start tag, nodes..., end tag]` (end tag: [`END_EXIT`] or the back edge's
    /// head node).
    pub key: Box<[u32]>,
    /// Times it ran.
    pub count: u64,
    /// For a path ending at a back edge: the trie root of the path that starts at its head,
    /// once known (else [`NONE`]).
    pub(crate) next_root: u32,
}

/// `TrieNode::last_end` before any path ended there (not a node, not [`END_EXIT`]).
pub(crate) const NO_END: u32 = u32::MAX - 1;

/// A node of the path trie: a path prefix `[function, start tag, nodes...]`.
#[derive(Clone, Copy, Debug)]
pub(crate) struct TrieNode {
    /// The prefix without its last node, or [`NONE`] for a root (a one-node prefix).
    pub(crate) parent: u32,
    /// Its last node (a function CFG node).
    pub(crate) node: u32,
    pub(crate) func: u32,
    pub(crate) start_tag: u32,
    /// The child taken last: its node and trie index.
    pub(crate) last_child_node: u32,
    pub(crate) last_child: u32,
    /// The path that ended here last: its end tag (or [`NO_END`]) and path number.
    pub(crate) last_end: u32,
    pub(crate) last_end_path: u32,
    /// Guest instructions of the prefix's blocks (what a path ending here executed).
    pub(crate) instr: u64,
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
