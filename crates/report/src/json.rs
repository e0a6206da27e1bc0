//! Writing a report's JSON on the machine's free cores.
//!
//! A report is written when the guest has ended, so the monitor's core is idle; serialising a
//! large one on a single core was a sixth of a short run (`python3 -c pass`: 8.3 MB, 38,000
//! blocks and 40,000 edges, 25 ms). [`write_report`] writes the same bytes as
//! `serde_json::to_writer(report)` (compact, fields in declaration order; a test holds the
//! two equal): the small fields through serde_json as they come, the three long tables
//! (blocks, edges, indirect jumps) in chunks of [`CHUNK_ROWS`] rows. The writing thread takes
//! the chunks in order and serialises each one straight into the file's buffer; helper
//! threads take the next unclaimed chunks and serialise them into buffers of their own,
//! which the writer copies out in order when it reaches them (and hands back for reuse).

use std::io::{self, Write};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{mpsc, Mutex};

use serde::Serialize;

use crate::schema::{Block, Edge, IndirectSite, Report};

/// Rows per chunk: about 300 KB of blocks (the buffers are handed back and reused, so their
/// pages fault in once), and a 38,000-block report still makes 19 chunks to share.
const CHUNK_ROWS: usize = 2048;

/// Tables shorter than this (rows over the three) are written by the calling thread alone:
/// starting a thread costs more than serialising them (a `busybox true` report has 2,000).
const PARALLEL_ROWS: usize = 4 * CHUNK_ROWS;

/// Helper threads at most, besides the writer.
const MAX_HELPERS: usize = 3;

/// One chunk: a run of rows of one table.
#[derive(Clone, Copy)]
enum Chunk<'a> {
    Blocks(&'a [Block]),
    Edges(&'a [Edge]),
    Indirect(&'a [IndirectSite]),
}

impl Chunk<'_> {
    /// The chunk's rows as JSON values separated by commas (no brackets), appended to `w`.
    fn write_rows(self, w: &mut impl Write) -> serde_json::Result<()> {
        fn rows<T: Serialize>(rows: &[T], w: &mut impl Write) -> serde_json::Result<()> {
            for (i, row) in rows.iter().enumerate() {
                if i > 0 {
                    w.write_all(b",").map_err(serde_json::Error::io)?;
                }
                serde_json::to_writer(&mut *w, row)?;
            }
            Ok(())
        }
        match self {
            Chunk::Blocks(r) => rows(r, w),
            Chunk::Edges(r) => rows(r, w),
            Chunk::Indirect(r) => rows(r, w),
        }
    }
}

/// Writes `report` as compact JSON to `w`, byte for byte what `serde_json::to_writer` writes,
/// with the long tables serialised on up to [`MAX_HELPERS`] more threads when the machine
/// lets this process run on more than one core.
///
/// # Errors
/// The first write error of `w`, or a serialisation error (none is expected: every field is
/// plain data).
pub(crate) fn write_report<W: Write>(report: &Report, w: &mut W) -> io::Result<()> {
    let rows = report.blocks.len() + report.edges.len() + report.indirect_jumps.len();
    let helpers = if rows < PARALLEL_ROWS {
        0
    } else {
        std::thread::available_parallelism().map_or(1, |n| n.get()) - 1
    };
    write_with_helpers(report, w, helpers.min(MAX_HELPERS))
}

/// [`write_report`] with `helpers` more threads (none: the calling thread alone).
fn write_with_helpers<W: Write>(report: &Report, w: &mut W, helpers: usize) -> io::Result<()> {
    let chunks = chunks(report);
    let helpers = helpers.min(chunks.len().saturating_sub(1));
    if helpers == 0 {
        return write_fields(report, w, &mut |i, w| {
            chunks[i].write_rows(w).map_err(io::Error::from)
        });
    }
    let next = AtomicUsize::new(0);
    let (done_tx, done_rx) = mpsc::channel::<(usize, serde_json::Result<Vec<u8>>)>();
    let (spare_tx, spare_rx) = mpsc::channel::<Vec<u8>>();
    let spare_rx = Mutex::new(spare_rx);
    std::thread::scope(|s| {
        for _ in 0..helpers {
            let done_tx = done_tx.clone();
            let (next, chunks, spare_rx) = (&next, &chunks, &spare_rx);
            // A helper that cannot be made (a process limit) is one fewer: the writer takes
            // every chunk nobody claims.
            let _ = std::thread::Builder::new().spawn_scoped(s, move || loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                let Some(c) = chunks.get(i) else { return };
                let mut buf = spare_buffer(spare_rx);
                let result = c.write_rows(&mut buf).map(|()| buf);
                if done_tx.send((i, result)).is_err() {
                    return;
                }
            });
        }
        drop(done_tx);
        let mut ready: Vec<Option<Vec<u8>>> = vec![None; chunks.len()];
        let result = write_fields(report, w, &mut |i, w| loop {
            // Chunk `i` is next in the file. Take what the helpers finished meanwhile.
            while let Ok((j, buf)) = done_rx.try_recv() {
                ready[j] = Some(buf?);
            }
            if let Some(buf) = ready[i].take() {
                w.write_all(&buf)?;
                let _ = spare_tx.send(buf);
                return Ok(());
            }
            // Claim the next chunk nobody has: `i` itself goes straight into the file; a later
            // one into a buffer while a helper finishes `i` (waiting instead would leave this
            // thread copying buffers and one helper serialising everything).
            let j = next.fetch_add(1, Ordering::Relaxed);
            if j == i {
                return chunks[i].write_rows(w).map_err(io::Error::from);
            }
            if let Some(c) = chunks.get(j) {
                let mut buf = spare_buffer(&spare_rx);
                c.write_rows(&mut buf)?;
                ready[j] = Some(buf);
                continue;
            }
            let (j, buf) = done_rx.recv().map_err(|_| {
                io::Error::other("a thread serialising the report ended without its rows")
            })?;
            ready[j] = Some(buf?);
        });
        // Helpers stop at the end of the chunks, or when their results have no reader.
        next.store(chunks.len(), Ordering::Relaxed);
        drop(done_rx);
        result
    })
}

