//! Compiling a pair of runs into its chain of pieces: the per-block step simulated over the
//! run's blocks, calls that return inside it folded in (see `pairs.rs`).

use super::frames::{Activation, K_CALL, K_INDIRECT, K_OTHER, K_RET};
use super::ids::NONE;
use super::numbering::EXIT_EDGE;
use super::programs::{
    End, Fold, FoldAcc, Prefix, Program, Scratch, SimFrame, CALL, FOREIGN, INTRA, NEVER, RETURN,
    TAIL,
};
use super::recorder::PathRecorder;
use super::trie::{START_ENTRY, START_HEAD};

impl PathRecorder {
    /// The chain of pieces of run `run` after the block `self.prev` in the current state: one
    /// [`NEVER`] piece if the per-block step would do anything but plain calls, plain returns
    /// and steps of an activation's path with nodes and edges its function's numbering has.
    pub(crate) fn compile(&mut self, run: u32, scratch: &mut Scratch) {
        let ind = self.pairs.ind.len();
        let ends = self.pairs.ends.len();
        scratch.blocks.clear();
        scratch.sim.clear();
        scratch.chain.clear();
        let folds = self.pairs.folds.len();
        let prefixes = self.pairs.prefixes.len();
        if self.compile_pieces(run, scratch).is_none() {
            self.pairs.ind.truncate(ind);
            self.pairs.ends.truncate(ends);
            self.pairs.folds.truncate(folds);
            self.pairs.prefixes.truncate(prefixes);
            scratch.chain.clear();
            scratch.chain.push(Program {
                epoch: self.pairs.epoch,
                kind: NEVER,
                ..Program::empty()
            });
        }
    }

