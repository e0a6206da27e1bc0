//! Golden tests of the pipeline's middle: guest bytes → IR block → host code. Each case decodes
//! a few guest instructions placed at a fixed guest address, emits them for a fixed host
//! address (monitor on and off), and compares the IR summary and the disassembly with
//! `tests/golden/<case>.txt`. `HOTPATH_BLESS=1` rewrites the files after an intended change.

use std::fmt::Write as _;
use std::path::PathBuf;

use hotpath_ir::{BlockId, GuestAddr, HostAddr};
use hotpath_translator::backend::emit::{emit_block, EmitContext};
use hotpath_translator::backend::gateway::Gateway;
use hotpath_translator::backend::jump_table;
use hotpath_translator::backend::superblock::emit_superblock;
use hotpath_translator::cache::code_cache::Exit;
use hotpath_translator::frontend::decode::decode_block;
use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};

/// Guest address every case is decoded at (mapped by the test).
const GUEST: u64 = 0x1000_0000;
/// Host address every block is emitted for (only assembled, never run).
const HOST: u64 = 0x2000_0000;
/// Host address of the cold area where the blocks' cold parts are emitted.
const COLD: u64 = HOST + 0x10_0000;
/// Ring capacity the stubs are emitted for (hotpath's default).
const RING_ENTRIES: u64 = hotpath_events::DEFAULT_RING_ENTRIES;

const GATEWAY: Gateway = Gateway {
    enter: HostAddr(HOST - 0x1000),
    exit: HostAddr(HOST - 0x0f00),
    ibl_miss: HostAddr(HOST - 0x0e00),
    ibl_empty: HostAddr(HOST - 0x0d00),
    exit_from_signal: HostAddr(HOST - 0x0c00),
};

/// Guest address of the cases that need addresses above 2^31 (a PIE program's), whose return
/// addresses do not fit a sign-extended 32-bit immediate.
const GUEST_HIGH: u64 = 0x5555_5555_0000;

/// Cases run in parallel but share the guest pages: one at a time writes and decodes them.
static GUEST_PAGE_LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());

/// The 4096-byte guest page at `at` ([`GUEST`] or [`GUEST_HIGH`]), mapped on first use.
fn guest_page(at: u64) -> &'static mut [u8] {
    use std::sync::OnceLock;
    static PAGES: [OnceLock<usize>; 2] = [OnceLock::new(), OnceLock::new()];
    let addr = *PAGES[(at == GUEST_HIGH) as usize].get_or_init(|| {
        // SAFETY: a fresh private mapping at an address nothing else in the test uses.
        let p = unsafe {
            libc::mmap(
                at as *mut libc::c_void,
                4096,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED_NOREPLACE,
                -1,
                0,
            )
        };
        assert_eq!(p as u64, at, "could not map the guest page");
        p as usize
    });
    // SAFETY: the page is mapped for the whole test run; cases run one after another.
    unsafe { std::slice::from_raw_parts_mut(addr as *mut u8, 4096) }
}

fn disassemble(code: &[u8], at: u64) -> String {
    let mut out = String::new();
    let mut f = IntelFormatter::new();
    for inst in Decoder::with_ip(64, code, at, DecoderOptions::NONE) {
        let mut text = String::new();
        f.format(&inst, &mut text);
        writeln!(out, "  {:x}  {text}", inst.ip()).unwrap();
    }
    out
}

