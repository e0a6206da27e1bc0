//! Coverage in DynamoRIO's drcov format (version 2), which Lighthouse, bncov and the other
//! coverage plugins of IDA, Binary Ninja and Ghidra load.
//!
//! The file is text up to the basic block table, then binary:
//!
//! ```text
//! DRCOV VERSION: 2
//! DRCOV FLAVOR: drcov
//! Module Table: version 2, count <modules>
//! Columns: id, base, end, entry, path
//!   0, 0x0000555555554000, 0x0000555555559000, 0x0000000000000000, /usr/bin/prog
//! BB Table: <blocks> bbs
//! <blocks × { u32 start (offset from the module's base), u16 size (bytes), u16 module id }, little-endian>
//! ```
//!
//! As DynamoRIO's drcov client writes it on Linux: one module line per mapped image (ids are
//! [`Report::modules`] indices), and each executed block once, without counts. Blocks outside
//! every module (JIT code in anonymous memory) have no module to be relative to and are left
//! out, as drcov leaves them out.

use std::io::Write;
use std::path::Path;

use crate::{Report, ReportError};

/// The flavor line's value.
pub const FLAVOR: &str = "drcov";

/// The drcov file for `r`.
pub fn render(r: &Report) -> Vec<u8> {
    let mut out = Vec::new();
    let _ = write!(
        out,
        "DRCOV VERSION: 2\nDRCOV FLAVOR: {FLAVOR}\nModule Table: version 2, count {}\nColumns: id, base, end, entry, path\n",
        r.modules.len()
    );
    for (id, m) in r.modules.iter().enumerate() {
        let _ = writeln!(
            out,
            "{id:3}, {:#018x}, {:#018x}, {:#018x}, {}",
            m.base.0,
            m.base.0 + m.size,
            0,
            m.path
        );
    }
    let blocks: Vec<[u8; 8]> = r
        .blocks
        .iter()
        .filter_map(|b| {
            let module = u16::try_from(b.module?).ok()?;
            let start = u32::try_from(b.offset?.0).ok()?;
            let size = u16::try_from(b.bytes).ok()?;
            let mut e = [0u8; 8];
            e[..4].copy_from_slice(&start.to_le_bytes());
            e[4..6].copy_from_slice(&size.to_le_bytes());
            e[6..].copy_from_slice(&module.to_le_bytes());
            Some(e)
        })
        .collect();
    let _ = writeln!(out, "BB Table: {} bbs", blocks.len());
    for e in blocks {
        out.extend_from_slice(&e);
    }
    out
}

/// Writes `r`'s drcov file to `path` (atomically, as reports are).
///
/// # Errors
/// [`ReportError::Io`].
pub fn write(r: &Report, path: &Path) -> Result<(), ReportError> {
    crate::write_atomically(path, |w| w.write_all(&render(r)))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::sample::pie_run;
    use crate::Addr;

    #[test]
    fn blocks_are_offsets_in_their_module() {
        let mut r = pie_run(0x40_0000);
        // A block in no module (JIT code) is left out.
        let mut jit = r.blocks[0].clone();
        (jit.addr, jit.module, jit.offset) = (Addr(0x9000_0000), None, None);
        r.blocks.push(jit);
        let out = render(&r);
        let text_end = out.windows(4).position(|w| w == b"bbs\n").unwrap() + 4;
        let text = std::str::from_utf8(&out[..text_end]).unwrap();
        assert!(text.ends_with("Columns: id, base, end, entry, path\n  0, 0x0000000000400000, 0x0000000000401000, 0x0000000000000000, /bin/prog\nBB Table: 4 bbs\n"), "{text}");
        let bbs = &out[text_end..];
        assert_eq!(bbs.len(), 4 * 8);
        assert_eq!(
            &bbs[..8],
            &[0x00, 0x01, 0, 0, 8, 0, 0, 0],
            "offset 0x100, 8 bytes, module 0"
        );
    }
}