    /// [`PathRecorder::compile`]'s work: `None` where the per-block step is needed. The
    /// shadow stack is simulated: frames pushed inside the run, over the real stack's.
    fn compile_pieces(&mut self, run: u32, scratch: &mut Scratch) -> Option<()> {
        if self.prev == NONE || self.config.k > 0 || self.stack.is_empty() {
            return None;
        }
        let info = self.runs.events[run as usize];
        scratch.blocks.extend_from_slice(
            &self.runs.seq[info.start as usize..(info.start + info.len) as usize],
        );
        let Scratch {
            blocks,
            sim,
            chain,
            fold,
        } = scratch;
        // A call whose callee returns inside the run is folded into the caller's piece where
        // nothing but the path counts needs its activation: no call tree, PAP runs or k-paths.
        let can_fold = !self.config.call_tree && self.config.pap_threshold == u64::MAX;
        let blocks = &blocks[..];
        // The simulated stack: the real frames below `real` as they are, then copies of the
        // others as the run changes them, and the frames it pushes.
        let mut real = self.stack.len() - 1;
        let frame_of = |a: &Activation| SimFrame {
            func: a.func,
            node: a.last_node,
            addr: a.last_addr,
            return_to: a.return_to,
        };
        sim.push(frame_of(&self.stack[real]));
        let mut before = self.prev;
        let mut k = 0;
        while k < blocks.len() {
            let b = blocks[k];
            let addr = self.id_addr[b as usize];
            let mut prog = Program {
                pos: k as u32,
                ind: self.pairs.ind.len() as u32,
                ends: self.pairs.ends.len() as u32,
                ..Program::empty()
            };
            let seg_start = match self.id_kind[before as usize] {
                // Only the run's first block follows a block that neither calls nor returns
                // and starts a piece.
                K_OTHER | K_INDIRECT
                    if matches!(self.id_entry.get(b as usize), Some(&e)
                        if e != NONE && e != sim.last().expect("a frame").func) =>
                {
                    // A tail call: the top frame's activation is replaced.
                    let (f, r0, n, _) = self.fold_start(b)?;
                    let top = sim.last_mut().expect("a frame");
                    prog.kind = TAIL;
                    prog.tail_of = top.func;
                    prog.r0 = r0;
                    prog.first_instr = self.funcs[f as usize].node_instr[n as usize] as u64;
                    (top.func, top.node, top.addr) = (f, n, addr);
                    k + 1
                }
                K_INDIRECT if self.node_in(sim.last().expect("a frame").func, b).is_none() => {
                    // Out of the top frame's function: a foreign jump, if that is what the
                    // per-block step would find (the rest is checked when applied).
                    let top = sim.last_mut().expect("a frame");
                    let sym = self.symbol_at(addr)?;
                    let entry = self.config.symbols[sym].addr;
                    let f = self.func_by_entry.get(&entry).copied()?;
                    if addr == top.return_to || self.owns(top.func, addr) || !self.by_sums(f) {
                        return None;
                    }
                    let n = self.node_in(f, b)?;
                    let tag = if n == 0 { START_ENTRY } else { START_HEAD };
                    prog.kind = FOREIGN;
                    prog.tail_of = top.func;
                    prog.r0 = self.funcs[f as usize].bl.start(tag, n)?;
                    prog.first_instr = self.funcs[f as usize].node_instr[n as usize] as u64;
                    (prog.ret, prog.foreign_sym) = (addr, sym as u32);
                    (top.func, top.node, top.addr) = (f, n, addr);
                    k + 1
                }
                K_OTHER | K_INDIRECT => {
                    prog.kind = INTRA;
                    k
                }
                K_CALL if addr != self.id_ret[before as usize] => {
                    let f = self.id_entry.get(b as usize).copied()?;
                    if f == NONE || !self.by_sums(f) {
                        return None;
                    }
                    let n = self.node_in(f, b)?;
                    prog.kind = CALL;
                    prog.ret = self.id_ret[before as usize];
                    let tag = if n == 0 { START_ENTRY } else { START_HEAD };
                    prog.r0 = self.funcs[f as usize].bl.start(tag, n)?;
                    prog.first_instr = self.funcs[f as usize].node_instr[n as usize] as u64;
                    sim.push(SimFrame {
                        func: f,
                        node: n,
                        addr,
                        return_to: prog.ret,
                    });
                    k + 1
                }
                K_RET if sim.last().map(|f| f.return_to) == Some(addr) => {
                    sim.pop();
                    if sim.is_empty() {
                        if real == 0 {
                            return None;
                        }
                        real -= 1;
                        sim.push(frame_of(&self.stack[real]));
                    }
                    // The caller's path goes on with the return point: a forward edge from
                    // the caller's last block.
                    let caller = sim.last_mut().expect("a frame");
                    let g = caller.func;
                    let n = self.node_in(g, b)?;
                    if addr <= caller.addr || !self.by_sums(g) {
                        return None;
                    }
                    let fun = &self.funcs[g as usize];
                    prog.kind = RETURN;
                    prog.ret = addr;
                    prog.from = caller.node;
                    prog.r0 = fun.bl.edge(caller.node, n)?;
                    prog.first_node = n;
                    prog.first_instr = fun.node_instr[n as usize] as u64;
                    (caller.node, caller.addr) = (n, addr);
                    k + 1
                }
                _ => return None,
            };
            let mut frame = *sim.last().expect("a frame");
            if !self.by_sums(frame.func) {
                return None;
            }
            prog.func = frame.func;
            if prog.kind != RETURN {
                prog.from = frame.node;
            }
            prog.epoch = self.fepoch[frame.func as usize];
            prog.last = b;
            prog.last_node = frame.node;
            prog.last_addr = frame.addr;
            // The segment: up to the first block after a call or a return, calls whose
            // callees return inside the run folded in.
            let mut end = seg_start;
            fold.clear();
            while end < blocks.len() {
                let c = blocks[end];
                let prior = if end == 0 { self.prev } else { blocks[end - 1] };
                let kind = self.id_kind[prior as usize];
                if end > k && kind == K_CALL && can_fold {
                    let mark = fold.mark();
                    match self.fold_call(blocks, end, &frame, fold, 1) {
                        Some(m) => {
                            // The return point: a forward edge of the caller (checked).
                            self.compile_step(&mut prog, &mut frame, blocks[m])
                                .expect("fold_call checked the return point's edge");
                            prog.last = blocks[m];
                            end = m + 1;
                            continue;
                        }
                        None => fold.truncate(mark),
                    }
                }
                if end > k && (kind == K_CALL || kind == K_RET) {
                    break;
                }
                if end > k
                    && kind != K_RET
                    && matches!(self.id_entry.get(c as usize), Some(&e) if e != NONE && e != frame.func)
                {
                    // A tail call starts the next piece.
                    break;
                }
                if kind == K_INDIRECT {
                    if end > k && self.node_in(frame.func, c).is_none() {
                        // Out of the function: the next piece (a foreign jump, or nothing).
                        break;
                    }
                    // A step of the path only into a block of its own function.
                    self.node_in(frame.func, c)?;
                    self.pairs.ind.push(self.id_addr[c as usize]);
                    prog.nind += 1;
                }
                if kind != K_RET {
                    // A step of the path, unless the block is another function's entry (a
                    // tail call); a return's first block is not tested, as in its step.
                    let entry = self.id_entry.get(c as usize).copied()?;
                    if entry != NONE && entry != frame.func {
                        return None;
                    }
                }
                self.compile_step(&mut prog, &mut frame, c)?;
                prog.last = c;
                end += 1;
            }
            let fun = &self.funcs[frame.func as usize];
            if prog.nends > 0 && fun.dense_len > 0 {
                prog.cbase = fun.dense_base.wrapping_add(prog.add);
            }
            if !fold.acts.is_empty() {
                self.keep_folds(&mut prog, fold);
            }
            *sim.last_mut().expect("a frame") = frame;
            chain.push(prog);
            before = blocks[end - 1];
            k = end;
        }
        if !self.tallies {
            self.fuse_prefixes(chain);
        }
        Some(())
    }

