//! The k-iterations path forest (k-IPF): every run of up to k consecutive Ball-Larus paths, with its count.
//!
//! Source: D'Elia, Demetrescu, Finocchi 2013, §2.2 (Definitions 1–2, the
//! prefix forest of all `j`-grams, `j <= k`, of the stream that contain no
//! routine-entry marker) and §2.3 (`make_k_ipf`, `join_subtree`, Fig. 7: the
//! conversion from the k-slab forest).
//!
//! **Shape.** A prefix forest: each node is labelled with a [`PathId`], and
//! the labels on the way from a root to a node spell a sequence of at most
//! `k` paths; the node's count is how many times that sequence occurred as
//! consecutive ids within one routine invocation. Roots hold plain
//! Ball-Larus path counts; a parent's count is at least the sum of its
//! children's (§2.2, Property 1). Children are sorted by label.
//!
//! **Conversion.** For every k-SF node in the upper part (depth `< k`), the
//! k-SF subtree below it, cut at `k` levels, is joined into the k-IPF under
//! the root for its label, adding counts. A lower-part node is never the
//! start of a join: the runs it starts are already spelled from the
//! upper-part node of the same slab position, and joining both would count
//! them twice. Cost: O(k · k-SF nodes) time, O(k-IPF nodes) memory.

use crate::hash::FastMap;
use crate::ids::{PathId, NONE};
use crate::kslab::KSlabForest;

/// A node of a [`KIterationForest`].
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct IpfNode(pub u32);

/// The k-iterations path forest.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KIterationForest {
    k: usize,
    labels: Vec<PathId>,
    counts: Vec<u64>,
    /// Children of node `i` are the nodes `child_start[i]..child_start[i + 1]`.
    child_start: Vec<u32>,
    roots: u32,
}

impl KIterationForest {
    pub(crate) fn from_slab_forest(sf: &KSlabForest) -> KIterationForest {
        let k = sf.k();
        // Build with a (parent, label) -> node map; parent NONE = root level.
        let mut index: FastMap<(u32, PathId), u32> = FastMap::default();
        let mut label = Vec::new();
        let mut count: Vec<u64> = Vec::new();
        let mut parent = Vec::new();
        let mut upper: Vec<(u32, usize)> = sf.roots.values().map(|&r| (r, 0)).collect();
        let mut join: Vec<(u32, u32, usize)> = Vec::new();
        while let Some((v, depth)) = upper.pop() {
            if depth + 1 < k {
                upper.extend(sf.children(v).map(|c| (c, depth + 1)));
            }
            // join_subtree(v, dummy root, k)
            join.push((v, NONE, 1));
            while let Some((s, p, level)) = join.pop() {
                let node = sf.nodes[s as usize];
                let key = (p, node.label);
                let t = *index.entry(key).or_insert_with(|| {
                    label.push(node.label);
                    count.push(0);
                    parent.push(p);
                    (label.len() - 1) as u32
                });
                count[t as usize] += node.count;
                if level < k {
                    join.extend(sf.children(s).map(|c| (c, t, level + 1)));
                }
            }
        }

        // Renumber breadth-first with children sorted by label, so every
        // node's children are a contiguous id range.
        let n = label.len();
        let mut kids: Vec<Vec<u32>> = vec![Vec::new(); n];
        let mut roots = Vec::new();
        for (i, &p) in parent.iter().enumerate() {
            if p == NONE {
                roots.push(i as u32);
            } else {
                kids[p as usize].push(i as u32);
            }
        }
        let by_label = |v: &mut Vec<u32>| v.sort_by_key(|&i| label[i as usize]);
        by_label(&mut roots);
        let mut order: Vec<u32> = roots.clone();
        let mut child_start = Vec::with_capacity(n + 1);
        let mut i = 0;
        while i < order.len() {
            let v = order[i] as usize;
            child_start.push(order.len() as u32);
            let mut c = std::mem::take(&mut kids[v]);
            by_label(&mut c);
            order.extend(c);
            i += 1;
        }
        child_start.push(order.len() as u32);
        KIterationForest {
            k,
            labels: order.iter().map(|&o| label[o as usize]).collect(),
            counts: order.iter().map(|&o| count[o as usize]).collect(),
            child_start,
            roots: roots.len() as u32,
        }
    }

    /// The `k` of the forest: the longest sequences it holds.
    pub fn k(&self) -> usize {
        self.k
    }

    /// Number of nodes: distinct sequences of 1..=k paths that occurred.
    pub fn len(&self) -> usize {
        self.labels.len()
    }