/// An empty buffer: one the writer has copied out, else a new one.
fn spare_buffer(spare: &Mutex<mpsc::Receiver<Vec<u8>>>) -> Vec<u8> {
    let mut buf = spare
        .lock()
        .ok()
        .and_then(|r| r.try_recv().ok())
        .unwrap_or_default();
    buf.clear();
    buf
}

/// `report` cut into chunks of at most [`CHUNK_ROWS`] rows, in file order; an empty table
/// has none.
fn chunks(report: &Report) -> Vec<Chunk<'_>> {
    let mut out: Vec<Chunk<'_>> = report
        .blocks
        .chunks(CHUNK_ROWS)
        .map(Chunk::Blocks)
        .collect();
    out.extend(report.edges.chunks(CHUNK_ROWS).map(Chunk::Edges));
    out.extend(
        report
            .indirect_jumps
            .chunks(CHUNK_ROWS)
            .map(Chunk::Indirect),
    );
    out
}

/// Writes the report object, every field in declaration order as serde's derive does, each
/// long table's rows through `rows(chunk number, w)` called for each of its chunks in turn
/// (numbered across the tables, as [`chunks`] lists them).
fn write_fields<W: Write>(
    r: &Report,
    w: &mut W,
    rows: &mut dyn FnMut(usize, &mut W) -> io::Result<()>,
) -> io::Result<()> {
    fn field<W: Write, T: Serialize + ?Sized>(w: &mut W, key: &str, v: &T) -> io::Result<()> {
        write!(w, "\"{key}\":")?;
        serde_json::to_writer(&mut *w, v).map_err(io::Error::from)?;
        w.write_all(b",")
    }
    let counts = [
        r.blocks.len().div_ceil(CHUNK_ROWS),
        r.edges.len().div_ceil(CHUNK_ROWS),
        r.indirect_jumps.len().div_ceil(CHUNK_ROWS),
    ];
    let mut first_chunk = 0;
    let mut table_rows = |w: &mut W, t: usize, key: &str| -> io::Result<()> {
        write!(w, "\"{key}\":[")?;
        for i in 0..counts[t] {
            if i > 0 {
                w.write_all(b",")?;
            }
            rows(first_chunk + i, w)?;
        }
        first_chunk += counts[t];
        w.write_all(b"],")
    };
    w.write_all(b"{")?;
    field(w, "schema", &r.schema)?;
    field(w, "program", &r.program)?;
    field(w, "argv", &r.argv)?;
    field(w, "ending", &r.ending)?;
    field(w, "totals", &r.totals)?;
    field(w, "threads", &r.threads)?;
    table_rows(w, 0, "blocks")?;
    field(w, "modules", &r.modules)?;
    table_rows(w, 1, "edges")?;
    table_rows(w, 2, "indirect_jumps")?;
    field(w, "syscalls", &r.syscalls)?;
    field(w, "superblocks", &r.superblocks)?;
    w.write_all(b"\"path_profile\":")?;
    serde_json::to_writer(&mut *w, &r.path_profile).map_err(io::Error::from)?;
    w.write_all(b"}")
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::schema::Addr;

    /// A report with every table long enough to be cut into chunks, the last one short.
    fn long_report() -> Report {
        let mut r = crate::sample::pie_run(0x5555_5555_4000);
        let block = r.blocks[0].clone();
        let edge = r.edges[0].clone();
        let site = r.indirect_jumps[0].clone();
        for i in 0..(3 * CHUNK_ROWS + 17) as u64 {
            let mut b = block.clone();
            b.addr = Addr(b.addr.0 + 0x10_0000 + i * 16);
            b.count = i * 7 + 1;
            r.blocks.push(b);
            let mut e = edge.clone();
            e.to = Addr(e.to.0 + i);
            r.edges.push(e);
        }
        for i in 0..(CHUNK_ROWS + 3) as u64 {
            let mut s = site.clone();
            s.site = Addr(s.site.0 + 0x20_0000 + i);
            r.indirect_jumps.push(s);
        }
        r
    }

    #[test]
    fn the_parallel_writer_writes_what_serde_json_writes() {
        let short = crate::sample::pie_run(0x5555_5555_4000);
        let mut empty = short.clone();
        empty.blocks.clear();
        empty.edges.clear();
        empty.indirect_jumps.clear();
        let mut exactly = long_report();
        exactly.blocks.truncate(2 * CHUNK_ROWS);
        for r in [short, empty, long_report(), exactly] {
            let theirs = serde_json::to_string(&r).unwrap();
            for helpers in [0, 1, 3] {
                let mut ours = Vec::new();
                write_with_helpers(&r, &mut ours, helpers).unwrap();
                assert_eq!(
                    String::from_utf8(ours).unwrap(),
                    theirs,
                    "{helpers} helpers"
                );
            }
        }
    }

    /// A writer that fails after `left` bytes.
    struct Failing {
        left: usize,
    }

    impl Write for Failing {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            if buf.len() > self.left {
                return Err(io::Error::other("disk full"));
            }
            self.left -= buf.len();
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn a_write_error_ends_the_write_and_its_helpers() {
        let r = long_report();
        let whole = serde_json::to_vec(&r).unwrap().len();
        for left in [0, 100, whole / 3, whole - 1] {
            for helpers in [0, 1, 3] {
                let err = write_with_helpers(&r, &mut Failing { left }, helpers).unwrap_err();
                assert_eq!(err.to_string(), "disk full");
            }
        }
    }
}
