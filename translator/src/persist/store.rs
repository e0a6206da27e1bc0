//! The cache directory and its files: where they are, who may have written them, reading and
//! checking one, writing one atomically under its lock, the size bound, and the hit and miss
//! counts.

use std::collections::HashMap;
use std::fs::{self, OpenOptions};
use std::hash::{Hash, Hasher};
use std::io::{Read, Write};
use std::os::unix::fs::{DirBuilderExt, MetadataExt, OpenOptionsExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use rustix::fs::FlockOperation;

use super::format::{self, EmitKey, FileBytes, Key, ModuleRecords};
use super::record::BlockRecord;
use crate::cache::modules::FileId;

/// The default size bound of the cache directory, in bytes.
const DEFAULT_LIMIT: u64 = 1 << 30;
/// What the directory is trimmed to when it is over its bound: this share of the bound, so
/// that every write does not trim again.
const TRIM_TO_PERCENT: u64 = 90;
/// How long after one process checked the directory against its bound (a read of every
/// file's size and age: about 2 ms for 800 files) another that wrote a store file skips the
/// check, unless it wrote at least 1/[`TRIM_EVERY_SHARE`] of the bound itself: a shell loop's
/// processes each paid the check, and with the files written since, the directory can exceed
/// its bound by what its writers add in this time.
const TRIM_INTERVAL: Duration = Duration::from_secs(30);
const TRIM_EVERY_SHARE: u64 = 32;
/// The file whose modification time is when the directory was last checked against its bound.
const TRIMMED: &str = "trimmed";
/// The hit/miss log is summed into one line when it grows past this many bytes.
const STATS_COMPACT_BYTES: u64 = 64 << 10;
/// A store file is rewritten with this process's new records and its delta file's when there
/// are at least this many of them, ...
const REWRITE_MIN_NEW: usize = 256;
/// ... or when they are at least 1/`REWRITE_SHARE` of the records the file held. Fewer go to
/// its delta file (a store file of its own, next to it), rewritten with them: small, so cheap
/// to rewrite, and read with the file.
const REWRITE_SHARE: usize = 32;
/// What a store file's delta file adds to its name (`<hash>.delta.hpc`).
const DELTA: &str = "delta";
/// Suffix of store files.
const SUFFIX: &str = "hpc";
/// Suffix added to a store file's name for its lock file (`<hash>.hpc.lock`, empty).
const LOCK_SUFFIX: &str = "lock";
/// How long a process waits for another one to finish rewriting a store file before it
/// rewrites it without the lock: a rewrite is a copy of the file, done in milliseconds, and a
/// process at its exit (or exec) must not hang on a writer that is stopped or traced.
const LOCK_WAIT: Duration = Duration::from_secs(1);
/// How often a busy lock is tried again within [`LOCK_WAIT`].
const LOCK_POLL: Duration = Duration::from_millis(2);

/// The cache directory, checked to be the user's own (see the module doc of `persist`).
#[derive(Clone, Debug)]
pub struct CacheDir {
    path: PathBuf,
    /// Size bound in bytes.
    limit: u64,
}

/// What `hotpath cache` shows.
#[derive(Clone, Debug, Default)]
pub struct CacheSummary {
    /// Store files.
    pub files: u64,
    /// Their size, in bytes.
    pub bytes: u64,
    /// The size bound, in bytes.
    pub limit: u64,
    /// Blocks taken from the cache, over every run that wrote its counts.
    pub hits: u64,
    /// Blocks translated afresh in modules the cache could have held.
    pub misses: u64,
}

impl CacheDir {
    /// Where the cache is: `$HOTPATH_CACHE_DIR`, else `$XDG_CACHE_HOME/hotpath`, else
    /// `$HOME/.cache/hotpath`; `None` when `HOTPATH_CACHE=off` or none of them is set.
    pub fn location() -> Option<PathBuf> {
        let var = |k: &str| std::env::var_os(k).filter(|v| !v.is_empty());
        if CacheDir::switched_off() {
            return None;
        }
        if let Some(d) = var("HOTPATH_CACHE_DIR") {
            return Some(d.into());
        }
        if let Some(d) = var("XDG_CACHE_HOME") {
            return Some(Path::new(&d).join("hotpath"));
        }
        var("HOME").map(|h| Path::new(&h).join(".cache").join("hotpath"))
    }

    /// Whether `HOTPATH_CACHE` is `off` (or `0`): no cache, wherever it would be.
    pub fn switched_off() -> bool {
        std::env::var_os("HOTPATH_CACHE").is_some_and(|v| v == "off" || v == "0")
    }

    /// The size bound: `$HOTPATH_CACHE_SIZE` (see [`CacheDir::parse_limit`]); 1 GiB by
    /// default.
    fn limit() -> u64 {
        std::env::var("HOTPATH_CACHE_SIZE").map_or(DEFAULT_LIMIT, |v| CacheDir::parse_limit(&v))
    }

    /// A size bound in bytes, with an optional `K`, `M` or `G` suffix; 1 GiB if `v` is not one.
    fn parse_limit(v: &str) -> u64 {
        let v = v.trim();
        let (num, shift) = match v.chars().last().map(|c| c.to_ascii_uppercase()) {
            Some('K') => (&v[..v.len() - 1], 10),
            Some('M') => (&v[..v.len() - 1], 20),
            Some('G') => (&v[..v.len() - 1], 30),
            _ => (v, 0),
        };
        num.trim()
            .parse::<u64>()
            .map_or(DEFAULT_LIMIT, |n| n << shift)
    }

    /// Opens (creating it, mode 0700, if needed) the cache directory at `path`.
    ///
    /// # Errors
    /// A one-line reason when it cannot be created, or is not a directory owned by this user
    /// without group or other permissions (a symlink included).
    pub fn open(path: &Path) -> Result<CacheDir, String> {
        if let Some(parent) = path.parent() {
            let _ = fs::create_dir_all(parent);
        }
        match fs::DirBuilder::new().mode(0o700).create(path) {
            Ok(()) => {}
            Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(format!("cannot create {}: {e}", path.display())),
        }
        let m = fs::symlink_metadata(path).map_err(|e| format!("{}: {e}", path.display()))?;
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        if !m.file_type().is_dir() {
            return Err(format!("{} is not a directory", path.display()));
        }
        if m.uid() != me || m.mode() & 0o077 != 0 {
            return Err(format!(
                "{} is not private to this user (owner {}, mode {:o})",
                path.display(),
                m.uid(),
                m.mode() & 0o7777
            ));
        }
        Ok(CacheDir {
            path: path.to_path_buf(),
            limit: CacheDir::limit(),
        })
    }

    /// The directory.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// The file name of the store for `key`.
    fn file_name(key: &Key) -> String {
        // SipHash with fixed keys: stable for one hotpath build, which is in the key.
        let mut h = std::hash::DefaultHasher::new();
        key.hash(&mut h);
        format!("{:016x}.{SUFFIX}", h.finish())
    }

    /// The file name of the delta file of store file `name` (see [`REWRITE_SHARE`]).
    fn delta_name(name: &str) -> String {
        let stem = name.strip_suffix(SUFFIX).unwrap_or(name);
        format!("{stem}{DELTA}.{SUFFIX}")
    }

    /// The records of store file `name`, if it is a regular file owned by this user, mode
    /// 0600 or stricter, whose header, key and index are whole and whose key is `key` (see
    /// [`ModuleRecords::parse`]); its modification time is set to now (the size bound removes
    /// the least recently used first).
    fn read(&self, name: &str, key: &Key) -> Option<ModuleRecords> {
        let mut f = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(self.path.join(name))
            .ok()?;
        let m = f.metadata().ok()?;
        // SAFETY: geteuid has no preconditions.
        if !m.file_type().is_file()
            || m.uid() != unsafe { libc::geteuid() }
            || m.mode() & 0o077 != 0
        {
            return None;
        }
        // SAFETY: the store never writes a file in place (a new one is renamed over it, and
        // the mapping keeps the old one), and this user's 0600 file in a 0700 directory is
        // nobody else's to change. Every record's CRC is checked before it is used, so a
        // changed byte only costs that record; only a file truncated under the running process
        // by hand would fault (SIGBUS) when a record past its new end is read.
        let bytes = match unsafe { memmap2::Mmap::map(&f) } {
            Ok(m) => FileBytes::Mapped(m),
            Err(_) => {
                let mut bytes = Vec::with_capacity(m.len() as usize);
                f.read_to_end(&mut bytes).ok()?;
                FileBytes::Owned(bytes)
            }
        };
        let records = ModuleRecords::parse(bytes, key)?;
        let _ = f.set_modified(std::time::SystemTime::now());
        Some(records)
    }

    /// What says whether store file `name` is still the one read: its inode and size (a
    /// writer renames a new file over it; a read changes its modification time). `None` when
    /// there is none.
    fn stamp(&self, name: &str) -> Option<(u64, u64)> {
        let m = fs::symlink_metadata(self.path.join(name)).ok()?;
        Some((m.ino(), m.len()))
    }

    /// The lock of store file `name`, taken: held by whoever reads, merges and replaces the
    /// file, so that two writers at the same time (the two ends of a shell pipeline, say) do
    /// not each replace it with a merge that lacks the other's records. Waits at most
    /// [`LOCK_WAIT`]; `None` when the lock is still busy then, or its file cannot be opened.
    fn lock(&self, name: &str) -> Option<StoreLock> {
        let path = self.lock_path(name);
        let deadline = Instant::now() + LOCK_WAIT;
        loop {
            let f = OpenOptions::new()
                .write(true)
                .create(true)
                .truncate(false)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&path)
                .ok()?;
            loop {
                match rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive) {
                    Ok(()) => break,
                    Err(rustix::io::Errno::WOULDBLOCK | rustix::io::Errno::INTR)
                        if Instant::now() < deadline =>
                    {
                        std::thread::sleep(LOCK_POLL)
                    }
                    Err(_) => return None,
                }
            }
            // Whoever removed the lock file (`remove_lock`) held it: if it is gone, or another
            // one is in its place, this lock excludes nobody; take the one there now.
            let (held, there) = (f.metadata().ok()?, fs::symlink_metadata(&path));
            if there.is_ok_and(|m| (m.dev(), m.ino()) == (held.dev(), held.ino())) {
                return Some(StoreLock { _file: f });
            }
            if Instant::now() >= deadline {
                return None;
            }
        }
    }

    /// Where the lock file of store file `name` is.
    fn lock_path(&self, name: &str) -> PathBuf {
        self.path.join(format!("{name}.{LOCK_SUFFIX}"))
    }

    /// Removes the lock file at `path` if nobody holds it (taking it first, so that a writer
    /// waiting for it sees it gone, see [`CacheDir::lock`]); a held one is left, for its
    /// holder's store file.
    fn remove_lock(path: &Path) {
        let Ok(f) = OpenOptions::new()
            .read(true)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(path)
        else {
            return;
        };
        if rustix::fs::flock(&f, FlockOperation::NonBlockingLockExclusive).is_ok() {
            let _ = fs::remove_file(path);
        }
    }

    /// Writes store file `name` atomically: a temporary file (mode 0600) renamed into place.
    fn write(&self, name: &str, bytes: &[u8]) -> std::io::Result<()> {
        let tmp = self.path.join(format!(
            ".{name}.{}.{}.tmp",
            std::process::id(),
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.subsec_nanos())
        ));
        let result = (|| {
            let mut f = OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
                .open(&tmp)?;
            f.write_all(bytes)?;
            drop(f);
            fs::rename(&tmp, self.path.join(name))
        })();
        if result.is_err() {
            let _ = fs::remove_file(&tmp);
        }
        result
    }

    /// The store files, with their sizes and modification times.
    fn files(&self) -> Vec<(PathBuf, u64, std::time::SystemTime)> {
        let Ok(entries) = fs::read_dir(&self.path) else {
            return Vec::new();
        };
        entries
            .flatten()
            .filter(|e| e.path().extension().is_some_and(|x| x == SUFFIX))
            .filter_map(|e| {
                let m = e.metadata().ok()?;
                Some((e.path(), m.len(), m.modified().ok()?))
            })
            .collect()
    }

    /// Whether a process that wrote `written` bytes of store files checks the directory
    /// against its bound ([`trim`](Self::trim)): when nobody has for [`TRIM_INTERVAL`], or it
    /// wrote a large share of the bound.
    fn trim_due(&self, written: u64) -> bool {
        if written >= self.limit / TRIM_EVERY_SHARE {
            return true;
        }
        let checked = fs::metadata(self.path.join(TRIMMED)).and_then(|m| m.modified());
        !checked.is_ok_and(|at| at.elapsed().is_ok_and(|age| age < TRIM_INTERVAL))
    }

    /// Removes the least recently used store files (and their lock files) while the directory
    /// is over its bound, and notes when it did ([`trim_due`](Self::trim_due)).
    fn trim(&self) {
        let _ = fs::File::create(self.path.join(TRIMMED));
        let mut files = self.files();
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        if total <= self.limit {
            return;
        }
        files.sort_by_key(|f| f.2);
        let target = self.limit / 100 * TRIM_TO_PERCENT;
        for (path, size, _) in files {
            if total <= target {
                break;
            }
            if fs::remove_file(&path).is_ok() {
                total -= size;
                let mut lock = path.into_os_string();
                lock.push(format!(".{LOCK_SUFFIX}"));
                CacheDir::remove_lock(Path::new(&lock));
            }
        }
    }

    /// Adds a run's counts to the directory's hit/miss log (one short `O_APPEND` write, so
    /// concurrent runs do not mix their lines); a long log is summed into one line first.
    fn add_counts(&self, hits: u64, misses: u64) {
        let log = self.path.join("stats");
        if fs::metadata(&log).is_ok_and(|m| m.len() > STATS_COMPACT_BYTES) {
            let (h, m) = read_counts(&log);
            let _ = self.write("stats", format!("{h} {m}\n").as_bytes());
        }
        if let Ok(mut f) = OpenOptions::new()
            .append(true)
            .create(true)
            .mode(0o600)
            .custom_flags(libc::O_NOFOLLOW | libc::O_CLOEXEC)
            .open(&log)
        {
            let _ = f.write_all(format!("{hits} {misses}\n").as_bytes());
        }
    }

    /// What is in the directory.
    pub fn summary(&self) -> CacheSummary {
        let files = self.files();
        let (hits, misses) = read_counts(&self.path.join("stats"));
        CacheSummary {
            files: files.len() as u64,
            bytes: files.iter().map(|f| f.1).sum(),
            limit: self.limit,
            hits,
            misses,
        }
    }

    /// Removes every store file, the lock files nobody holds, and the counts; returns how
    /// many store files were removed.
    ///
    /// # Errors
    /// The first removal of a store file or the counts that failed.
    pub fn clear(&self) -> std::io::Result<u64> {
        let mut n = 0;
        for (path, _, _) in self.files() {
            fs::remove_file(path)?;
            n += 1;
        }
        for e in fs::read_dir(&self.path)?.flatten() {
            if e.path().extension().is_some_and(|x| x == LOCK_SUFFIX) {
                CacheDir::remove_lock(&e.path());
            }
        }
        match fs::remove_file(self.path.join("stats")) {
            Err(e) if e.kind() != std::io::ErrorKind::NotFound => return Err(e),
            _ => {}
        }
        Ok(n)
    }
}

