//! One function's Ball-Larus numbering, kept while its CFG is discovered: the numbers behind
//! the sums recorder (`sums.rs`, docs/paths-design.md "The recorder at the tables' cost").
//!
//! Source: the Ball-Larus lecture, step 1 (values in reverse topological order: a node's
//! out-edges get the number of paths from it so far, then add their destination's) and step 4
//! (regeneration: from the entry, take the out-edge with the largest value not above what is
//! left). The DAG is the one `report.rs` numbers at the end, built from the edges seen so far:
//! a virtual entry whose out-edges are the path starts `(start tag, node)`; a virtual exit
//! that every node reaches by its activation-end edge (value 0, implicit: an activation may
//! end after any block) and by one dummy edge per back-edge head its back edges go to; and the
//! forward edges between nodes. A forward edge goes to a higher guest address (the `paths`
//! module doc), so address order is a topological order and numbering needs no search.
//!
//! A path's id is then a sum: `start(tag, node)`, plus `edge(u, v)` per forward edge, plus
//! `end(u, head)` at a back edge (0 at an activation end); the prefix sum at a node names the
//! path that ends there with its activation, so a live path survives a renumbering by
//! [`Numbering::decode`] under the old numbers and a new sum under the new ones.

/// Out-edge key bit: the dummy edge to the exit of a back edge to head `key & !EXIT_EDGE`.
pub(crate) const EXIT_EDGE: u32 = 1 << 31;

/// A path as [`Numbering::decode`] spells it: its start tag, its nodes, its end (a back
/// edge's head node, or `None` at an activation end).
#[derive(Clone, Debug, PartialEq, Eq, Default)]
pub(crate) struct Spelled {
    pub(crate) start_tag: u32,
    pub(crate) nodes: Vec<u32>,
    pub(crate) end: Option<u32>,
}

/// The numbering of one function's DAG of seen edges (see the module doc). Node indices are
/// the function's CFG nodes; addresses are passed in where the order matters.
#[derive(Clone, Debug, Default)]
pub(crate) struct Numbering {
    /// Per node: its out-edges other than the activation end (a node, or [`EXIT_EDGE`] | a
    /// back-edge head) with their values, in the order seen.
    out: Vec<Vec<(u32, u64)>>,
    /// The entry's out-edges `(start tag, node)` with their values, in the order seen.
    starts: Vec<((u32, u32), u64)>,
    /// Per node: paths from it to the exit.
    paths_from: Vec<u64>,
    /// Paths from the entry: every id is below it.
    total: u64,
    /// The last numbering needed more than 2^64 ids; the values are stale.
    overflowed: bool,
    /// Nodes by decreasing guest address (a topological order, last first).
    order: Vec<u32>,
}

impl Numbering {
    /// The value of path start `(tag, node)`, if that start has been seen.
    #[inline]
    pub(crate) fn start(&self, tag: u32, node: u32) -> Option<u64> {
        self.starts
            .iter()
            .find(|&&(k, _)| k == (tag, node))
            .map(|&(_, v)| v)
    }

    /// The value of out-edge `key` of node `u` (a node, or [`EXIT_EDGE`] | head), if seen.
    #[inline]
    pub(crate) fn edge(&self, u: u32, key: u32) -> Option<u64> {
        self.out
            .get(u as usize)?
            .iter()
            .find(|&&(k, _)| k == key)
            .map(|&(_, v)| v)
    }

    /// Adds path start `(tag, node)` (not yet seen); its value is set by the next
    /// [`Numbering::renumber`].
    pub(crate) fn add_start(&mut self, tag: u32, node: u32) {
        debug_assert!(self.start(tag, node).is_none());
        self.starts.push(((tag, node), 0));
    }

    /// Adds out-edge `key` of node `u` (not yet seen); its value is set by the next
    /// [`Numbering::renumber`].
    pub(crate) fn add_edge(&mut self, u: u32, key: u32) {
        debug_assert!(self.edge(u, key).is_none());
        if self.out.len() <= u as usize {
            self.out.resize(u as usize + 1, Vec::new());
        }
        self.out[u as usize].push((key, 0));
    }