    /// Fuses each plain [`INTRA`] piece of `chain` that a call or a return follows into that
    /// piece, as its [`Prefix`].
    fn fuse_prefixes(&mut self, chain: &mut Vec<Program>) {
        let mut k = 0;
        while k + 1 < chain.len() {
            let (i, next) = (chain[k], chain[k + 1]);
            let plain = i.kind == INTRA && i.nends == 0 && !i.folded && i.nind == 0;
            if plain && matches!(next.kind, CALL | RETURN) && next.prefix == NONE {
                chain[k + 1].prefix = self.pairs.prefixes.len() as u32;
                chain[k + 1].pos = i.pos;
                self.pairs.prefixes.push(Prefix {
                    func: i.func,
                    epoch: i.epoch,
                    from: i.from,
                    last_node: i.last_node,
                    last_addr: i.last_addr,
                    add: i.add,
                });
                chain.remove(k);
            } else {
                k += 1;
            }
        }
    }

    /// Records the folded activations `fold` as piece `prog`'s (after its own path ends).
    fn keep_folds(&mut self, prog: &mut Program, fold: &FoldAcc) {
        prog.nfold_ends = fold.ends.len() as u32;
        self.pairs
            .ends
            .extend(fold.ends.iter().map(|&(func, id)| End {
                func,
                id,
                number: NONE,
            }));
        prog.folds = self.pairs.folds.len() as u32;
        let first = self.pairs.folds.len();
        for &func in &fold.acts {
            if !self.pairs.folds[first..].iter().any(|f| f.func == func) {
                self.pairs.folds.push(Fold {
                    func,
                    epoch: self.fepoch[func as usize],
                });
            }
        }
        prog.nfolds = (self.pairs.folds.len() - first) as u32;
        prog.folded = prog.nfolds > 0;
        prog.fold_depth = fold.depth;
        prog.fold_tails = fold.tail_calls;
    }