/// The sums of the `hits misses` lines of the log at `path`.
fn read_counts(path: &Path) -> (u64, u64) {
    let text = fs::read_to_string(path).unwrap_or_default();
    let mut sums = (0u64, 0u64);
    for line in text.lines() {
        let mut w = line.split(' ').map(|x| x.parse::<u64>());
        if let (Some(Ok(h)), Some(Ok(m))) = (w.next(), w.next()) {
            sums.0 += h;
            sums.1 += m;
        }
    }
    sums
}

/// A store file's lock (see [`CacheDir::lock`]): an exclusive `flock(2)` on its lock file, for
/// as long as this is alive (closing the file unlocks it).
struct StoreLock {
    _file: fs::File,
}

/// One module's records: those read from its file, and those this process translated.
#[derive(Default)]
struct ModuleStore {
    /// As read from the module's store file.
    records: Arc<ModuleRecords>,
    /// New ones, not in `records`, to write at the end.
    pending: Vec<BlockRecord>,
    /// The store file's and its delta file's [`CacheDir::stamp`] when they were read.
    stamps: [Option<(u64, u64)>; 2],
    /// A block missing from `records` has made the store look at the files again since they
    /// were read (or since the process was forked): see [`Store::refresh`].
    checked: bool,
}

/// Counters of the store's work in this process.
#[derive(Clone, Copy, Debug, Default)]
pub struct StoreStats {
    /// Store files that could not be written, or a cache directory that could not be used.
    pub errors: u64,
    /// Store files read.
    pub files_read: u64,
    /// Store files written.
    pub files_written: u64,
}

