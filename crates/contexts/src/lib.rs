//! Calling contexts kept on the guest thread: the frame stack and the context tree that
//! translated code and the runtime share, and the rules that step them
//! (docs/paths-design.md, "Stage 1 as it will be built").
//!
//! ```text
//! translated call ──fast: push frame, step ctx through the node's one-entry cache──┐
//!        │ miss / frames full                                                      │
//!        └──▶ Contexts::call_slow (find or make the child, refill the cache) ──────┤
//! translated ret ──fast: top frame's return address == target? pop, restore ctx ───┤
//!        │ no                                                                      ▼
//!        └──▶ Contexts::ret_slow (deeper return, orphan return) ─────────▶ ContextArea.ctx
//!                                                                                  │
//!              context id (another thread) ──ContextView::node──▶ function, parent, depth
//! ```
//!
//! The guest thread is authoritative for its contexts: translated code and [`Contexts`] step
//! them, the monitor follows the context events the ring carries (`hotpath_events`). A context
//! is a node of the calling-context tree: a function under its caller's context, from a root.
//! Live activations form a chain from the root, one node per depth.
//!
//! **The rules** (each the restatement of the monitor's shadow-stack rule it replaces, in
//! `monitor/src/paths/stack.rs`):
//! 1. a `call` pushes a [`Frame`] (the guest return address and the caller's context) and
//!    steps to the child context of the callee's function ([`Contexts::call`]);
//! 2. a `ret` to the top frame's return address pops it and restores its context; a `ret` to the
//!    return address of a frame deeper in the stack pops to it (a *deeper return*); a `ret` to
//!    no frame's return address replaces the current context by a sibling for the function
//!    containing the target (an *orphan return*) ([`Contexts::ret`]);
//! 3. a jump to another function's entry replaces the current context by a sibling for it (a
//!    *tail call*, [`Contexts::tail_call`]); translated code reaches a function's entry by
//!    jumps through its *jump entry*, which checks the current context's function;
//! 4. an indirect jump to the return address of a live frame is a return to it (a *jump
//!    return*, [`Contexts::jump`]);
//! 5. a signal handler runs as an activation under the interrupted context
//!    ([`Contexts::signal_enter`]), and `rt_sigreturn` pops back ([`Contexts::signal_return`]).
//!
//! **Bounded memory.** At most [`FRAMES_MAX`] frames (a deeper stack drops its bottom half:
//! those activations' returns become orphan returns), [`CONTEXTS_MAX`] contexts (past it, a new
//! context is its parent: counted in [`Contexts::contexts_folded`]), and [`MAX_DEPTH`] levels
//! (deeper calls share one [`DEEPER`] context under the last kept level, as the monitor's call
//! tree did).
//!
//! | file | what |
//! |---|---|
//! | `area.rs` | the per-thread [`ContextArea`]: current context, frame stack (layout emitted code uses) |
//! | `tree.rs` | context nodes in an arena that never moves; the read-only [`ContextView`] |
//! | `reserve.rs` | the reserved mapping the arena lives in |
//! | `rules.rs` | [`Contexts`]: the fast paths as emitted code does them, and the slow paths' rules |

mod area;
mod reserve;
mod rules;
mod tree;

pub use area::{ContextArea, Frame, FRAMES_MAX, SENTINEL_RETURN};
pub use rules::{Contexts, Functions, Resync};
pub use tree::{
    CacheEntry, ContextId, ContextView, Node, NodeInfo, CACHE_ENTRIES, CONTEXTS_MAX, DEEPER,
    DIRECT_ENTRIES, DIRECT_PROBES, INDIRECT_ENTRIES, INDIRECT_FIRST, MAX_DEPTH,
};
