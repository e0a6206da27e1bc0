//! A list that takes one item at a time and answers ordered queries: a few sorted runs,
//! merged as a binary counter carries, and a short unsorted tail (the linked exits a kick
//! looks up by target, the guest spans an invalidation looks up by address).

/// Most items left unsorted after the runs: what a query scans one by one.
const UNSORTED_MAX: usize = 2048;

/// Most sorted runs kept: run lengths at least halve from one run to the next (see
/// [`SortedRuns::push`]), so 24 runs hold more than 2^34 items.
pub const RUNS_MAX: usize = 24;

/// Items in a few sorted runs followed by at most 2048 in push order. The unsorted items
/// become a run of their own when there are more, and the last two runs are merged while
/// the earlier one is at most twice as long, as a binary counter carries: each item is moved
/// O(log n) times in all, and a query binary-searches O(log n) runs. (One sorted list merged
/// with every 2048 new items moved the whole list each time: the linked exits took 7 ms of a
/// warm `python3 -c pass`, 60,000 links; a `BTreeMap` of the block spans, one search per
/// block, took 7 % of it.) Equal items are merged within the last run.
#[derive(Clone, Debug, Default)]
pub struct SortedRuns<T> {
    items: Vec<T>,
    /// `starts[i]`: where run `i` starts; run `i` ends where run `i + 1` starts, the last
    /// one at `sorted`.
    starts: Vec<usize>,
    sorted: usize,
    /// Where a merge copies the earlier of its two runs: kept, so that merges allocate (and
    /// fault in) no memory once it has grown.
    scratch: Vec<T>,
}

/// A [`SortedRuns`] as a reader sees it: its items, where each sorted run starts, and where
/// the unsorted tail starts. Made by [`SortedRuns::view`], or from those three parts where
/// they were published to another thread (see `signals`).
#[derive(Debug)]
pub struct RunsView<'a, T> {
    pub items: &'a [T],
    pub starts: &'a [usize],
    pub sorted: usize,
}

// A view is references and a length: a copy whatever `T` is (derived, it would need `T: Copy`).
impl<T> Clone for RunsView<'_, T> {
    fn clone(&self) -> Self {
        *self
    }
}
impl<T> Copy for RunsView<'_, T> {}

impl<T: Ord + Copy> SortedRuns<T> {
    /// Adds `item`.
    pub fn push(&mut self, item: T) {
        self.items.push(item);
        if self.items.len() - self.sorted <= UNSORTED_MAX {
            return;
        }
        self.starts.push(self.sorted);
        self.items[self.sorted..].sort_unstable();
        while let [.., a, b] = self.starts[..] {
            let (earlier, later) = (b - a, self.items.len() - b);
            if earlier > 2 * later && self.starts.len() < RUNS_MAX {
                break;
            }
            merge(&mut self.items[a..], b - a, &mut self.scratch);
            self.starts.pop();
        }
        let last = *self.starts.last().expect("a run");
        let mut kept = last;
        for i in last..self.items.len() {
            if i == last || self.items[i] != self.items[kept - 1] {
                self.items[kept] = self.items[i];
                kept += 1;
            }
        }
        self.items.truncate(kept);
        self.sorted = kept;
    }

    /// Forgets every item (keeping the memory).
    pub fn clear(&mut self) {
        self.items.clear();
        self.starts.clear();
        self.sorted = 0;
    }

    /// What a reader needs.
    pub fn view(&self) -> RunsView<'_, T> {
        RunsView {
            items: &self.items,
            starts: &self.starts,
            sorted: self.sorted,
        }
    }
}