fn render(name: &str, bytes: &[u8], guest: u64) -> String {
    let _guard = GUEST_PAGE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let page = guest_page(guest);
    page.fill(0xcc);
    page[..bytes.len()].copy_from_slice(bytes);
    let block = decode_block(GuestAddr(guest));
    let mut out = format!(
        "# {name}\nterminator: {:?}\nbody instructions: {}\nguest bytes: {}\n",
        block.terminator,
        block.body.len(),
        block.len_bytes
    );
    for enqueue in [Some(RING_ENTRIES), None] {
        let cx = EmitContext {
            enqueue,
            gateway: GATEWAY,
            jump_table: None,
            cold: Some(HostAddr(COLD)),
        };
        let e = emit_block(&block, BlockId(7), HostAddr(HOST), 0, &cx).expect("emits");
        writeln!(
            out,
            "\n## monitor {} (entry {:#x}, {} exits)",
            if enqueue.is_some() { "on" } else { "off" },
            e.entry.0,
            e.exits.len()
        )
        .unwrap();
        out.push_str(&disassemble(&e.code, HOST));
        push_cold(&mut out, &e.cold);
    }
    // A `switch`'s dispatch: also as a jump-table site, with one index's stub.
    if let Some(p) = jump_table::pattern(&block) {
        let cx = EmitContext {
            enqueue: Some(RING_ENTRIES),
            gateway: GATEWAY,
            jump_table: Some(3),
            cold: Some(HostAddr(COLD)),
        };
        let (e, site) = jump_table::emit_block(&block, &p, BlockId(7), HostAddr(HOST), 0, &cx, 3)
            .expect("emits");
        writeln!(
            out,
            "\n## monitor on, jump-table site 3 (entry {:#x}, {} exits, fill stub {:#x})",
            e.entry.0,
            e.exits.len(),
            site.fill.0
        )
        .unwrap();
        out.push_str(&disassemble(&e.code, HOST));
        push_cold(&mut out, &e.cold);
        let jmp_at = GuestAddr(block.term_inst.as_ref().expect("a jmp").inst.ip());
        let stub_at = HOST + 0x1000;
        let (code, exit, _) = jump_table::emit_index_stub(
            &site.dispatch,
            HostAddr(stub_at),
            GuestAddr(guest + 0x40),
            block.start,
            jmp_at,
            1,
            GATEWAY.exit.0 as usize,
            BlockId(7),
        )
        .expect("emits");
        writeln!(
            out,
            "\n## an index's stub (for a case that reads rX or the flags first): {:?}",
            exit.kind
        )
        .unwrap();
        out.push_str(&disassemble(&code, stub_at));
    }
    out
}

/// Appends the disassembly of a block's cold part (at [`COLD`]), if it has one.
fn push_cold(out: &mut String, cold: &[u8]) {
    if !cold.is_empty() {
        writeln!(out, "cold part:").unwrap();
        out.push_str(&disassemble(cold, COLD));
    }
}

/// A superblock over the blocks starting at the guest offsets `trace` (of the same code, at
/// guest address `guest`).
fn render_trace(name: &str, bytes: &[u8], guest: u64, trace: &[u64]) -> String {
    let _guard = GUEST_PAGE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    let page = guest_page(guest);
    page.fill(0xcc);
    page[..bytes.len()].copy_from_slice(bytes);
    let blocks: Vec<_> = trace
        .iter()
        .map(|&off| decode_block(GuestAddr(guest + off)))
        .collect();
    let mut out = format!(
        "# {name}
"
    );
    for b in &blocks {
        writeln!(out, "block {}: {:?}", b.start, b.terminator).unwrap();
    }
    {
        let cx = EmitContext {
            enqueue: Some(RING_ENTRIES),
            gateway: GATEWAY,
            jump_table: None,
            cold: Some(HostAddr(COLD)),
        };
        let e = emit_superblock(&blocks, BlockId(7), HostAddr(HOST), 0, &cx).expect("emits");
        writeln!(
            out,
            "\n## superblock 7 (entry {:#x}, {} exits, {} layouts)",
            e.entry.0,
            e.exits.len(),
            e.layouts.len()
        )
        .unwrap();
        for x in &e.exits {
            writeln!(out, "exit: {:?}", x.kind).unwrap();
        }
        for l in &e.layouts {
            writeln!(
                out,
                "layout: host {:#x}..{:#x} guest {:#x}, {} body instructions, side exit {:?}",
                l.code_start,
                l.code_end,
                l.guest_start,
                l.body.len(),
                l.trace_exit
            )
            .unwrap();
        }
        out.push_str(&disassemble(&e.code, HOST));
        push_cold(&mut out, &e.cold);
    }
    out
}

fn check(name: &str, bytes: &[u8]) {
    compare_golden(name, render(name, bytes, GUEST));
}

fn compare_golden(name: &str, got: String) {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/golden")
        .join(format!("{name}.txt"));
    if std::env::var_os("HOTPATH_BLESS").is_some() {
        std::fs::write(&path, &got).unwrap();
        return;
    }
    let want = std::fs::read_to_string(&path).unwrap_or_else(|e| {
        panic!(
            "{}: {e} (run with HOTPATH_BLESS=1 to create it)",
            path.display()
        )
    });
    assert_eq!(
        got,
        want,
        "{name}: emitted code differs from {} (HOTPATH_BLESS=1 refreshes it)",
        path.display()
    );
}