    /// Numbers the DAG again; `addr[n]` is node `n`'s guest address (every node with an edge
    /// must have one). Returns false if the paths from the entry do not fit in a `u64` (the
    /// values are then meaningless and the function must be counted another way).
    pub(crate) fn renumber(&mut self, addr: &[u64]) -> bool {
        let n = self.out.len().max(addr.len());
        self.out.resize(n, Vec::new());
        self.paths_from.clear();
        self.paths_from.resize(n, 1);
        self.order_new_nodes(addr);
        self.overflowed = false;
        for k in 0..self.order.len() {
            let v = self.order[k];
            // The activation end is the first edge, value 0.
            let mut acc: u64 = 1;
            for e in 0..self.out[v as usize].len() {
                let (key, _) = self.out[v as usize][e];
                let paths = if key & EXIT_EDGE != 0 {
                    1
                } else {
                    debug_assert!(addr[key as usize] > addr[v as usize], "a forward edge");
                    self.paths_from[key as usize]
                };
                self.out[v as usize][e].1 = acc;
                match acc.checked_add(paths) {
                    Some(a) => acc = a,
                    None => self.overflowed = true,
                }
            }
            self.paths_from[v as usize] = acc;
        }
        let mut acc: u64 = 0;
        for s in &mut self.starts {
            s.1 = acc;
            match acc.checked_add(self.paths_from[s.0 .1 as usize]) {
                Some(a) => acc = a,
                None => self.overflowed = true,
            }
        }
        self.total = acc;
        !self.overflowed
    }

    /// The path whose id is `id`, or `None` if no path has it (an id at or above the paths
    /// from the entry).
    #[cfg(test)]
    pub(crate) fn decode(&self, id: u64) -> Option<Spelled> {
        let mut out = Spelled::default();
        self.decode_into(id, &mut out).then_some(out)
    }

    /// [`Numbering::decode`] into `out`; false if no path has the id.
    pub(crate) fn decode_into(&self, id: u64, out: &mut Spelled) -> bool {
        out.nodes.clear();
        out.end = None;
        let Some(&((tag, first), v0)) = self
            .starts
            .iter()
            .find(|&&((_, n), v)| v <= id && id - v < self.paths_from[n as usize])
        else {
            return false;
        };
        out.start_tag = tag;
        let (mut v, mut rem) = (first, id - v0);
        loop {
            out.nodes.push(v);
            if rem == 0 {
                return true;
            }
            // Values grow along the list: the last edge not above what is left.
            let Some(&(key, val)) = self.out[v as usize].iter().rev().find(|&&(_, x)| x <= rem)
            else {
                return false;
            };
            rem -= val;
            if key & EXIT_EDGE != 0 {
                out.end = Some(key & !EXIT_EDGE);
                return rem == 0;
            }
            v = key;
        }
    }

    /// Puts the nodes added since the last numbering (`self.order.len()..addr.len()`) into
    /// `order`. Nodes are only ever added and addresses never change, so the order stays
    /// sorted: a few new nodes (a function growing an edge at a time, the common case) are
    /// each inserted where they belong, O(nodes) apiece; many are appended and merged by the
    /// stable sort, which finds the two sorted runs.
    fn order_new_nodes(&mut self, addr: &[u64]) {
        const INSERT_MAX: usize = 8;
        let (old, n) = (self.order.len(), addr.len());
        if n - old <= INSERT_MAX {
            for v in old as u32..n as u32 {
                let a = addr[v as usize];
                let at = self.order.partition_point(|&u| addr[u as usize] > a);
                self.order.insert(at, v);
            }
        } else {
            self.order.extend(old as u32..n as u32);
            self.order
                .sort_by_key(|&v| std::cmp::Reverse(addr[v as usize]));
        }
        debug_assert!(self
            .order
            .windows(2)
            .all(|w| addr[w[0] as usize] >= addr[w[1] as usize]));
    }

    /// The id of a spelled path under the current numbers, or `None` if one of its edges has
    /// not been seen.
    pub(crate) fn encode(&self, path: &Spelled) -> Option<u64> {
        let (&first, rest) = path.nodes.split_first()?;
        let mut r = self.start(path.start_tag, first)?;
        let mut u = first;
        for &v in rest {
            r += self.edge(u, v)?;
            u = v;
        }
        if let Some(h) = path.end {
            r += self.edge(u, EXIT_EDGE | h)?;
        }
        Some(r)
    }

