//! The body probe benchmark inside V8, where the filter runs: this file builds as a wasm
//! module (an example with crate-type cdylib) exporting the serde probe and body_scan, and
//! `policy/examples/v8_probe.mjs` times them under node (V8). Run with
//! the commands in BENCHMARKS.md ("Body probe (policy)").

// A wasm module's exports are unmangled C functions taking the body by pointer.
#![allow(unsafe_code)]
// A failed step fails the test, with the reason: clippy.toml allows unwrap and expect in
// #[test] functions, and this in the helpers beside them.
#![allow(clippy::unwrap_used, clippy::expect_used)]

#[path = "../tests/reference/serde_probe.rs"]
mod serde_probe;

use serde_probe::model_start_and_stream as serde_probe;

fn scan_probe(body: &[u8]) -> Option<(usize, bool)> {
    let top = halo_policy::body_scan::scan(body).ok()?;
    let (start, _) = top.model?;
    Some((
        start,
        top.stream.is_some_and(|(a, b)| &body[a..b] == b"true"),
    ))
}

/// The scan fed in 64 KB pieces, as the filter feeds it while the body arrives.
fn pieces_probe(body: &[u8]) -> Option<(usize, bool)> {
    let mut scan = halo_policy::body_scan::Incremental::new();
    let mut end = 0;
    while end < body.len() {
        end = (end + 64 * 1024).min(body.len());
        scan.feed(&body[..end]).ok()?;
    }
    let top = scan.finish(body).ok()?;
    let (start, _) = top.model?;
    Some((
        start,
        top.stream.is_some_and(|(a, b)| &body[a..b] == b"true"),
    ))
}

/// A buffer of `len` bytes for the host to fill (leaked: the module lives for one run).
#[unsafe(no_mangle)]
pub extern "C" fn buffer(len: usize) -> *mut u8 {
    Vec::leak(vec![0u8; len]).as_mut_ptr()
}

/// Run probe `kind` (0 serde, 1 body_scan, 2 body_scan in 64 KB pieces) `iters` times over `len` bytes at `ptr`; 0 if
/// it refused the body, else a checksum the host ignores.
///
/// # Safety
/// `ptr..ptr + len` must be a buffer from [`buffer`].
#[unsafe(no_mangle)]
pub unsafe extern "C" fn run(kind: u32, ptr: *const u8, len: usize, iters: u32) -> u32 {
    // SAFETY: the host passes a buffer it got from `buffer` with its length.
    let body = unsafe { std::slice::from_raw_parts(ptr, len) };
    let mut acc = 0u32;
    for _ in 0..iters {
        let body = std::hint::black_box(body);
        let found = match kind {
            0 => serde_probe(body),
            1 => scan_probe(body),
            _ => pieces_probe(body),
        };
        let Some((start, stream)) = found else {
            return 0;
        };
        acc = acc.wrapping_add(start as u32 + u32::from(stream) + 1);
    }
    acc
}
