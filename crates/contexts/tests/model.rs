//! `Contexts` against a reference model written straight from the rules in the crate's doc:
//! a `Vec` of frames, a `Vec` of nodes and a map, no caches, no byte offsets. Random sequences
//! of calls, returns (to the top frame, to deeper ones, to nowhere), tail calls, indirect jumps
//! and signal handlers must leave both in the same state after every step.

use std::collections::HashMap;

use hotpath_contexts::{ContextId, Contexts, Functions, Resync, DEEPER, MAX_DEPTH};
use proptest::prelude::*;

/// Functions start at 4 KiB boundaries.
struct Pages;
impl Functions for Pages {
    fn containing(&self, addr: u64) -> u64 {
        addr & !0xfff
    }
}

#[derive(Default)]
struct Model {
    frames: Vec<(u64, usize)>,
    /// (parent, function, depth)
    nodes: Vec<(usize, u64, u32)>,
    children: HashMap<(usize, u64), usize>,
    cur: usize,
    signals: Vec<(usize, usize)>,
    resyncs: [u64; 4],
}

impl Model {
    fn new() -> Model {
        Model {
            nodes: vec![(0, 0, 0)],
            ..Model::default()
        }
    }

    fn child(&mut self, p: usize, f: u64) -> usize {
        let (_, pf, pd) = self.nodes[p];
        let f = if pd >= MAX_DEPTH {
            if pf == DEEPER {
                return p;
            }
            DEEPER
        } else {
            f
        };
        if let Some(&c) = self.children.get(&(p, f)) {
            return c;
        }
        self.nodes.push((p, f, pd + 1));
        let c = self.nodes.len() - 1;
        self.children.insert((p, f), c);
        c
    }

    fn call(&mut self, callee: u64, ret: u64) {
        self.frames.push((ret, self.cur));
        self.cur = self.child(self.cur, callee);
    }

    fn pop_to(&mut self, t: u64) -> Option<usize> {
        let i = self.frames.iter().rposition(|f| f.0 == t)?;
        self.cur = self.frames[i].1;
        let was_top = i + 1 == self.frames.len();
        self.frames.truncate(i);
        Some(was_top as usize)
    }

    fn replace(&mut self, f: u64) {
        let parent = self.nodes[self.cur].0;
        self.cur = self.child(parent, f);
    }

    fn ret(&mut self, t: u64) {
        match self.pop_to(t) {
            Some(1) => {}
            Some(_) => self.resyncs[Resync::DeeperReturn as usize] += 1,
            None => {
                self.resyncs[Resync::OrphanReturn as usize] += 1;
                self.replace(Pages.containing(t));
            }
        }
    }

    fn tail_call(&mut self, e: u64) {
        let f = self.nodes[self.cur].1;
        if f != e && f != DEEPER {
            self.resyncs[Resync::TailCall as usize] += 1;
            self.replace(e);
        }
    }

    fn jump(&mut self, t: u64) {
        if self.pop_to(t).is_some() {
            self.resyncs[Resync::JumpReturn as usize] += 1;
        }
    }

    fn signal_enter(&mut self, h: u64, r: u64) {
        if self.signals.len() == 64 {
            self.signals.remove(0);
        }
        self.signals.push((self.frames.len(), self.cur));
        self.call(h, r);
    }

    fn signal_return(&mut self) {
        if let Some((d, c)) = self.signals.pop() {
            if d <= self.frames.len() {
                self.frames.truncate(d);
            }
            self.cur = c;
        }
    }
}

#[derive(Clone, Debug)]
enum Op {
    Call(u64, u64),
    CallIndirect(u64, u64),
    Calls(u64, u32),
    RetTop,
    RetFrame(usize),
    Ret(u64),
    TailCall(u64),
    JumpFrame(usize),
    Jump(u64),
    SignalEnter(u64, u64),
    SignalReturn,
}

fn function() -> impl Strategy<Value = u64> {
    (1u64..6).prop_map(|i| i * 0x1000)
}

fn address() -> impl Strategy<Value = u64> {
    (0x1000u64..0x7000).prop_map(|a| a & !7)
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (function(), address()).prop_map(|(f, r)| Op::Call(f, r)),
        2 => (function(), address()).prop_map(|(f, r)| Op::CallIndirect(f, r)),
        1 => (function(), 1u32..200).prop_map(|(f, n)| Op::Calls(f, n)),
        6 => Just(Op::RetTop),
        1 => any::<usize>().prop_map(Op::RetFrame),
        1 => address().prop_map(Op::Ret),
        1 => function().prop_map(Op::TailCall),
        1 => any::<usize>().prop_map(Op::JumpFrame),
        1 => address().prop_map(Op::Jump),
        1 => (function(), address()).prop_map(|(f, r)| Op::SignalEnter(f, r)),
        1 => Just(Op::SignalReturn),
    ]
}

/// A live frame's return address, picked by `i`, or an address no frame returns to.
fn frame_target(m: &Model, i: usize) -> u64 {
    if m.frames.is_empty() {
        0x9_0000
    } else {
        m.frames[i % m.frames.len()].0
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(300))]

    #[test]
    fn contexts_follow_the_rules(ops in proptest::collection::vec(op(), 1..120)) {
        let mut c = Contexts::new_owned().unwrap();
        let mut m = Model::new();
        for op in &ops {
            match *op {
                Op::Call(f, r) => { c.call(f, r); m.call(f, r); }
                Op::CallIndirect(f, r) => { c.call_indirect(f, r); m.call(f, r); }
                Op::Calls(f, n) => {
                    for k in 0..n as u64 {
                        c.call(f, 0x8000 + 8 * k);
                        m.call(f, 0x8000 + 8 * k);
                    }
                }
                Op::RetTop => {
                    let t = m.frames.last().map_or(0x9_0000, |f| f.0);
                    c.ret(t, &Pages);
                    m.ret(t);
                }
                Op::RetFrame(i) => { let t = frame_target(&m, i); c.ret(t, &Pages); m.ret(t); }
                Op::Ret(t) => { c.ret(t, &Pages); m.ret(t); }
                Op::TailCall(e) => { c.tail_call(e); m.tail_call(e); }
                Op::JumpFrame(i) => { let t = frame_target(&m, i); c.jump(t); m.jump(t); }
                Op::Jump(t) => { c.jump(t); m.jump(t); }
                Op::SignalEnter(h, r) => { c.signal_enter(h, r); m.signal_enter(h, r); }
                Op::SignalReturn => { c.signal_return(); m.signal_return(); }
            }
            prop_assert_eq!(c.current(), ContextId(m.cur as u32), "after {:?}", op);
            let frames: Vec<(u64, ContextId)> =
                m.frames.iter().map(|&(r, k)| (r, ContextId(k as u32))).collect();
            prop_assert_eq!(c.frames(), frames, "after {:?}", op);
            prop_assert_eq!(c.resyncs, m.resyncs, "after {:?}", op);
            prop_assert_eq!(c.len(), m.nodes.len());
        }
        let view = c.view();
        for (i, &(p, f, d)) in m.nodes.iter().enumerate() {
            let n = view.node(ContextId(i as u32)).unwrap();
            prop_assert_eq!((n.parent, n.function, n.depth), (ContextId(p as u32), f, d));
        }
    }
}