/// Merges the sorted runs `items[..mid]` and `items[mid..]` in place, through `scratch` (a
/// copy of the first run), in linear time; of equal items, the first run's come first.
fn merge<T: Ord + Copy>(items: &mut [T], mid: usize, scratch: &mut Vec<T>) {
    scratch.clear();
    scratch.extend_from_slice(&items[..mid]);
    let (mut i, mut j, mut out) = (0, mid, 0);
    while i < scratch.len() && j < items.len() {
        if items[j] < scratch[i] {
            items[out] = items[j];
            j += 1;
        } else {
            items[out] = scratch[i];
            i += 1;
        }
        out += 1;
    }
    // What is left of the second run is in place already.
    let rest = scratch.len() - i;
    items[out..out + rest].copy_from_slice(&scratch[i..]);
}

impl<'a, T> RunsView<'a, T> {
    /// The sorted runs.
    pub fn runs(self) -> impl Iterator<Item = &'a [T]> {
        let sorted = self.sorted.min(self.items.len());
        (0..self.starts.len()).map(move |i| {
            let end = self
                .starts
                .get(i + 1)
                .copied()
                .unwrap_or(sorted)
                .min(sorted);
            &self.items[self.starts[i].min(end)..end]
        })
    }

    /// The items after the runs, in push order.
    pub fn tail(self) -> &'a [T] {
        &self.items[self.sorted.min(self.items.len())..]
    }

    /// Every item in `[lo, hi)` (by `key`, which must order the items as they are sorted),
    /// in no particular order.
    pub fn range<K: Ord + Copy + 'a>(
        self,
        key: impl Fn(&T) -> K + Copy + 'a,
        lo: K,
        hi: K,
    ) -> impl Iterator<Item = &'a T> + 'a {
        let in_runs = self.runs().flat_map(move |run| {
            let from = run.partition_point(|x| key(x) < lo);
            run[from..].iter().take_while(move |x| key(x) < hi)
        });
        let tail = self
            .tail()
            .iter()
            .filter(move |x| (lo..hi).contains(&key(x)));
        in_runs.chain(tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The runs stay few and sorted, and a range query finds what a scan of every item
    /// pushed finds.
    /// A merge of two sorted runs equals a sort of both, whatever their lengths.
    #[test]
    fn a_merge_sorts_two_runs() {
        let mut scratch = Vec::new();
        let mut x: u64 = 7;
        for (n, m) in [(0, 0), (0, 5), (5, 0), (1, 1), (3, 17), (17, 3), (200, 150)] {
            let mut next = || {
                x = x.wrapping_mul(6364136223846793005).wrapping_add(1);
                (x >> 40) % 50
            };
            let mut a: Vec<u64> = (0..n).map(|_| next()).collect();
            let mut b: Vec<u64> = (0..m).map(|_| next()).collect();
            a.sort();
            b.sort();
            let mut items = [a, b].concat();
            let mut expected = items.clone();
            expected.sort();
            merge(&mut items, n, &mut scratch);
            assert_eq!(items, expected, "runs of {n} and {m}");
        }
    }

    #[test]
    fn runs_stay_few_and_ranges_are_exact() {
        let mut r = SortedRuns::default();
        let mut all = Vec::new();
        let mut x: u64 = 99;
        for i in 0..200_000u64 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            let item = ((x >> 33) % 50_000, i % 3);
            r.push(item);
            all.push(item);
            if i % 12_345 == 0 {
                let v = r.view();
                assert!(v.starts.len() <= 9, "{} runs", v.starts.len());
                assert!(v.runs().all(|run| run.windows(2).all(|w| w[0] < w[1])));
                assert!(v.tail().len() <= UNSORTED_MAX);
                let (lo, hi) = ((x >> 40) % 50_000, (x >> 40) % 50_000 + 300);
                let mut got: Vec<_> = v.range(|&(k, _)| k, lo, hi).copied().collect();
                got.sort_unstable();
                got.dedup();
                let mut want: Vec<_> = all
                    .iter()
                    .filter(|(k, _)| (lo..hi).contains(k))
                    .copied()
                    .collect();
                want.sort_unstable();
                want.dedup();
                assert_eq!(got, want);
            }
        }
    }
}
