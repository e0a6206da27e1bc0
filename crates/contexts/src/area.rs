//! The per-thread context area: the current context and the frame stack, laid out for emitted
//! code (GS-relative, at a fixed offset in the translator's thread area).

use std::mem::{offset_of, size_of};

/// Frames the stack holds (40 bytes each: 10 MiB). An 8 MiB guest stack of the smallest frames
/// (a bare return address) is 1 Mi frames deep, so a real recursion can pass it, and a guest
/// whose calls never return (`call` used as a jump) passes it in a loop: then the bottom half
/// is dropped (see [`crate::Contexts::call_slow`]). Same bound as the monitor's shadow stack.
pub const FRAMES_MAX: usize = 1 << 18;

/// Return address of the sentinel frame below the first real one: non-canonical, so a `ret`
/// that matches it faults at the `ret` (and the dispatcher calls
/// [`crate::Contexts::repair`] before delivering the fault).
pub const SENTINEL_RETURN: u64 = 0x8000_0000_0000_0000;

/// One frame: pushed by a `call`, popped by the `ret` to its return address.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Frame {
    /// Guest address the callee's `ret` goes to.
    pub return_to: u64,
    /// Host address of the caller's context node (see [`crate::Node`]).
    pub caller: u64,
    /// Unused: the slot of the instrumented mode's path register, which went (#56). The
    /// frame keeps its 40-byte layout, which emitted code and the translator's golden files
    /// assume, until the calling-context steps themselves go.
    _unused_path: u64,
    /// Host address a `ret` that pops this frame goes on at: the caller's translation of
    /// `return_to` (a *landing*: a linked jump to the return point's block, so that a caller
    /// returns to the translation it called from), or 0 for none known — the return then looks
    /// `return_to` up in the indirect branch lookup table. The runtime's frames have 0, and a
    /// code cache flush sets every frame's to 0 ([`ContextArea::forget_hosts`]).
    pub host: u64,
    /// Unused, as `_unused_path` (the instrumented mode's run register).
    _unused_run: u64,
}

impl Frame {
    /// A frame returning to `return_to` in the context whose node is at host address
    /// `caller`, with no host address (its return goes through the lookup table).
    pub fn new(return_to: u64, caller: u64) -> Frame {
        Frame {
            return_to,
            caller,
            ..Frame::default()
        }
    }
}

/// A guest thread's context state. Written by that thread only: by its translated code (the
/// fast paths) and by [`crate::Contexts`] called from its dispatcher; never read by another
/// thread (the monitor learns contexts from the ring).
///
/// `frames[0]` is a sentinel ([`SENTINEL_RETURN`]); the stack holds `frames[1..top]`, where
/// `top = (frame_top - FRAMES) / 40`. A call's fast path tests `frame_top == FRAMES_END`
/// (full) flag-free, with `lea`/`jrcxz`.
#[repr(C, align(64))]
pub struct ContextArea {
    /// Host address of the current context's node.
    pub ctx: u64,
    /// Offset in bytes from the area's start of the next free frame: in
    /// `FRAMES + 40 ..= FRAMES_END`.
    pub frame_top: u64,
    /// Tail calls translated code made without the runtime (see
    /// [`crate::Contexts::resync_counts`]).
    pub tail_calls: u64,
    /// The frames start on a cache line of their own.
    _pad: [u64; 5],
    /// The frame stack, `frames[0]` the sentinel.
    pub frames: [Frame; FRAMES_MAX + 1],
}

impl ContextArea {
    /// Offset of [`ContextArea::ctx`], bytes.
    pub const CTX: usize = offset_of!(ContextArea, ctx);
    /// Offset of [`ContextArea::frame_top`], bytes.
    pub const FRAME_TOP: usize = offset_of!(ContextArea, frame_top);
    /// Offset of [`ContextArea::tail_calls`], bytes.
    pub const TAIL_CALLS: usize = offset_of!(ContextArea, tail_calls);
    /// Offset of `frames[0]` (the sentinel), bytes.
    pub const FRAMES: usize = offset_of!(ContextArea, frames);
    /// `frame_top` of an empty stack (the sentinel alone), bytes.
    pub const FRAMES_EMPTY: usize = Self::FRAMES + size_of::<Frame>();
    /// `frame_top` of a full stack, bytes.
    pub const FRAMES_END: usize = Self::FRAMES + (FRAMES_MAX + 1) * size_of::<Frame>();

    /// Initialises an area in place: no frames, current context `ctx` (a node's host
    /// address).
    pub fn init(&mut self, ctx: u64) {
        self.ctx = ctx;
        self.tail_calls = 0;
        self.frame_top = Self::FRAMES_EMPTY as u64;
        self.frames[0] = Frame::new(SENTINEL_RETURN, ctx);
    }

    /// Frames on the stack (the sentinel not counted); 0 also while a `ret` that matched the
    /// sentinel has left `frame_top` below it, until [`crate::Contexts::repair`].
    pub fn depth(&self) -> usize {
        (self.frame_top as usize).saturating_sub(Self::FRAMES_EMPTY) / size_of::<Frame>()
    }

    /// The stack's frames, bottom first.
    pub fn live_frames(&self) -> &[Frame] {
        &self.frames[1..1 + self.depth()]
    }

    /// Forgets the host addresses of every frame (a code cache flush made them stale): their
    /// returns go through the lookup table.
    pub fn forget_hosts(&mut self) {
        let depth = self.depth();
        for f in &mut self.frames[..=depth] {
            f.host = 0;
        }
    }

    /// Sets the stack to its first `depth` frames.
    pub(crate) fn truncate(&mut self, depth: usize) {
        self.frame_top = (Self::FRAMES_EMPTY + depth * size_of::<Frame>()) as u64;
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_is_what_emitted_code_assumes() {
        assert_eq!(ContextArea::CTX, 0);
        assert_eq!(ContextArea::FRAME_TOP, 8);
        assert_eq!(ContextArea::TAIL_CALLS, 16);
        assert_eq!(ContextArea::FRAMES, 64);
        assert_eq!(size_of::<Frame>(), 40);
        assert_eq!(offset_of!(Frame, caller), 8);
        assert_eq!(offset_of!(Frame, host), 24);
        assert_eq!(
            ContextArea::FRAMES_END - ContextArea::FRAMES_EMPTY,
            FRAMES_MAX * 40
        );
    }
}
