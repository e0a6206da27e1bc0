//! The streaming k-slab forest (k-SF): the k-BLPP profiler's per-item data structure.
//!
//! Source: D'Elia, Demetrescu, Finocchi, "Ball-Larus path profiling across
//! multiple loop iterations" (2013), §2.2 (stream, Definition 3) and §2.3
//! (`process_bl_path_id`, Fig. 6); the k-SF comes from Ausiello et al.'s
//! k-calling-context profiling. §3.3 gives the node layout used here: first
//! child / next sibling links.
//!
//! **Input.** A stream of Ball-Larus path ids (emitted at back edges and at
//! the exit, see [`BlTracer`](crate::BlTracer)) and *routine-entry markers*.
//!
//! **Shape.** Split the stream at markers, and cut each piece into slabs
//! `S1, S2, ...` of `k` consecutive ids (the last may be shorter). The k-SF
//! is the prefix forest of every prefix of every slab (the *upper part*,
//! depths `0..k`) and, under the node that spells a full slab `S(i-1)`, the
//! prefixes of the next slab `Si` (the *lower part*, depths `k..2k`). Each
//! node counts how many times its root-to-node sequence occurred in that
//! position. Any run of at most `k` consecutive ids starts inside some slab
//! and ends in that slab or the next, so it is spelled by a downward path
//! that starts in the upper part; [`KSlabForest::to_ipf`] collects exactly
//! those.
//!
//! **Cost per item.** One hash-table access every `k` items (new slab: find
//! the root), and one or two child lookups otherwise. A child lookup scans
//! the parent's sibling list, and found children move to the front, so hot
//! children are found first (the paper's §4.2 suggestion for high-degree
//! nodes). A node with more than [`SCAN_LIMIT`] children is also indexed in
//! a hash table keyed by (parent, label), so a stream with many distinct
//! successors costs one hash access per lookup instead of a long scan.
//! Memory: one 32-byte node per distinct (position, prefix), plus a table
//! entry per child of a high-degree node.

use crate::error::{Error, Result};
use crate::hash::FastMap;
use crate::ids::{PathId, NONE};
use crate::kipf::KIterationForest;

/// One item of the k-BLPP input stream.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum StreamItem {
    /// A routine entry (the paper's marker `*`): runs never span it.
    RoutineEntry,
    /// A finished Ball-Larus path.
    Path(PathId),
}

/// Children a node may have before its children are also indexed by hash:
/// below this a sibling scan (with move-to-front) beats a hash access.
pub const SCAN_LIMIT: u32 = 12;

/// A k-SF node: label, count, first child, next sibling, number of children.
#[derive(Debug, Clone, Copy)]
pub(crate) struct SlabNode {
    pub label: PathId,
    pub count: u64,
    pub first_child: u32,
    pub next_sibling: u32,
    pub degree: u32,
}

/// The k-slab forest, built one stream item at a time.
#[derive(Debug, Clone)]
pub struct KSlabForest {
    k: usize,
    pub(crate) nodes: Vec<SlabNode>,
    pub(crate) roots: FastMap<PathId, u32>,
    /// Children of nodes with more than `SCAN_LIMIT` children, by (parent, label).
    wide: FastMap<(u32, PathId), u32>,
    /// Ids since the last marker, modulo `k`.
    pos: usize,
    /// Current node in the upper part (the slab being built), or NONE.
    top: u32,
    /// Current node in the lower part (under the previous full slab), or NONE.
    bottom: u32,
    items: u64,
}

impl KSlabForest {
    /// An empty forest for runs of up to `k` Ball-Larus paths.
    ///
    /// # Errors
    ///
    /// [`Error::InvalidK`] if `k` is 0.
    pub fn new(k: usize) -> Result<KSlabForest> {
        if k == 0 {
            return Err(Error::InvalidK { k });
        }
        Ok(KSlabForest {
            k,
            nodes: Vec::new(),
            roots: FastMap::default(),
            wide: FastMap::default(),
            pos: 0,
            top: NONE,
            bottom: NONE,
            items: 0,
        })
    }

    /// The `k` this forest was built for.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of k-SF nodes.
    pub fn node_count(&self) -> usize {
        self.nodes.len()
    }

    /// Number of path ids processed (markers not counted).
    pub fn items(&self) -> u64 {
        self.items
    }

    /// Processes one stream item.
    ///
    /// # Panics
    ///
    /// If the forest would exceed `u32::MAX - 1` nodes.
    #[inline]
    pub fn process(&mut self, item: StreamItem) {
        match item {
            StreamItem::RoutineEntry => self.routine_entry(),
            StreamItem::Path(id) => self.push(id),
        }
    }

    /// A routine-entry marker: the next id starts a fresh run.
    #[inline]
    pub fn routine_entry(&mut self) {
        self.pos = 0;
        self.top = NONE;
        self.bottom = NONE;
    }

    /// One Ball-Larus path id (the paper's `process_bl_path_id`).
    ///
    /// # Panics
    ///
    /// If the forest would exceed `u32::MAX - 1` nodes.
    #[inline]
    pub fn push(&mut self, id: PathId) {
        if self.pos == 0 {
            // A new slab: the previous one (if any, and full) becomes the
            // parent of the lower-part copy; the slab's root is hashed.
            self.bottom = self.top;
            self.top = match self.roots.get(&id) {
                Some(&r) => r,
                None => {
                    let r = self.new_node(id);
                    self.roots.insert(id, r);
                    r
                }
            };
        } else {
            self.top = self.child(self.top, id);
        }
        if self.bottom != NONE {
            self.bottom = self.child(self.bottom, id);
            self.nodes[self.bottom as usize].count += 1;
        }
        self.nodes[self.top as usize].count += 1;
        self.pos += 1;
        if self.pos == self.k {
            self.pos = 0;
        }
        self.items += 1;
    }

