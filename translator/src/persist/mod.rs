//! Translations kept across processes: the persisted translation store (Reddi et al.,
//! "Persistent code caching", CGO 2007; DynamoRIO's persisted caches).
//!
//! ```text
//! translate block at pc ──▶ module of pc (file id) ──▶ store file of (module, hotpath, CPU, ring)
//!        │ hit: guest bytes equal the mapped ones ──▶ place the record (relocate) ──▶ code cache
//!        └ miss: decode + emit as usual ──▶ record kept in memory ──▶ written at the process's end
//! ```
//!
//! One file per module and emission setting, in the cache directory ([`CacheDir`]), named by a
//! hash of its key and carrying the key itself, an index by guest offset, and one
//! [`record::BlockRecord`] per basic block, each with its own CRC-32 (layout: `format`), so a
//! process reads the file once and decodes only the records it places. Blocks are placed
//! lazily, when they are first reached, in the order a cold run translates them, so block ids
//! (and every profile count) are those of a cold run. What is not persisted: superblocks,
//! instrumented code, blocks with calling-context steps, blocks on pages the guest may write,
//! blocks that trap, the vDSO.
//!
//! Policy (decided in #39): the directory is `$HOTPATH_CACHE_DIR`, else
//! `$XDG_CACHE_HOME/hotpath`, else `~/.cache/hotpath`; it must be a directory owned by the
//! user with no group or other permissions (else it is not used), and each file a regular
//! file owned by the user, mode 0600. Files are written to a temporary name and renamed into
//! place, read, merged and replaced under an exclusive `flock(2)` on an empty lock file beside
//! each (waited for at most a second), so that processes ending together (a shell pipeline)
//! do not drop each other's records; the directory is kept under a size bound
//! (`HOTPATH_CACHE_SIZE`, default 1 GiB) by removing the least recently used files. A cache
//! that cannot be read or written is skipped: the guest runs as it would without it, and the
//! report counts the failure.

mod format;
pub mod record;
mod store;

pub use format::{EmitKey, ModuleRecords};
pub use store::{CacheDir, CacheSummary, Store, StoreHold, StoreStats};