/// The store's lock, held (see [`Store::try_hold`]).
pub struct StoreHold<'a>(std::sync::MutexGuard<'a, HashMap<FileId, ModuleStore>>);

impl StoreHold<'_> {
    /// Forgets the records kept so far: in a forked child, they are its parent's to write.
    /// Their memory is left as it is, shared with the parent until written: freeing it
    /// would write to every heap page they are on (a cold shell's child freed 1,757 records
    /// in 0.9 ms, its whole fork otherwise taking 0.4 ms).
    pub fn forget_pending(&mut self) {
        for m in self.0.values_mut() {
            std::mem::forget(std::mem::take(&mut m.pending));
            // What earlier children wrote since the parent read the files is the child's to
            // find (`Store::refresh`).
            m.checked = false;
        }
    }
}

/// A process's view of the persisted translations: the cache directory, the modules' records
/// read so far, and the records translated here (shared by the process's threads).
pub struct Store {
    dir: Option<CacheDir>,
    key: EmitKey,
    modules: Mutex<HashMap<FileId, ModuleStore>>,
    errors: AtomicU64,
    files_read: AtomicU64,
    files_written: AtomicU64,
}

impl Store {
    /// The store in the cache directory at `path`, for code emitted as `key` says. A directory
    /// that cannot be used gives a store that reads and writes nothing, with one error counted.
    pub fn new(path: &Path, key: EmitKey) -> Store {
        let dir = CacheDir::open(path).ok();
        Store {
            errors: AtomicU64::new(dir.is_none() as u64),
            dir,
            key,
            modules: Mutex::new(HashMap::new()),
            files_read: AtomicU64::new(0),
            files_written: AtomicU64::new(0),
        }
    }