    /// Whether no path was seen.
    pub fn is_empty(&self) -> bool {
        self.labels.is_empty()
    }

    /// The roots (one per distinct path id), by label.
    pub fn roots(&self) -> impl DoubleEndedIterator<Item = IpfNode> + ExactSizeIterator {
        (0..self.roots).map(IpfNode)
    }

    /// The children of `n`, by label.
    ///
    /// # Panics
    ///
    /// If `n` is not a node of this forest.
    pub fn children(
        &self,
        n: IpfNode,
    ) -> impl DoubleEndedIterator<Item = IpfNode> + ExactSizeIterator {
        (self.child_start[n.0 as usize]..self.child_start[n.0 as usize + 1]).map(IpfNode)
    }

    /// The path id labelling `n`.
    ///
    /// # Panics
    ///
    /// If `n` is not a node of this forest.
    pub fn label(&self, n: IpfNode) -> PathId {
        self.labels[n.0 as usize]
    }

    /// How many times the sequence ending at `n` occurred.
    ///
    /// # Panics
    ///
    /// If `n` is not a node of this forest.
    pub fn count_of(&self, n: IpfNode) -> u64 {
        self.counts[n.0 as usize]
    }

    /// The node spelling `seq`, if that sequence occurred. O(|seq| · log degree).
    pub fn find(&self, seq: &[PathId]) -> Option<IpfNode> {
        let (mut lo, mut hi) = (0u32, self.roots);
        let mut found = None;
        for &id in seq {
            let slice = &self.labels[lo as usize..hi as usize];
            let j = slice.binary_search(&id).ok()? as u32;
            let n = lo + j;
            found = Some(IpfNode(n));
            lo = self.child_start[n as usize];
            hi = self.child_start[n as usize + 1];
        }
        found
    }

    /// How many times `seq` occurred as consecutive paths of one invocation
    /// (0 if never, if empty, or if longer than `k`).
    pub fn count(&self, seq: &[PathId]) -> u64 {
        self.find(seq).map_or(0, |n| self.count_of(n))
    }

    /// Every sequence held, with its count, in depth-first label order.
    pub fn sequences(&self) -> Vec<(Vec<PathId>, u64)> {
        let mut out = Vec::with_capacity(self.len());
        let mut prefix = Vec::new();
        let mut stack: Vec<(IpfNode, usize)> = self.roots().rev().map(|r| (r, 0)).collect();
        while let Some((n, depth)) = stack.pop() {
            prefix.truncate(depth);
            prefix.push(self.label(n));
            out.push((prefix.clone(), self.count_of(n)));
            stack.extend(self.children(n).rev().map(|c| (c, depth + 1)));
        }
        out
    }

    /// The `top` most frequent sequences of exactly `len` paths, most
    /// frequent first (ties by sequence).
    pub fn hottest(&self, len: usize, top: usize) -> Vec<(Vec<PathId>, u64)> {
        let mut all: Vec<_> = self
            .sequences()
            .into_iter()
            .filter(|(s, _)| s.len() == len)
            .collect();
        all.sort_by(|a, b| b.1.cmp(&a.1).then_with(|| a.0.cmp(&b.0)));
        all.truncate(top);
        all
    }
}

#[cfg(test)]
mod tests {
    use crate::ids::PathId;
    use crate::kslab::{KSlabForest, StreamItem};

    #[test]
    fn counts_every_run_up_to_k() {
        let mut f = KSlabForest::new(2).unwrap();
        for x in [1u64, 2, 1, 2, 1] {
            f.push(PathId(x));
        }
        let ipf = f.to_ipf();
        let p = |xs: &[u64]| xs.iter().map(|&x| PathId(x)).collect::<Vec<_>>();
        assert_eq!(ipf.count(&p(&[1])), 3);
        assert_eq!(ipf.count(&p(&[2])), 2);
        assert_eq!(ipf.count(&p(&[1, 2])), 2);
        assert_eq!(ipf.count(&p(&[2, 1])), 2);
        assert_eq!(ipf.count(&p(&[1, 2, 1])), 0);
        assert_eq!(ipf.len(), 4);
    }

    #[test]
    fn markers_separate_invocations() {
        let mut f = KSlabForest::new(3).unwrap();
        f.extend([
            StreamItem::Path(PathId(5)),
            StreamItem::RoutineEntry,
            StreamItem::Path(PathId(6)),
        ]);
        let ipf = f.to_ipf();
        assert_eq!(ipf.count(&[PathId(5), PathId(6)]), 0);
        assert_eq!(ipf.count(&[PathId(6)]), 1);
        assert_eq!(ipf.roots().len(), 2);
    }
}
