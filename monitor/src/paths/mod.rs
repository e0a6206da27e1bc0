//! Online path recording: functions and their dynamic CFGs, the shadow call stack, and the
//! Ball-Larus paths, PAP runs and k-slab forests of every activation, fed from the block stream.
//!
//! **Functions.** A function is entered by a `call` (its entry is the call target) or is the
//! ELF function symbol containing a block reached otherwise (the first block, a resynchronised
//! return, an indirect jump out of the current function). Its CFG nodes are keyed by guest
//! address: a block translated twice (before and after a code-cache flush) is one node. A
//! per-block-id cache maps an id to its node in the function it was last seen in, so the
//! per-event work is array lookups.
//!
//! **Shadow stack.** `call`/indirect `call` terminators push an activation that remembers its
//! guest return address; `ret` pops the activation whose return address is the target —
//! normally the top one. A return to a deeper frame (longjmp through `ret`, exceptions) pops
//! everything above it; a return to no frame on the stack, an indirect jump into a function
//! found deeper in the stack (longjmp), or a jump to another function's entry (a tail call)
//! replaces activations. An indirect jump to the return address of a frame on the stack
//! (`pop reg; jmp *reg`) is a return to that frame; a `call` to the very next instruction (the
//! get-pc idiom, `call 1f; 1: pop reg`) is no call at all. Every case other than the plain
//! return counts one [`PathRecorder::resyncs`].
//!
//! **Bounded memory.** Nothing the recorder keeps grows with the length of the run alone:
//! the shadow stack holds at most [`SHADOW_STACK_MAX`] frames (a deeper stack, or calls that
//! never return, drop the bottom half: their paths end there, as at an exit, and a later
//! return to one of them resynchronises); the call tree behind the flame graph is cut at
//! [`CALL_TREE_MAX_DEPTH`] frames; in-flight and stored PAP runs are capped by
//! [`PAP_MAX_PATHS`] and [`PAP_STORE_MAX`]. What remains grows with the program's code
//! (functions, blocks, distinct paths, pair programs), not with its run time.
//!
//! **Paths** (Ball-Larus lecture; DESIGN.md "Monitor"). A path runs inside one activation: it
//! starts at the function's entry or just after a back edge, and ends at a back edge or when
//! the activation ends (return, tail call, unwinding, end of the guest). Back edges are the
//! *retreating edges in address order* (`dst.addr <= src.addr`, DynamoRIO's backward-branch
//! rule): the forward edges then form a DAG whatever else is discovered later, so the back
//! edge set never changes as the CFG grows and a recorded path stays a Ball-Larus path of the
//! grown CFG. Calls do not end the caller's path: its next block is the return point.
//!
//! **Counts keyed by block sequence.** During the run each activation's current path is a
//! node of a prefix tree (trie) of the paths seen so far: a block steps to a child, found
//! through the parent's one-entry cache of its last child (a hash probe only when the path
//! differs from the last one taken through that prefix); a path end maps the trie node and
//! the end to a dense path number the same way. So the per-event work is array lookups and
//! compares, never a hash of a whole sequence. A path's block sequence is spelled once, when
//! it is first seen; the Ball-Larus ids are derived from the final CFG with
//! `hotpath_pathprof::BallLarus` when the profile is taken (see `report`), so CFG growth
//! never loses or mixes counts. The k-slab forests are fed those dense path numbers (a
//! one-to-one relabelling of Ball-Larus ids), and PAP runs are the sequences of path numbers of
//! one activation of a hot function, kept in a second trie (a run steps to a child per path
//! end and is counted at its node when the activation ends) and encoded with
//! `hotpath_pathprof::Pap` at the end.
//!
//! **Per event, not per block.** The ring carries one event per superblock run; stepping the
//! shadow stack and the trie once per basic block would cost the monitor far more per event
//! than the tables do. The default recorder ([`Recorder::Sums`]) keeps each activation's path
//! as a Ball-Larus sum and applies a run's blocks as one compiled program per pair of runs,
//! calls that return inside the run folded in (`pairs`); [`Recorder::PerBlock`] keeps the
//! plain per-block stepping of this file as the reference it is tested against.
//!
//! The files are stages that import one way (`tests/tests/layers.rs` fails on a cycle): first
//! the types each stage keeps, then the recorder's state, then what it does, stage by stage
//! (each an `impl PathRecorder` that imports the state and the types below it).
//!
//! | file | what |
//! |---|---|
//! | `ids.rs` | the one `NONE`, the maps' hasher, direct-mapped cache slots |
//! | `numbering.rs` | a function's Ball-Larus numbering as its CFG is discovered |
//! | `trie.rs` | the path trie's nodes and path records |
//! | `frames.rs` | shadow-stack frames, call-tree nodes, resynchronisation causes |
//! | `function.rs` | functions, their dynamic CFGs and symbols |
//! | `runs.rs` | what each event id stands for, and runs of repeated events |
//! | `pap_runs.rs` | the PAP run trie |
//! | `programs.rs` | pair programs and where they are found |
//! | `recorder.rs` | the recorder's state, the per-block step (the reference) and the trie's |
//! | `learn.rs` | ids, functions and CFG nodes learnt from the stream; the stream cut into runs |
//! | `stack.rs` | the shadow stack's rules and the call tree |
//! | `sums.rs` | Ball-Larus sums per activation, renumbering as a CFG grows |
//! | `pairs.rs` | the sums recorder per event: programs applied, the register loop |
//! | `compile.rs` | a pair of runs compiled into its chain of pieces |
//! | `report.rs` | Ball-Larus numbering, PAP encoding and k-paths when the profile is taken |
//!
//! `docs/paths-design.md` is where this is going (#56): one recorder fused with the tables,
//! fed the same event stream with and without paths; the sums recorder is that recorder as
//! far as it is built.

// Types, each file importing only the ones listed before it.
mod frames;
mod function;
mod ids;
mod numbering;
mod pap_runs;
mod programs;
mod recorder;
mod runs;
mod trie;
// What `PathRecorder` does, stage by stage (each imports the state and the stages below it).
mod compile;
mod learn;
mod pairs;
pub(crate) mod report;
mod stack;
mod sums;

pub use function::FunctionSymbol;
pub use pap_runs::PAP_MAX_PATHS;
pub use recorder::{PathConfig, PathRecorder, Recorder, DEFAULT_PAP_THRESHOLD};
pub use report::{K_PATHS_TOP, PAP_LISTED, PAP_PATHS_TOP};