    fn lock(&self) -> std::sync::MutexGuard<'_, HashMap<FileId, ModuleStore>> {
        self.modules.lock().unwrap_or_else(|e| e.into_inner())
    }

    /// The records of the module in file `file`, read from its store file the first time.
    pub fn records(&self, file: &FileId) -> Option<Arc<ModuleRecords>> {
        let dir = self.dir.as_ref()?;
        let mut modules = self.lock();
        if let Some(m) = modules.get(file) {
            return Some(m.records.clone());
        }
        let (records, stamps) = self.read_module(dir, file);
        modules.insert(
            file.clone(),
            ModuleStore {
                records: records.clone(),
                pending: Vec::new(),
                stamps,
                checked: false,
            },
        );
        Some(records)
    }

    /// Reads the records of the module in file `file` from its store file and delta file,
    /// with the files' stamps (taken first: a writer that replaces a file meanwhile makes the
    /// next [`refresh`](Self::refresh) read it again).
    fn read_module(
        &self,
        dir: &CacheDir,
        file: &FileId,
    ) -> (Arc<ModuleRecords>, [Option<(u64, u64)>; 2]) {
        let key = (self.key.clone(), file.clone());
        let name = CacheDir::file_name(&key);
        let delta_name = CacheDir::delta_name(&name);
        let stamps = [dir.stamp(&name), dir.stamp(&delta_name)];
        let mut records = match dir.read(&name, &key) {
            Some(records) => {
                self.files_read.fetch_add(1, Ordering::Relaxed);
                records
            }
            None => ModuleRecords::default(),
        };
        if let Some(delta) = dir.read(&delta_name, &key) {
            self.files_read.fetch_add(1, Ordering::Relaxed);
            records = records.with_delta(delta);
        }
        (Arc::new(records), stamps)
    }

    /// After a block of the module in file `file` was missing from its records: the records
    /// read again, if its store files changed since they were read (another process wrote
    /// them: an earlier child of a shell loop wrote the blocks that the parent never runs and
    /// each child does). At most once per module per process (and again in a forked child);
    /// `None` when nothing changed or it was done already.
    pub fn refresh(&self, file: &FileId) -> Option<Arc<ModuleRecords>> {
        let dir = self.dir.as_ref()?;
        let mut modules = self.lock();
        let m = modules.get_mut(file)?;
        if m.checked {
            return None;
        }
        m.checked = true;
        let key = (self.key.clone(), file.clone());
        let name = CacheDir::file_name(&key);
        let now = [dir.stamp(&name), dir.stamp(&CacheDir::delta_name(&name))];
        if now == m.stamps {
            return None;
        }
        let (records, stamps) = self.read_module(dir, file);
        m.records = records.clone();
        m.stamps = stamps;
        m.pending.retain(|r| !records.contains(r.offset));
        Some(records)
    }

    /// Keeps `record`, translated in this process from the module in file `file`, for
    /// [`write`](Self::write).
    pub fn keep(&self, file: &FileId, record: BlockRecord) {
        if self.dir.is_none() {
            return;
        }
        let mut modules = self.lock();
        let m = modules.entry(file.clone()).or_default();
        if !m.records.contains(record.offset) {
            // Keeping is optional: with no memory for it (an address space limit the guest
            // used up), the module's new records are dropped, to be translated again next time.
            if crate::host::reserve::exhausted()
                || crate::host::reserve::fallibly(|| m.pending.try_reserve(1)).is_err()
            {
                m.pending = Vec::new();
                self.errors.fetch_add(1, Ordering::Relaxed);
                return;
            }
            m.pending.push(record);
        }
    }

    /// The store's lock, if it is free: held across a `fork` with the process's other locks
    /// (`ProcessShared::hold_for_fork`).
    pub fn try_hold(&self) -> Option<StoreHold<'_>> {
        match self.modules.try_lock() {
            Ok(g) => Some(StoreHold(g)),
            Err(std::sync::TryLockError::Poisoned(e)) => Some(StoreHold(e.into_inner())),
            Err(std::sync::TryLockError::WouldBlock) => None,
        }
    }

    /// Writes the records kept since the last write into their modules' store files (merged
    /// with what the files hold now: another process may have written them meanwhile, each
    /// read, merge and replace under the file's lock), trims the directory, and adds `hits`
    /// and `misses` to its counts.
    pub fn write(&self, hits: u64, misses: u64) {
        let Some(dir) = &self.dir else { return };
        // Out of memory, the run's end needs what is left for its profile.
        if crate::host::reserve::exhausted() {
            return;
        }
        let mut modules = self.lock();
        let mut wrote = false;
        let mut bytes_written = 0u64;
        for (file, m) in modules.iter_mut() {
            if m.pending.is_empty() {
                continue;
            }
            // A rewrite costs about what the file holds; a few new blocks go to its delta
            // file, rewritten instead: python3 meets a dozen new ones on each run (its hashes
            // are randomised), `ls` a hundred in a libc file of 40,000 that other programs
            // filled, and each run translating one afresh builds iced's tables (a millisecond
            // and a half).
            let new = m.pending.len() + m.records.delta().map_or(0, |d| d.len());
            let whole = new >= REWRITE_MIN_NEW || new * REWRITE_SHARE >= m.records.own_len();
            let key = (self.key.clone(), file.clone());
            let name = CacheDir::file_name(&key);
            let delta_name = CacheDir::delta_name(&name);
            // Without the lock (another writer has held it for LOCK_WAIT, or its file cannot
            // be made) the file is still merged and replaced whole, as with it; only a writer
            // at the same time may then lose its records to ours, or ours to its (they are
            // translated again next time). One lock covers the file and its delta.
            let lock = dir.lock(&name);
            let delta = dir.read(&delta_name, &key);
            let mut write = |name: &str, bytes: Vec<u8>| {
                let ok = dir.write(name, &bytes).is_ok();
                if ok {
                    bytes_written += bytes.len() as u64;
                }
                ok
            };
            let written = if whole {
                let old = dir.read(&name, &key);
                let olds: Vec<&ModuleRecords> = old.iter().chain(delta.iter()).collect();
                let done = format::encode_merged(&key, &olds, &m.pending)
                    .is_some_and(|bytes| write(&name, bytes));
                if done && delta.is_some() {
                    let _ = fs::remove_file(dir.path.join(&delta_name));
                }
                done
            } else {
                let olds: Vec<&ModuleRecords> = delta.iter().collect();
                format::encode_merged(&key, &olds, &m.pending)
                    .is_some_and(|bytes| write(&delta_name, bytes))
            };
            drop(lock);
            m.pending.clear();
            if written {
                self.files_written.fetch_add(1, Ordering::Relaxed);
                wrote = true;
            } else {
                self.errors.fetch_add(1, Ordering::Relaxed);
            }
        }
        drop(modules);
        if wrote && dir.trim_due(bytes_written) {
            dir.trim();
        }
        if hits + misses > 0 {
            dir.add_counts(hits, misses);
        }
    }

    /// This process's counters.
    pub fn stats(&self) -> StoreStats {
        StoreStats {
            errors: self.errors.load(Ordering::Relaxed),
            files_read: self.files_read.load(Ordering::Relaxed),
            files_written: self.files_written.load(Ordering::Relaxed),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::persist::format::tests::{key, record};

    #[test]
    fn a_file_is_rewritten_for_enough_new_records_only() {
        let dir = std::env::temp_dir().join(format!("hotpath-store-test-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (emit, file) = key();
        // Records in the file itself, and in its delta file.
        let in_files = |own: usize, delta: usize| {
            let store = Store::new(&dir, emit.clone());
            let r = store.records(&file).unwrap();
            assert_eq!(
                (r.own_len(), r.delta().map_or(0, |d| d.own_len())),
                (own, delta)
            );
        };
        let name = CacheDir::file_name(&(emit.clone(), file.clone()));
        let delta_file = dir.join(CacheDir::delta_name(&name));
        // A process that reads the file, keeps records at `offsets` and writes.
        let run = |offsets: &[u64]| {
            let store = Store::new(&dir, emit.clone());
            store.records(&file);
            for &o in offsets {
                store.keep(&file, record(o));
            }
            store.write(0, offsets.len() as u64);
        };
        // A new file: written whatever it holds.
        let store = Store::new(&dir, emit.clone());
        assert!(store.records(&file).unwrap().is_empty());
        for i in 0..40 {
            store.keep(&file, record(i * 16));
        }
        store.write(0, 40);
        in_files(40, 0);
        // One new record against 40: fewer than 1/32, not worth a rewrite: it goes to the
        // delta file, and the next process finds it there.
        run(&[0x1000]);
        in_files(40, 1);
        let store = Store::new(&dir, emit.clone());
        let records = store.records(&file).unwrap();
        assert!(records.contains(0x1000) && records.contains(0x10));
        assert_eq!(
            records.get(0x1000).and_then(|v| v.to_record()),
            Some(record(0x1000))
        );
        // Known already (in the delta): not kept again.
        store.keep(&file, record(0x1000));
        store.write(41, 0);
        in_files(40, 1);
        // One more: with the delta's, 2 against 40, 1/20 of the file: rewritten with the old
        // records and the delta's, and the delta file goes.
        run(&[0x1010]);
        in_files(42, 0);
        assert!(!delta_file.exists());
        let store = Store::new(&dir, emit.clone());
        let records = store.records(&file).unwrap();
        for offset in [0x10, 0x1000, 0x1010] {
            assert_eq!(
                records.get(offset).and_then(|v| v.to_record()),
                Some(record(offset))
            );
        }
        let _ = fs::remove_dir_all(&dir);
    }

    /// Writers of one store file at the same time (threads here, each with a `Store` of its
    /// own as each process has: a shell and the children it forks and execs) lose none of
    /// each other's records.
    #[test]
    fn concurrent_writers_lose_no_records() {
        const WRITERS: u64 = 4;
        const ROUNDS: u64 = 100;
        /// Records each writer adds in a round.
        const EACH: u64 = 4;
        let dir = std::env::temp_dir().join(format!("hotpath-store-race-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (emit, file) = key();
        let offset = |round: u64, writer: u64, i: u64| ((round * WRITERS + writer) * EACH + i) * 16;
        let start = std::sync::Barrier::new(WRITERS as usize);
        let mut lossy_rounds = 0;
        for round in 0..ROUNDS {
            std::thread::scope(|s| {
                for writer in 0..WRITERS {
                    let (start, emit, file) = (&start, &emit, &file);
                    let dir = &dir;
                    s.spawn(move || {
                        let store = Store::new(dir, emit.clone());
                        for i in 0..EACH {
                            store.keep(file, record(offset(round, writer, i)));
                        }
                        start.wait();
                        store.write(0, 0);
                    });
                }
            });
            let records = Store::new(&dir, emit.clone()).records(&file).unwrap();
            let lost = (0..WRITERS)
                .flat_map(|w| (0..EACH).map(move |i| (w, i)))
                .filter(|&(w, i)| !records.contains(offset(round, w, i)))
                .count();
            lossy_rounds += (lost > 0) as u64;
        }
        let records = Store::new(&dir, emit.clone()).records(&file).unwrap();
        let _ = fs::remove_dir_all(&dir);
        assert_eq!(
            (lossy_rounds, records.len() as u64),
            (0, ROUNDS * WRITERS * EACH),
            "records lost in {lossy_rounds} of {ROUNDS} rounds"
        );
    }

    /// A writer waits for a held lock at most `LOCK_WAIT`, then writes without it.
    #[test]
    fn a_held_lock_delays_a_writer_a_bounded_time() {
        let dir = std::env::temp_dir().join(format!("hotpath-store-held-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (emit, file) = key();
        let cache = CacheDir::open(&dir).unwrap();
        let name = CacheDir::file_name(&(emit.clone(), file.clone()));
        let held = cache.lock(&name).unwrap();
        assert!(cache.lock(&name).is_none(), "a held lock was taken again");
        let store = Store::new(&dir, emit.clone());
        store.keep(&file, record(0x10));
        let start = Instant::now();
        store.write(0, 0);
        let waited = start.elapsed();
        assert!(
            LOCK_WAIT <= waited && waited < LOCK_WAIT * 3,
            "waited {waited:?}"
        );
        assert_eq!(
            Store::new(&dir, emit.clone()).records(&file).unwrap().len(),
            1
        );
        drop(held);
        assert!(cache.lock(&name).is_some(), "a lock was not freed");
        let _ = fs::remove_dir_all(&dir);
    }

    /// Lock files are not store files: not counted, and removed with their store files by
    /// the size bound and by `clear`.
    #[test]
    fn lock_files_go_with_their_store_files() {
        let dir = std::env::temp_dir().join(format!("hotpath-store-locks-{}", std::process::id()));
        let _ = fs::remove_dir_all(&dir);
        let (emit, file) = key();
        let store = Store::new(&dir, emit.clone());
        store.keep(&file, record(0x10));
        store.write(0, 0);
        let mut cache = CacheDir::open(&dir).unwrap();
        let name = CacheDir::file_name(&(emit.clone(), file.clone()));
        let locks = |cache: &CacheDir| {
            fs::read_dir(cache.path())
                .unwrap()
                .flatten()
                .filter(|e| e.path().extension().is_some_and(|x| x == LOCK_SUFFIX))
                .count()
        };
        assert!(cache.lock_path(&name).is_file());
        assert_eq!(cache.summary().files, 1);
        // Over its bound: the store file goes, and its lock file with it.
        cache.limit = 0;
        cache.trim();
        assert_eq!((cache.summary().files, locks(&cache)), (0, 0));
        // `clear` removes lock files nobody holds, and leaves a held one.
        store.keep(&file, record(0x20));
        store.write(0, 0);
        let other = FileId {
            ino: 99,
            ..file.clone()
        };
        let other = CacheDir::file_name(&(emit.clone(), other));
        let held = cache.lock(&other).unwrap();
        assert_eq!((cache.summary().files, locks(&cache)), (1, 2));
        assert_eq!(cache.clear().unwrap(), 1);
        assert_eq!((cache.summary().files, locks(&cache)), (0, 1));
        drop(held);
        cache.clear().unwrap();
        assert_eq!(locks(&cache), 0);
        let _ = fs::remove_dir_all(&dir);
    }

    #[test]
    fn sizes_take_suffixes() {
        // Not through the environment: the other tests here read it (`Store::new`) meanwhile.
        assert_eq!(CacheDir::parse_limit("3M"), 3 << 20);
        assert_eq!(CacheDir::parse_limit(" 2g"), 2 << 30);
        assert_eq!(CacheDir::parse_limit("12345"), 12345);
        assert_eq!(CacheDir::parse_limit("lots"), DEFAULT_LIMIT);
    }
}