#[test]
fn conditional_branch_loop() {
    // add rax, 1 ; cmp rax, rdi ; jb back to the add
    check(
        "jcc_loop",
        &[0x48, 0x83, 0xc0, 0x01, 0x48, 0x39, 0xf8, 0x72, 0xf6],
    );
}

#[test]
fn direct_call_pushes_guest_return_address() {
    // mov edi, 5 ; call +0x100
    check("call", &[0xbf, 0x05, 0, 0, 0, 0xe8, 0x00, 0x01, 0, 0]);
}

#[test]
fn return_goes_through_the_lookup() {
    // pop rbx ; ret 16
    check("ret_imm", &[0x5b, 0xc2, 0x10, 0x00]);
}

#[test]
fn indirect_jump_goes_through_the_lookup() {
    // pop rcx ; jmp rcx (a `ret` by hand)
    check("jmp_reg", &[0x59, 0xff, 0xe1]);
}

#[test]
fn jump_through_a_register_looks_the_target_up_in_place() {
    // movslq rax, [r8 + rax*4] ; add rax, r8 ; jmp rax (a `switch`'s jump table): the lookup
    // borrows RCX alone and reads the target from RAX.
    check(
        "jmp_table",
        &[0x49, 0x63, 0x04, 0x80, 0x4c, 0x01, 0xc0, 0xff, 0xe0],
    );
}

#[test]
fn rip_relative_operands_keep_their_guest_target() {
    // lea rcx, [rip] ; mov rax, [rip + 0x100] ; call [rip + 0x200]
    check(
        "rip_relative",
        &[
            0x48, 0x8d, 0x0d, 0, 0, 0, 0, 0x48, 0x8b, 0x05, 0x00, 0x01, 0, 0, 0xff, 0x15, 0x00,
            0x02, 0, 0,
        ],
    );
}

#[test]
fn syscall_and_trap_exit_to_the_dispatcher() {
    // mov eax, 39 ; syscall
    check("syscall", &[0xb8, 39, 0, 0, 0, 0x0f, 0x05]);
    // ud2
    check("ud2", &[0x0f, 0x0b]);
}

#[test]
fn loop_instruction_keeps_its_rcx_semantics() {
    // dec rdx ; loop back to the dec
    check("loop", &[0x48, 0xff, 0xca, 0xe2, 0xfb]);
}

#[test]
fn superblock_unrolls_a_loop_with_side_exits() {
    // add rax, 1 ; cmp rax, rdi ; jb back to the add: three copies, the branch inverted in
    // the first two (exit on not-below), the last one's exits chained as in a basic block.
    compare_golden(
        "superblock_loop",
        render_trace(
            "superblock_loop",
            &[0x48, 0x83, 0xc0, 0x01, 0x48, 0x39, 0xf8, 0x72, 0xf7],
            GUEST,
            &[0, 0, 0],
        ),
    );
}

/// 0x00: mov edi, 5 ; call 0x20
/// 0x0a: add edi, 3 ; jmp 0x00
/// 0x20: add edi, 2 ; ret
fn call_and_return_code() -> Vec<u8> {
    let mut code = vec![
        0xbf, 0x05, 0, 0, 0, 0xe8, 0x16, 0, 0, 0, 0x83, 0xc7, 0x03, 0xeb, 0xf1,
    ];
    code.resize(0x20, 0xcc);
    code.extend([0x83, 0xc7, 0x02, 0xc3]);
    code
}

#[test]
fn superblock_inlines_a_call_and_its_return() {
    // Trace 0x00, 0x20, 0x0a of `call_and_return_code`: the call pushes the guest return
    // address and falls into the callee; the `ret` compares [rsp] with 0x0a (a mismatch leaves
    // through side exit 1 and the lookup) and falls into the return site.
    let code = call_and_return_code();
    compare_golden(
        "superblock_call",
        render_trace("superblock_call", &code, GUEST, &[0, 0x20, 0x0a]),
    );
}