    /// Folds the activation that `blocks[at]` starts (the block before it calls) into the
    /// piece whose frame is `caller`, if it returns inside the run and is a plain activation
    /// throughout: it is entered at a function entry a call has reached, its steps are its
    /// function's numbered edges (its calls folded the same way, `depth` frames above the
    /// caller's), and it returns to its return address, where the caller's path goes on with
    /// a numbered forward edge. What it does is then the same at every run of the piece: the
    /// paths it ends and its function, added to `acc`. Returns the
    /// position of the return point in `blocks`; `None` where the per-block step would do
    /// anything else (`acc` may then hold part of the activation: the caller truncates it).
    fn fold_call(
        &self,
        blocks: &[u32],
        at: usize,
        caller: &SimFrame,
        acc: &mut FoldAcc,
        depth: u32,
    ) -> Option<usize> {
        let ret = self.id_ret[blocks[at - 1] as usize];
        if self.id_addr[blocks[at] as usize] == ret {
            return None;
        }
        // The function stepped, its path's sum, node and address.
        let (mut f, mut r, mut node, mut addr) = self.fold_start(blocks[at])?;
        acc.depth = acc.depth.max(depth);
        let mut j = at + 1;
        while j < blocks.len() {
            let c = blocks[j];
            let a = self.id_addr[c as usize];
            let bl = &self.funcs[f as usize].bl;
            match self.id_kind[blocks[j - 1] as usize] {
                K_RET => {
                    // A plain return (anything else resynchronises): the activation's last
                    // path ends with it, its id its sum.
                    if a != ret {
                        return None;
                    }
                    acc.ends.push((f, r));
                    acc.acts.push(f);
                    let h = caller.func;
                    let rn = self.node_in(h, c)?;
                    if a <= caller.addr || !self.by_sums(h) {
                        return None;
                    }
                    self.funcs[h as usize].bl.edge(caller.node, rn)?;
                    return Some(j);
                }
                K_CALL => {
                    let me = SimFrame {
                        func: f,
                        node,
                        addr,
                        return_to: ret,
                    };
                    let m = self.fold_call(blocks, j, &me, acc, depth + 1)?;
                    let rn = self
                        .node_in(f, blocks[m])
                        .expect("checked by the inner fold");
                    r = r.wrapping_add(bl.edge(node, rn).expect("checked by the inner fold"));
                    (node, addr) = (rn, self.id_addr[blocks[m] as usize]);
                    j = m + 1;
                    continue;
                }
                kind => {
                    let entry = self.id_entry.get(c as usize).copied()?;
                    if entry != NONE && entry != f {
                        // A jump to another function's entry: a tail call, which ends this
                        // activation and starts one of `entry` that returns where it would.
                        acc.ends.push((f, r));
                        acc.acts.push(f);
                        acc.tail_calls += 1;
                        (f, r, node, addr) = self.fold_start(c)?;
                        if f != entry {
                            return None;
                        }
                        j += 1;
                        continue;
                    }
                    // An indirect jump to the return address would return; one to another
                    // function's block, resynchronise.
                    let cn = self.node_in(f, c)?;
                    if kind == K_INDIRECT && a == ret {
                        return None;
                    }
                    if a <= addr {
                        // A back edge ends a path.
                        let e = bl.edge(node, EXIT_EDGE | cn)?;
                        acc.ends.push((f, r.wrapping_add(e)));
                        r = bl.start(START_HEAD, cn)?;
                    } else {
                        r = r.wrapping_add(bl.edge(node, cn)?);
                    }
                    (node, addr) = (cn, a);
                }
            }
            j += 1;
        }
        // The run ends inside the callee.
        None
    }

    /// How an activation that block `b` starts begins, if `b` is a function entry whose
    /// activations keep sums and whose start is numbered: the function, the register, the
    /// node and the address.
    fn fold_start(&self, b: u32) -> Option<(u32, u64, u32, u64)> {
        let f = self.id_entry.get(b as usize).copied()?;
        if f == NONE || !self.by_sums(f) {
            return None;
        }
        let n = self.node_in(f, b)?;
        let tag = if n == 0 { START_ENTRY } else { START_HEAD };
        let r = self.funcs[f as usize].bl.start(tag, n)?;
        Some((f, r, n, self.id_addr[b as usize]))
    }

    /// Adds block `c`'s step to piece `prog`'s segment on frame `frame` (its function, node
    /// and address before and after): `None` if its node, edge or end is not numbered.
    fn compile_step(&mut self, prog: &mut Program, frame: &mut SimFrame, c: u32) -> Option<()> {
        let fun = &self.funcs[frame.func as usize];
        let bl = &fun.bl;
        let n = self.node_in(frame.func, c)?;
        let a = self.id_addr[c as usize];
        let i = fun.node_instr[n as usize] as u64;
        if a <= frame.addr {
            let end = bl.edge(frame.node, EXIT_EDGE | n)?;
            let start = bl.start(START_HEAD, n)?;
            if prog.nends == 0 {
                prog.add = prog.add.wrapping_add(end);
            } else {
                self.pairs.ends.push(End {
                    func: frame.func,
                    id: prog.r_after.wrapping_add(end),
                    number: NONE,
                });
                prog.mid_blocks += prog.blocks_after as u64;
                prog.mid_instr += prog.instr_after;
            }
            prog.nends += 1;
            (prog.r_after, prog.blocks_after, prog.instr_after) = (start, 1, i);
        } else {
            let e = bl.edge(frame.node, n)?;
            if prog.nends == 0 {
                prog.add = prog.add.wrapping_add(e);
                prog.blocks += 1;
                prog.instr += i;
            } else {
                prog.r_after = prog.r_after.wrapping_add(e);
                prog.blocks_after += 1;
                prog.instr_after += i;
            }
        }
        (frame.node, frame.addr) = (n, a);
        prog.last_node = n;
        prog.last_addr = a;
        Some(())
    }
}