    /// Processes every item of `items`, in order.
    pub fn extend<I: IntoIterator<Item = StreamItem>>(&mut self, items: I) {
        for it in items {
            self.process(it);
        }
    }

    /// The k-iterations path forest of everything processed so far.
    pub fn to_ipf(&self) -> KIterationForest {
        KIterationForest::from_slab_forest(self)
    }

    /// The child of `parent` labelled `id`, created with count 0 if missing.
    /// Small nodes: scan, moving the found child to the front. Wide nodes:
    /// hash lookup.
    #[inline]
    fn child(&mut self, parent: u32, id: PathId) -> u32 {
        let p = self.nodes[parent as usize];
        if p.degree > SCAN_LIMIT {
            if let Some(&c) = self.wide.get(&(parent, id)) {
                return c;
            }
            let n = self.link_child(parent, id);
            self.wide.insert((parent, id), n);
            return n;
        }
        let head = p.first_child;
        let mut prev = NONE;
        let mut c = head;
        while c != NONE {
            let node = self.nodes[c as usize];
            if node.label == id {
                if prev != NONE {
                    self.nodes[prev as usize].next_sibling = node.next_sibling;
                    self.nodes[c as usize].next_sibling = head;
                    self.nodes[parent as usize].first_child = c;
                }
                return c;
            }
            prev = c;
            c = node.next_sibling;
        }
        let n = self.link_child(parent, id);
        if self.nodes[parent as usize].degree > SCAN_LIMIT {
            // The node just became wide: index all its children.
            let kids: Vec<u32> = self.children(parent).collect();
            for kid in kids {
                self.wide
                    .insert((parent, self.nodes[kid as usize].label), kid);
            }
        }
        n
    }

    /// A new child of `parent`, at the front of its list.
    fn link_child(&mut self, parent: u32, id: PathId) -> u32 {
        let n = self.new_node(id);
        let p = &mut self.nodes[parent as usize];
        let head = p.first_child;
        p.first_child = n;
        p.degree += 1;
        self.nodes[n as usize].next_sibling = head;
        n
    }

    fn new_node(&mut self, label: PathId) -> u32 {
        let id = u32::try_from(self.nodes.len())
            .ok()
            .filter(|&n| n < NONE)
            .expect("k-slab forest node ids exhausted (u32)");
        self.nodes.push(SlabNode {
            label,
            count: 0,
            first_child: NONE,
            next_sibling: NONE,
            degree: 0,
        });
        id
    }

    /// Children of `n`, front to back.
    pub(crate) fn children(&self, n: u32) -> impl Iterator<Item = u32> + '_ {
        let mut c = self.nodes[n as usize].first_child;
        std::iter::from_fn(move || {
            if c == NONE {
                return None;
            }
            let cur = c;
            c = self.nodes[c as usize].next_sibling;
            Some(cur)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ids(xs: &[u64]) -> Vec<StreamItem> {
        xs.iter()
            .map(|&x| {
                if x == u64::MAX {
                    StreamItem::RoutineEntry
                } else {
                    StreamItem::Path(PathId(x))
                }
            })
            .collect()
    }

    #[test]
    fn k_zero_is_rejected() {
        assert_eq!(KSlabForest::new(0).unwrap_err(), Error::InvalidK { k: 0 });
    }

    #[test]
    fn slabs_and_their_successors() {
        // k = 2, stream 1 2 3 4 5: slabs [1 2] [3 4] [5].
        let mut f = KSlabForest::new(2).unwrap();
        f.extend(ids(&[1, 2, 3, 4, 5]));
        // Upper: 1, 1-2, 3, 3-4, 5 (5 nodes); lower: under 1-2: 3, 3-4; under 3-4: 5.
        assert_eq!(f.node_count(), 8);
        assert_eq!(f.roots.len(), 3);
        let r1 = f.roots[&PathId(1)];
        let two: Vec<_> = f.children(r1).collect();
        assert_eq!(two.len(), 1);
        let lower: Vec<_> = f
            .children(two[0])
            .map(|c| f.nodes[c as usize].label)
            .collect();
        assert_eq!(lower, vec![PathId(3)]);
    }

    #[test]
    fn markers_cut_runs() {
        let mut f = KSlabForest::new(3).unwrap();
        f.extend(ids(&[7, 8, 9, u64::MAX, 7, 8]));
        // Upper part only: 7, 7-8, 7-8-9 (count 1 for the last); no lower part.
        assert_eq!(f.node_count(), 3);
        let r = f.roots[&PathId(7)];
        assert_eq!(f.nodes[r as usize].count, 2);
    }
}

#[cfg(test)]
mod wide_tests {
    use super::*;

    #[test]
    fn wide_nodes_find_their_children_through_the_index() {
        // k = 2, root 0 followed by 100 different ids, each twice.
        let mut f = KSlabForest::new(2).unwrap();
        for _ in 0..2 {
            for x in 1..=100u64 {
                f.routine_entry();
                f.push(PathId(0));
                f.push(PathId(x));
            }
        }
        let r = f.roots[&PathId(0)];
        assert_eq!(f.nodes[r as usize].degree, 100);
        assert_eq!(f.children(r).count(), 100);
        assert!(f.children(r).all(|c| f.nodes[c as usize].count == 2));
        assert_eq!(f.node_count(), 101);
    }
}