    /// Paths from the entry under the current numbers.
    pub(crate) fn total(&self) -> u64 {
        self.total
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    /// Every path of the DAG, spelled, by brute force (depth-first from each start).
    fn all_paths(n: &Numbering) -> Vec<Spelled> {
        fn walk(n: &Numbering, tag: u32, nodes: &mut Vec<u32>, out: &mut Vec<Spelled>) {
            let v = *nodes.last().expect("a node");
            out.push(Spelled {
                start_tag: tag,
                nodes: nodes.clone(),
                end: None,
            });
            for &(key, _) in n.out.get(v as usize).map_or(&[][..], |o| &o[..]) {
                if key & EXIT_EDGE != 0 {
                    out.push(Spelled {
                        start_tag: tag,
                        nodes: nodes.clone(),
                        end: Some(key & !EXIT_EDGE),
                    });
                } else {
                    nodes.push(key);
                    walk(n, tag, nodes, out);
                    nodes.pop();
                }
            }
        }
        let mut out = Vec::new();
        for &((tag, node), _) in &n.starts {
            walk(n, tag, &mut vec![node], &mut out);
        }
        out
    }

    proptest! {
        /// Grown one edge at a time in any order and renumbered after each, the numbering
        /// gives every path of the DAG a distinct id below the total, the ids are exactly
        /// `0..total`, and decoding each id spells its path.
        #[test]
        fn ids_are_a_bijection_as_the_dag_grows(
            nodes in 1usize..9,
            edges in proptest::collection::vec((0u32..9, 0u32..9, 0u32..3), 0..24),
        ) {
            // Node i's address is 16 * i: forward edges go from lower to higher indices.
            let addr: Vec<u64> = (0..nodes as u64).map(|i| 16 * i).collect();
            let mut n = Numbering::default();
            n.add_start(0, 0);
            prop_assert!(n.renumber(&addr));
            for (a, b, kind) in edges {
                let (a, b) = (a % nodes as u32, b % nodes as u32);
                match kind {
                    // A path start at a back-edge head.
                    0 if n.start(1, b).is_none() => n.add_start(1, b),
                    // The dummy exit edge of a back edge a -> b (b not above a).
                    1 if b <= a && n.edge(a, EXIT_EDGE | b).is_none() => {
                        n.add_edge(a, EXIT_EDGE | b)
                    }
                    2 if a < b && n.edge(a, b).is_none() => n.add_edge(a, b),
                    _ => continue,
                }
                prop_assert!(n.renumber(&addr));
                let paths = all_paths(&n);
                prop_assert_eq!(paths.len() as u64, n.total());
                let mut ids: Vec<u64> = paths
                    .iter()
                    .map(|p| n.encode(p).expect("every edge seen"))
                    .collect();
                for (p, &id) in paths.iter().zip(&ids) {
                    prop_assert_eq!(n.decode(id), Some(p.clone()));
                }
                ids.sort_unstable();
                prop_assert_eq!(ids, (0..n.total()).collect::<Vec<_>>());
                prop_assert_eq!(n.decode(n.total()), None);
            }
        }
    }

    proptest! {
        /// Nodes discovered a few at a time at addresses in any order (as a function's
        /// blocks are): the numbering kept across renumberings gives every edge and start the value
        /// a numbering made at once from the same DAG gives it.
        #[test]
        fn growing_nodes_number_as_a_fresh_numbering(
            addrs in proptest::sample::subsequence((0u64..64).collect::<Vec<_>>(), 1..20)
                .prop_shuffle(),
            edges in proptest::collection::vec((0u32..20, 0u32..20, 0usize..12), 1..40),
        ) {
            let addr: Vec<u64> = addrs.iter().map(|a| 16 * a).collect();
            let mut n = Numbering::default();
            n.add_start(0, 0);
            let mut known = 1;
            prop_assert!(n.renumber(&addr[..known]));
            // Sometimes one node at a time, sometimes more than are inserted one by one.
            for (a, b, grow) in edges {
                known = (known + grow).min(addr.len());
                let (a, b) = (a % known as u32, b % known as u32);
                let (ua, ub) = (addr[a as usize], addr[b as usize]);
                if ua < ub && n.edge(a, b).is_none() {
                    n.add_edge(a, b);
                } else if ub <= ua && n.edge(a, EXIT_EDGE | b).is_none() {
                    n.add_edge(a, EXIT_EDGE | b);
                    if n.start(1, b).is_none() {
                        n.add_start(1, b);
                    }
                }
                prop_assert!(n.renumber(&addr[..known]));
                let mut fresh = Numbering {
                    out: n.out.clone(),
                    starts: n.starts.clone(),
                    ..Numbering::default()
                };
                prop_assert!(fresh.renumber(&addr[..known]));
                prop_assert_eq!(&fresh.out, &n.out);
                prop_assert_eq!(&fresh.starts, &n.starts);
                prop_assert_eq!(fresh.total(), n.total());
            }
        }
    }

    /// A chain of 64 diamonds has 2^64 paths from its entry, more than an id holds: the
    /// numbering says so instead of wrapping.
    #[test]
    fn more_paths_than_a_u64_is_refused() {
        let mut n = Numbering::default();
        n.add_start(0, 0);
        // Diamond i: 3i -> 3i+1 -> 3i+3, 3i -> 3i+2 -> 3i+3.
        let diamonds = 64u32;
        for i in 0..diamonds {
            let b = 3 * i;
            n.add_edge(b, b + 1);
            n.add_edge(b, b + 2);
            n.add_edge(b + 1, b + 3);
            n.add_edge(b + 2, b + 3);
        }
        let addr: Vec<u64> = (0..=3 * diamonds as u64).collect();
        assert!(!n.renumber(&addr));
        let mut small = Numbering::default();
        small.add_start(0, 0);
        small.add_edge(0, 1);
        assert!(small.renumber(&[0, 1]));
        assert_eq!(small.total(), 2, "[0] and [0, 1]");
    }
}