#[test]
fn calls_and_returns_above_2_gib_use_64_bit_constants() {
    // The code of `superblock_inlines_a_call_and_its_return` at a PIE program's address: the
    // return address is pushed as two 32-bit halves (`push imm32` would sign-extend it) and
    // the return compares through RAX holding the 64-bit constant.
    let code = call_and_return_code();
    compare_golden("call_high", render("call_high", &code, GUEST_HIGH));
    compare_golden(
        "superblock_call_high",
        render_trace("superblock_call_high", &code, GUEST_HIGH, &[0, 0x20, 0x0a]),
    );
}

/// Asserts that every chainable direct exit of `exits` (code emitted for host address `base`)
/// has its rel32 4-byte aligned right after a `jmp` (`e9`) or `jcc` (`0f 8x`) opcode.
/// Checks the direct exits' patch sites of code emitted at `base` with its cold part `cold` at
/// `cold_base`.
fn assert_patch_sites_aligned(
    what: &str,
    (code, base): (&[u8], u64),
    (cold, cold_base): (&[u8], u64),
    exits: &[Exit],
) {
    for x in exits {
        if let Some((site, _)) = x.kind.link_site() {
            assert_eq!(
                site.0 % 4,
                0,
                "{what} at {base:#x}: rel32 at {site} not aligned"
            );
            let (code, base) = match site.0 >= cold_base && site.0 < cold_base + cold.len() as u64 {
                true => (cold, cold_base),
                false => (code, base),
            };
            let off = (site.0 - base) as usize;
            let is_jmp = code[off - 1] == 0xe9;
            let is_jcc = code[off - 2] == 0x0f && code[off - 1] & 0xf0 == 0x80;
            assert!(
                is_jmp || is_jcc,
                "{what}: {site} does not follow a branch opcode"
            );
        }
    }
}

#[test]
fn direct_exit_displacements_are_4_byte_aligned_at_any_host_address() {
    // Another thread unlinks a thread's direct exits while that thread may be running them
    // (`kick`): a displacement that crossed a cache line could be fetched half patched. Each
    // case (a block, and a superblock over the guest offsets given) is emitted at the four
    // host addresses modulo 4.
    let cases: [(&str, Vec<u8>, u64, &[u64]); 4] = [
        (
            "jcc",
            vec![0x48, 0x83, 0xc0, 0x01, 0x48, 0x39, 0xf8, 0x72, 0xf7],
            GUEST,
            &[0, 0, 0],
        ),
        (
            "call",
            vec![0xbf, 0x05, 0, 0, 0, 0xe8, 0x00, 0x01, 0, 0],
            GUEST,
            &[],
        ),
        ("loop", vec![0x48, 0xff, 0xca, 0xe2, 0xfb], GUEST, &[]),
        (
            "call_high",
            call_and_return_code(),
            GUEST_HIGH,
            &[0, 0x20, 0x0a],
        ),
    ];
    let _guard = GUEST_PAGE_LOCK.lock().unwrap_or_else(|e| e.into_inner());
    for (name, bytes, guest, trace) in &cases {
        let page = guest_page(*guest);
        page.fill(0xcc);
        page[..bytes.len()].copy_from_slice(bytes);
        for skew in 0..4u64 {
            let base = HOST + skew;
            for enqueue in [Some(RING_ENTRIES), None] {
                let cx = EmitContext {
                    enqueue,
                    gateway: GATEWAY,
                    jump_table: None,
                    cold: Some(HostAddr(COLD + 3 - skew)),
                };
                let block = decode_block(GuestAddr(*guest));
                let e = emit_block(&block, BlockId(7), HostAddr(base), 0, &cx).expect("emits");
                assert_patch_sites_aligned(
                    name,
                    (&e.code, base),
                    (&e.cold, COLD + 3 - skew),
                    &e.exits,
                );
                if trace.is_empty() || enqueue.is_none() {
                    continue;
                }
                let blocks: Vec<_> = trace
                    .iter()
                    .map(|&o| decode_block(GuestAddr(*guest + o)))
                    .collect();
                let sb =
                    emit_superblock(&blocks, BlockId(7), HostAddr(base), 0, &cx).expect("emits");
                assert_patch_sites_aligned(
                    name,
                    (&sb.code, base),
                    (&sb.cold, COLD + 3 - skew),
                    &sb.exits,
                );
            }
        }
    }
}
