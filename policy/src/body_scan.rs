//! body_scan: one strict pass over a JSON request body that finds the top-level `"model"`
//! and `"stream"` values and nothing else.
//!
//! Why it exists: the wasm filter reads every model call's body in full (coding tools send
//! whole conversations, often a megabyte) and needs only two top-level fields, plus the byte
//! span of `model` for the alias splice. The serde decode it replaces (which skipped every
//! other field) was the largest piece of the filter's CPU at 1 MB. This scanner walks the
//! bytes once with no allocation. String contents are skipped with a bitmap of the `"`,
//! `\` and control bytes of each 64-byte window (16 bytes per vector step with wasm
//! simd128 or SSE2; 8-byte words elsewhere), so a short string ends with a bit lookup:
//! about twice serde's speed natively and in V8 (figures: BENCHMARKS.md, "Body probe
//! (policy)"; the V8 runs: docs/design/policy.md). What remains is per token.
//!
//! It must not be laxer than serde_json, because the gateway and the provider have to read
//! the same document: a body one lenient parser reads differently from another could carry
//! a model past the allowlist. So it accepts exactly what the previous
//! `serde_json::from_slice` probe (model and stream as `&RawValue`, every other field
//! `IgnoredAny`) accepted, with one deliberate exception where it is stricter (the last):
//!
//! - RFC 8259 grammar as serde_json 1.0.154 reads it: whitespace is space, tab, CR and LF
//!   only; `true`/`false`/`null`; numbers `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?`
//!   (any magnitude: skipped numbers are never converted); strings refuse raw control
//!   characters (bytes below 0x20) and every escape but `\" \\ \/ \b \f \n \r \t \uXXXX`;
//!   no trailing commas; nothing but whitespace after the object.
//! - Skipped strings are not checked for UTF-8 and their `\u` escapes may be lone
//!   surrogates (serde's `ignore_str` does the same: JSON's structure is ASCII, so an
//!   invalid byte inside a string cannot move a string boundary for any parser).
//! - Top-level keys are decoded like serde's field identifiers: UTF-8 checked, and a key
//!   with a backslash is decoded with serde_json (so lone surrogates are refused and
//!   `"mod\u0065l"` is `model`). A second `model` or `stream`, however spelled, is refused.
//! - The `model` and `stream` values are UTF-8 checked (as serde's `RawValue` is).
//! - Stricter: nesting deeper than [`MAX_DEPTH`] containers is refused. serde's
//!   `IgnoredAny` skips any depth; a provider decoding the body into a tree typically stops
//!   at 128 (serde_json's `Value` does), and refusing here keeps the scanner's stack a
//!   fixed array.
//!
//! [`Incremental`] is the same scan for a body that arrives in pieces (the wasm filter gets
//! Envoy's body chunk by chunk): it resumes where the last piece ended, inside a string
//! too, so scanning overlaps the upload and only the last piece's scan is on the request's
//! latency. It refuses as soon as a prefix cannot become valid. It is a second copy of the
//! grammar, not `scan`'s replacement: shaped as a resumable loop it runs 15-20% more
//! instructions per byte than `scan` (callgrind, natively; about 1.1x the time in V8), and
//! one-shot callers should not pay that.
//!
//! `policy/tests/body_scan.rs` checks all of this against serde_json itself on generated
//! documents and their mutations, and [`Incremental`] against `scan` on the same bodies
//! fed byte by byte and cut at random points.

use std::fmt;

/// The deepest nesting accepted, counting the top-level object as 1: serde_json's
/// recursion limit for a `Value` (it refuses the 128th nested container).
pub const MAX_DEPTH: u32 = 127;

/// Where the top-level fields admit reads sit in the body: `body[start..end]` is the raw
/// JSON value (no surrounding whitespace).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TopLevel {
    pub model: Option<(usize, usize)>,
    pub stream: Option<(usize, usize)>,
}

/// Why a body was refused. The message names the problem and a byte offset, never content.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ScanError {
    /// The first non-whitespace byte is not `{` (or the body is empty).
    NotAnObject,
    /// Not valid JSON (or a duplicated top-level `model`/`stream`) at byte `at`.
    Invalid { at: usize, what: &'static str },
}

impl fmt::Display for ScanError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            ScanError::NotAnObject => f.write_str("the request body is not a JSON object"),
            ScanError::Invalid { at, what } => {
                write!(f, "the request body is not valid JSON: {what} at byte {at}")
            }
        }
    }
}

impl std::error::Error for ScanError {}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Key {
    Model,
    Stream,
    Other,
}

/// Scan `body`, which must be one JSON object, and locate its top-level `model` and `stream`.
pub fn scan(body: &[u8]) -> Result<TopLevel, ScanError> {
    let mut s = Scanner {
        b: body,
        specials: Specials::NONE,
        i: 0,
        at: 0,
        what: "",
    };
    s.skip_ws();
    if s.peek() != Some(b'{') {
        return Err(ScanError::NotAnObject);
    }
    s.i += 1;
    s.object().map_err(|Stop| ScanError::Invalid {
        at: s.at,
        what: s.what,
    })
}

/// Which top-level field a key (quotes included, already scanned) names. Only a key with a
/// backslash is decoded; others are compared as bytes and checked for UTF-8, as serde's
/// field identifier does.
fn top_level_key(raw: &[u8], escaped: bool) -> Result<Key, &'static str> {
    let name = |k: &[u8]| match k {
        b"model" => Key::Model,
        b"stream" => Key::Stream,
        _ => Key::Other,
    };
    if escaped {
        let decoded = serde_json::from_slice::<String>(raw).map_err(|_| "invalid key string")?;
        return Ok(name(decoded.as_bytes()));
    }
    let inner = &raw[1..raw.len() - 1];
    std::str::from_utf8(inner).map_err(|_| "invalid UTF-8 in a key")?;
    Ok(name(inner))
}

struct Scanner<'a> {
    b: &'a [u8],
    specials: Specials,
    i: usize,
    /// Where and why the scan stopped (set by [`Scanner::err`]).
    at: usize,
    what: &'static str,
}

/// The scan stopped on invalid input; the scanner holds where and why. Zero-sized, so a
/// `Result<T, Stop>` travels in registers (in wasm too) on the hot path.
struct Stop;

#[inline(always)]
fn is_special(c: u8) -> bool {
    c == b'"' || c == b'\\' || c < 0x20
}

/// The index of the first `"`, `\` or control byte at or after `i`, or `b.len()`.
#[inline(always)]
/// The length of the plain run `bytes` starts with: the index of its first `"`, `\` or
/// control byte (below 0x20), or its length. Where a JSON string's content may end, found
/// with the scanner's own vector skip: for other readers of JSON text (the usage meter
/// skips an answer's strings with it).
pub fn plain_run(bytes: &[u8]) -> usize {
    skip_plain(bytes, 0)
}

fn skip_plain(b: &[u8], i: usize) -> usize {
    let rest = &b[i..];
    // An empty string or back-to-back escapes: no loop setup.
    match rest.first() {
        Some(&c) if is_special(c) => return i,
        None => return i,
        _ => {}
    }
    let mut chunks = rest.chunks_exact(CHUNK);
    let mut at = i;
    for chunk in chunks.by_ref() {
        let m = chunk_specials(chunk);
        if m != 0 {
            return at + m.trailing_zeros() as usize / BITS_PER_BYTE;
        }
        at += CHUNK;
    }
    let tail = chunks.remainder();
    at + tail
        .iter()
        .position(|&c| is_special(c))
        .unwrap_or(tail.len())
}

/// The bytes a window covers: one bit each in a `u64`.
const WINDOW: usize = 64;

/// The `"`, `\` and control bytes of one 64-byte window of the body, one bit per byte.
///
/// Why: in a conversation most strings are short (`"role"`, `"user"`, keys) and several
/// start and end inside one window, so finding a string's end is a shift and a bit count
/// on bits already computed, not a fresh 16-byte load and compare per string. Only
/// whole windows are classified; the last bytes of the input (fewer than 64) go through
/// [`skip_plain`]. Bits are exact: no byte is flagged that is not special.
#[derive(Debug, Clone, Copy)]
struct Specials {
    /// The body index of the window's first byte. Before the first window it is past any
    /// index a slice can have (slices hold at most `isize::MAX` bytes), so no `i` is in it.
    start: usize,
    bits: u64,
}

impl Specials {
    const NONE: Specials = Specials {
        start: usize::MAX / 2 + 1,
        bits: 0,
    };

    /// The index of the first `"`, `\` or control byte at or after `i`, or `b.len()`.
    /// `b` may have grown since the last call, but bytes it had must not have changed.
    #[inline(always)]
    fn next(&mut self, b: &[u8], mut i: usize) -> usize {
        loop {
            let offset = i.wrapping_sub(self.start);
            if offset < WINDOW {
                let ahead = self.bits >> offset;
                if ahead != 0 {
                    return i + ahead.trailing_zeros() as usize;
                }
                i = self.start + WINDOW;
            }
            match b.get(i..i + WINDOW) {
                Some(window) => {
                    self.start = i;
                    self.bits = window_specials(window.try_into().unwrap_or(&[0; WINDOW]));
                }
                None => return skip_plain(b, i),
            }
        }
    }
}

#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
use simd128::{BITS_PER_BYTE, CHUNK, chunk_specials, window_specials};
#[cfg(target_arch = "x86_64")]
use sse2::{BITS_PER_BYTE, CHUNK, chunk_specials, window_specials};
#[cfg(not(any(
    all(target_arch = "wasm32", target_feature = "simd128"),
    target_arch = "x86_64"
)))]
use swar::{BITS_PER_BYTE, CHUNK, chunk_specials, window_specials};

/// wasm with simd128 (the filter's build): 16 bytes per step, three compares and a bitmask,
/// which V8 maps to SSE/NEON. Measured 2.5x faster than the word loop on long strings there.
#[cfg(all(target_arch = "wasm32", target_feature = "simd128"))]
#[allow(
    unsafe_code,
    reason = "the SIMD scanner: vector loads of a fixed-size window, each block says why it is in bounds"
)]
mod simd128 {
    use core::arch::wasm32::*;

    pub const CHUNK: usize = 16;
    pub const BITS_PER_BYTE: usize = 1;

    /// One bit per byte of `v` that is `"`, `\` or below 0x20.
    #[inline(always)]
    fn specials(v: v128) -> u32 {
        let m = v128_or(
            v128_or(
                u8x16_eq(v, u8x16_splat(b'"')),
                u8x16_eq(v, u8x16_splat(b'\\')),
            ),
            u8x16_lt(v, u8x16_splat(0x20)),
        );
        u32::from(u8x16_bitmask(m))
    }

    /// One bit per byte of a 16-byte chunk that is `"`, `\` or below 0x20.
    #[inline(always)]
    pub fn chunk_specials(chunk: &[u8]) -> u32 {
        let word = |k: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&chunk[k..k + 8]);
            u64::from_le_bytes(w)
        };
        // Two 8-byte loads make the vector without an unsafe v128_load.
        specials(u64x2(word(0), word(8)))
    }

    /// [`chunk_specials`] of a window's four chunks, loaded whole.
    #[inline(always)]
    pub fn window_specials(window: &[u8; super::WINDOW]) -> u64 {
        let mut bits = 0u64;
        for k in 0..super::WINDOW / CHUNK {
            // SAFETY: bytes 16k..16k+16 of a 64-byte array (k < 4); v128_load has no
            // alignment requirement.
            let v = unsafe { v128_load(window.as_ptr().add(k * CHUNK).cast()) };
            bits |= u64::from(specials(v)) << (k * CHUNK);
        }
        bits
    }
}

/// Native x86_64 (SSE2 is part of the baseline): the same 16-byte step. The word loop
/// below ran out of registers for its four constants there.
#[cfg(target_arch = "x86_64")]
#[allow(
    unsafe_code,
    reason = "the SIMD scanner: SSE2 intrinsics on a fixed-size window, each block says why it is sound"
)]
mod sse2 {
    use core::arch::x86_64::*;

    pub const CHUNK: usize = 16;
    pub const BITS_PER_BYTE: usize = 1;

    /// One bit per byte of `v` that is `"`, `\` or below 0x20.
    #[inline(always)]
    fn specials(v: __m128i) -> u32 {
        // SAFETY: register-only SSE2 intrinsics (no memory access), and SSE2 is part of the
        // x86_64 baseline, so every x86_64 CPU has them.
        unsafe {
            // Unsigned `v < 0x20` is `max(v, 0x1f) == 0x1f`.
            let low = _mm_set1_epi8(0x1f);
            let ctrl = _mm_cmpeq_epi8(_mm_max_epu8(v, low), low);
            let quote = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'"' as i8));
            let backslash = _mm_cmpeq_epi8(v, _mm_set1_epi8(b'\\' as i8));
            let m = _mm_or_si128(_mm_or_si128(ctrl, quote), backslash);
            _mm_movemask_epi8(m) as u32
        }
    }

    #[inline(always)]
    pub fn chunk_specials(chunk: &[u8]) -> u32 {
        let word = |k: usize| {
            let mut w = [0u8; 8];
            w.copy_from_slice(&chunk[k..k + 8]);
            i64::from_le_bytes(w)
        };
        // SAFETY: register-only, as above.
        specials(unsafe { _mm_set_epi64x(word(8), word(0)) })
    }

    /// [`chunk_specials`] of a window's four chunks, loaded whole.
    #[inline(always)]
    pub fn window_specials(window: &[u8; super::WINDOW]) -> u64 {
        let mut bits = 0u64;
        for k in 0..super::WINDOW / CHUNK {
            // SAFETY: bytes 16k..16k+16 of a 64-byte array (k < 4); the load is unaligned.
            let v = unsafe { _mm_loadu_si128(window.as_ptr().add(k * CHUNK).cast()) };
            bits |= u64::from(specials(v)) << (k * CHUNK);
        }
        bits
    }
}

/// Everywhere else: 8 bytes per step in a u64 (SWAR), as serde_json's own string skip does.
/// Compiled for tests everywhere, so x86_64 runs check it too.
#[cfg(any(
    test,
    not(any(
        all(target_arch = "wasm32", target_feature = "simd128"),
        target_arch = "x86_64"
    ))
))]
#[cfg_attr(test, allow(dead_code))]
mod swar {
    pub const CHUNK: usize = 8;
    pub const BITS_PER_BYTE: usize = 8;

    const ONES: u64 = u64::MAX / 255;
    const HIGHS: u64 = ONES << 7;
    const LOW7: u64 = ONES * 0x7f;

    /// One flag (the byte's high bit) per byte of `w` that is `"`, `\` or below 0x20, exact
    /// for every byte (no borrow crosses a byte: each sum stays below 0x100).
    #[inline(always)]
    pub fn specials(w: u64) -> u64 {
        let zero = |y: u64| !(((y & LOW7) + LOW7) | y) & HIGHS;
        let ctrl = !(((w & LOW7) + ONES * (0x80 - 0x20)) | w) & HIGHS;
        ctrl | zero(w ^ (ONES * u64::from(b'"'))) | zero(w ^ (ONES * u64::from(b'\\')))
    }

    #[inline(always)]
    fn word(chunk: &[u8]) -> u64 {
        let mut w = [0u8; 8];
        w.copy_from_slice(chunk);
        u64::from_le_bytes(w)
    }

    #[inline(always)]
    pub fn chunk_specials(chunk: &[u8]) -> u64 {
        specials(word(chunk))
    }

    /// One bit per byte (bit k for byte k): the flags gathered by a multiply, each byte's
    /// flag landing in the top byte at its own place, with no carries between them.
    #[inline(always)]
    pub fn chunk_bits(chunk: &[u8]) -> u8 {
        (specials(word(chunk)).wrapping_mul(0x0002_0408_1020_4081) >> 56) as u8
    }

    /// One bit per byte of the window (bit k for byte k).
    #[inline(always)]
    pub fn window_specials(window: &[u8; super::WINDOW]) -> u64 {
        window
            .chunks_exact(CHUNK)
            .enumerate()
            .fold(0, |bits, (k, c)| {
                bits | u64::from(chunk_bits(c)) << (k * CHUNK)
            })
    }
}

impl Scanner<'_> {
    #[inline(always)]
    fn peek(&self) -> Option<u8> {
        self.b.get(self.i).copied()
    }

    /// Inlined on purpose: a call taking `&mut self` would pin the scanner in memory (in
    /// wasm, linear memory) instead of registers on the hot path.
    #[inline(always)]
    fn err(&mut self, what: &'static str) -> Stop {
        self.at = self.i;
        self.what = what;
        Stop
    }

    /// The top-level object after its `{`: every key checked for `model` and `stream`.
    fn object(&mut self) -> Result<TopLevel, Stop> {
        let body = self.b;
        let mut out = TopLevel::default();
        self.skip_ws();
        if self.peek() == Some(b'}') {
            self.i += 1;
        } else {
            loop {
                if self.peek() != Some(b'"') {
                    return Err(self.err("expected a string key"));
                }
                let key_start = self.i;
                self.i += 1;
                let escaped = self.string()?;
                let key = match top_level_key(&body[key_start..self.i], escaped) {
                    Ok(key) => key,
                    Err(what) => {
                        self.i = key_start;
                        return Err(self.err(what));
                    }
                };
                self.colon()?;
                let start = self.i;
                self.value()?;
                let slot = match key {
                    Key::Model => Some(&mut out.model),
                    Key::Stream => Some(&mut out.stream),
                    Key::Other => None,
                };
                if let Some(slot) = slot {
                    if slot.is_some() {
                        self.i = key_start;
                        return Err(self.err(if key == Key::Model {
                            "duplicate field \"model\""
                        } else {
                            "duplicate field \"stream\""
                        }));
                    }
                    if std::str::from_utf8(&body[start..self.i]).is_err() {
                        self.i = start;
                        return Err(self.err("invalid UTF-8"));
                    }
                    *slot = Some((start, self.i));
                }
                self.skip_ws();
                match self.peek() {
                    Some(b',') => {
                        self.i += 1;
                        self.skip_ws();
                    }
                    Some(b'}') => {
                        self.i += 1;
                        break;
                    }
                    Some(_) => return Err(self.err("expected ',' or '}'")),
                    None => return Err(self.err("end of input inside the object")),
                }
            }
        }
        self.skip_ws();
        if self.i != body.len() {
            return Err(self.err("trailing characters"));
        }
        Ok(out)
    }

    #[inline(always)]
    fn skip_ws(&mut self) {
        // Compact JSON has no whitespace: one compare settles it.
        if self.b.get(self.i).is_some_and(|&c| c > b' ') {
            return;
        }
        while let Some(b' ' | b'\n' | b'\r' | b'\t') = self.peek() {
            self.i += 1;
        }
    }

    /// After a key: whitespace, `:`, whitespace.
    #[inline(always)]
    fn colon(&mut self) -> Result<(), Stop> {
        self.skip_ws();
        if self.peek() != Some(b':') {
            return Err(self.err("expected ':'"));
        }
        self.i += 1;
        self.skip_ws();
        Ok(())
    }

    /// The rest of a string whose opening quote is consumed; leaves `i` after the closing
    /// quote. Returns whether it had an escape.
    #[inline(always)]
    fn string(&mut self) -> Result<bool, Stop> {
        let b = self.b;
        let mut i = self.i;
        let mut escaped = false;
        loop {
            i = self.specials.next(b, i);
            match b.get(i) {
                Some(b'"') => {
                    self.i = i + 1;
                    return Ok(escaped);
                }
                Some(b'\\') => {
                    escaped = true;
                    i = self.escape(i + 1)?;
                }
                Some(&c) if c < 0x20 => {
                    self.i = i;
                    return Err(self.err("control character in a string"));
                }
                Some(_) => i += 1,
                None => {
                    self.i = i;
                    return Err(self.err("end of input inside a string"));
                }
            }
        }
    }

    /// The escape after a backslash at `i - 1`; returns the index after it.
    #[inline]
    fn escape(&mut self, i: usize) -> Result<usize, Stop> {
        match self.b.get(i) {
            Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => Ok(i + 1),
            Some(b'u') => match self.b.get(i + 1..i + 5) {
                Some(hex) if hex.iter().all(u8::is_ascii_hexdigit) => Ok(i + 5),
                Some(_) => {
                    self.i = i;
                    Err(self.err("invalid \\u escape"))
                }
                None => {
                    self.i = self.b.len();
                    Err(self.err("end of input inside a string"))
                }
            },
            Some(_) => {
                self.i = i;
                Err(self.err("invalid escape"))
            }
            None => {
                self.i = i;
                Err(self.err("end of input inside a string"))
            }
        }
    }

    #[inline]
    fn literal(&mut self, word: &'static [u8]) -> Result<(), Stop> {
        if self.b.get(self.i..self.i + word.len()) == Some(word) {
            self.i += word.len();
            Ok(())
        } else {
            Err(self.err("invalid literal"))
        }
    }

    #[inline]
    fn digits(&mut self) -> usize {
        let start = self.i;
        while let Some(b'0'..=b'9') = self.peek() {
            self.i += 1;
        }
        self.i - start
    }

    fn number(&mut self) -> Result<(), Stop> {
        if self.peek() == Some(b'-') {
            self.i += 1;
        }
        match self.peek() {
            Some(b'0') => {
                self.i += 1;
                if let Some(b'0'..=b'9') = self.peek() {
                    return Err(self.err("invalid number (leading zero)"));
                }
            }
            Some(b'1'..=b'9') => {
                self.digits();
            }
            _ => return Err(self.err("invalid number")),
        }
        if self.peek() == Some(b'.') {
            self.i += 1;
            if self.digits() == 0 {
                return Err(self.err("invalid number (no digit after '.')"));
            }
        }
        if let Some(b'e' | b'E') = self.peek() {
            self.i += 1;
            if let Some(b'+' | b'-') = self.peek() {
                self.i += 1;
            }
            if self.digits() == 0 {
                return Err(self.err("invalid number (no exponent digit)"));
            }
        }
        Ok(())
    }

    /// One value starting at `i` (whitespace already skipped), inside the top-level object
    /// (depth 1). `is_object[d]`: whether the open container at relative depth `d` is an
    /// object (a fixed array: no allocation, and the depth limit bounds it).
    fn value(&mut self) -> Result<(), Stop> {
        let mut is_object = [false; MAX_DEPTH as usize];
        let mut depth: usize = 0;
        loop {
            // A value is expected at `i`.
            let opened = match self.peek() {
                Some(b'"') => {
                    self.i += 1;
                    self.string()?;
                    false
                }
                Some(open @ (b'{' | b'[')) => {
                    // The top-level object is depth 1, this container depth + 2.
                    if depth + 2 > MAX_DEPTH as usize {
                        return Err(self.err("nesting too deep"));
                    }
                    self.i += 1;
                    depth += 1;
                    is_object[depth] = open == b'{';
                    self.skip_ws();
                    let close = if open == b'{' { b'}' } else { b']' };
                    if self.peek() == Some(close) {
                        self.i += 1;
                        depth -= 1;
                        false
                    } else {
                        if open == b'{' {
                            self.key()?;
                        }
                        true
                    }
                }
                Some(b't') => self.literal(b"true").map(|()| false)?,
                Some(b'f') => self.literal(b"false").map(|()| false)?,
                Some(b'n') => self.literal(b"null").map(|()| false)?,
                Some(b'-' | b'0'..=b'9') => self.number().map(|()| false)?,
                Some(_) => return Err(self.err("expected a value")),
                None => return Err(self.err("end of input where a value was expected")),
            };
            if opened {
                continue;
            }
            // A value ended: close containers until one continues with a comma.
            loop {
                if depth == 0 {
                    return Ok(());
                }
                self.skip_ws();
                let in_object = is_object[depth];
                match self.peek() {
                    Some(b',') => {
                        self.i += 1;
                        self.skip_ws();
                        if in_object {
                            self.key()?;
                        }
                        break;
                    }
                    Some(b'}') if in_object => {}
                    Some(b']') if !in_object => {}
                    Some(_) => {
                        return Err(self.err(if in_object {
                            "expected ',' or '}'"
                        } else {
                            "expected ',' or ']'"
                        }));
                    }
                    None => return Err(self.err("end of input inside a container")),
                }
                self.i += 1;
                depth -= 1;
            }
        }
    }

    /// A nested object's key and colon, at `i` (whitespace skipped); leaves `i` at the value.
    #[inline(always)]
    fn key(&mut self) -> Result<(), Stop> {
        if self.peek() != Some(b'"') {
            return Err(self.err("expected a string key"));
        }
        self.i += 1;
        self.string()?;
        self.colon()
    }
}

/// The grammar position a scan stopped at: what the next byte may be.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum State {
    /// Before the top-level `{` (whitespace so far).
    Start,
    /// After a `{`: a key or `}`.
    ObjectOpen,
    /// After a `[`: a value or `]`.
    ArrayOpen,
    /// After a `,` in an object: a key.
    Key,
    /// Inside a key's string, after its opening quote.
    KeyString,
    /// After a key: `:`.
    Colon,
    /// A value (a literal is rewound to its first byte until all of it has arrived).
    Value,
    /// Inside a string value, after its opening quote.
    ValueString,
    /// Inside a number (where: `Incremental::num`).
    Number,
    /// A value ended just before `i` (a container's close included).
    Closed,
    /// After a value: `,` or the close of its container.
    AfterValue,
    /// After the top-level object: whitespace only.
    Done,
}

/// Where in `-?(0|[1-9][0-9]*)(\.[0-9]+)?([eE][+-]?[0-9]+)?` a number is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Num {
    /// After `-`: a digit.
    Minus,
    /// After a leading `0`: no further integer digit.
    Zero,
    /// In the integer digits.
    Int,
    /// After `.`: a digit.
    Dot,
    /// In the fraction digits.
    Frac,
    /// After `e`/`E`: a sign or digit.
    Exp,
    /// After the exponent's sign: a digit.
    ExpSign,
    /// In the exponent digits.
    ExpDigits,
}

/// The scan of a body that arrives in pieces: [`Incremental::feed`] each time more of it
/// has arrived, [`Incremental::finish`] once it is complete. The work over all feeds is one
/// pass over the body: a feed resumes where the previous one stopped, inside a string too
/// (only a literal such as `true` or an escape cut by a piece boundary is read again).
/// Holds no allocation; its state is a few words (the open containers are a bit set).
///
/// Equivalence with [`scan`]: for every body and every way of cutting it, feeding the
/// growing prefixes and then finishing gives `scan(body)`'s spans, and refuses exactly
/// the bodies `scan` refuses (`Incremental::new().finish(body)` is the one-shot form).
/// A refusal's position and text are the same except where the input ends early (the
/// end-of-input messages name the state the scan stopped in), and a second `model` or
/// `stream` is refused at its key, before its value (`scan` checks the value first).
///
/// Cost: string ends are found in 64-byte windows as in `scan`; a piece boundary
/// costs re-reading at most a literal (`false`) or a cut escape (`\u00e9`). Numbers
/// resume in place. Nothing is allocated.
#[derive(Debug, Clone)]
pub struct Incremental {
    /// Bytes before `i` are scanned; the next feed starts at `i` in `state`.
    i: usize,
    state: State,
    /// Open containers; the top-level object is depth 1.
    depth: u32,
    /// Whether the container at depth `d` is an object: bit `d % 64` of word `d / 64`
    /// (depth <= MAX_DEPTH < 128; two words, as a u128's variable shift is a dozen wasm
    /// instructions).
    objects: [u64; 2],
    /// The current string has an escape (matters for top-level keys only).
    escaped: bool,
    num: Num,
    /// The current top-level member: where its key starts, which it is, where its value
    /// starts.
    key_start: usize,
    key: Key,
    value_start: usize,
    out: TopLevel,
    /// Once refused, every later call answers the same.
    failed: Option<ScanError>,
}

impl Default for Incremental {
    fn default() -> Self {
        Self::new()
    }
}

/// A string's scan from some point inside it.
enum Str {
    /// Closed: the index after its closing quote.
    Closed(usize),
    /// The input ended inside it: resume at this index (the end, or a cut escape's `\`).
    More(usize),
    Bad(usize, &'static str),
}

/// The rest of a string from `i` (inside it, not inside an escape). Sets `escaped` when it
/// meets an escape.
#[inline(always)]
fn string(b: &[u8], mut i: usize, escaped: &mut bool, specials: &mut Specials) -> Str {
    loop {
        i = specials.next(b, i);
        match b.get(i) {
            Some(b'"') => return Str::Closed(i + 1),
            Some(b'\\') => {
                *escaped = true;
                match b.get(i + 1) {
                    Some(b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't') => i += 2,
                    Some(b'u') => {
                        let hex = &b[(i + 2).min(b.len())..(i + 6).min(b.len())];
                        if !hex.iter().all(u8::is_ascii_hexdigit) {
                            return Str::Bad(i + 1, "invalid \\u escape");
                        }
                        if hex.len() < 4 {
                            return Str::More(i);
                        }
                        i += 6;
                    }
                    Some(_) => return Str::Bad(i + 1, "invalid escape"),
                    None => return Str::More(i),
                }
            }
            Some(&c) if c < 0x20 => return Str::Bad(i, "control character in a string"),
            Some(_) => i += 1,
            None => return Str::More(i),
        }
    }
}

/// The rest of a number from `i` in `phase`. `Ok(Ok(end))`: it ended before `end`;
/// `Ok(Err(phase))`: the input ended in it, at `phase`.
#[inline]
fn number(
    b: &[u8],
    mut i: usize,
    mut phase: Num,
) -> Result<Result<usize, Num>, (usize, &'static str)> {
    loop {
        let Some(&c) = b.get(i) else {
            return Ok(Err(phase));
        };
        let digit = c.is_ascii_digit();
        phase = match phase {
            Num::Minus => match c {
                b'0' => Num::Zero,
                b'1'..=b'9' => Num::Int,
                _ => return Err((i, "invalid number")),
            },
            Num::Zero | Num::Int | Num::Frac if c == b'e' || c == b'E' => Num::Exp,
            Num::Zero | Num::Int if c == b'.' => Num::Dot,
            Num::Zero if digit => return Err((i, "invalid number (leading zero)")),
            Num::Int | Num::Frac | Num::ExpDigits if digit => phase,
            Num::Dot if digit => Num::Frac,
            Num::Dot => return Err((i, "invalid number (no digit after '.')")),
            Num::Exp if c == b'+' || c == b'-' => Num::ExpSign,
            Num::Exp | Num::ExpSign if digit => Num::ExpDigits,
            Num::Exp | Num::ExpSign => return Err((i, "invalid number (no exponent digit)")),
            Num::Zero | Num::Int | Num::Frac | Num::ExpDigits => return Ok(Ok(i)),
        };
        i += 1;
    }
}

/// Whether the open container at `depth` is an object.
#[inline(always)]
fn is_object(objects: &[u64; 2], depth: u32) -> bool {
    objects[(depth >> 6) as usize & 1] >> (depth & 63) & 1 != 0
}

#[inline(always)]
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    // Compact JSON has no whitespace: one compare settles it.
    if b.get(i).is_some_and(|&c| c > b' ') {
        return i;
    }
    while let Some(b' ' | b'\n' | b'\r' | b'\t') = b.get(i) {
        i += 1;
    }
    i
}

impl Incremental {
    pub fn new() -> Self {
        Incremental {
            i: 0,
            state: State::Start,
            depth: 0,
            objects: [0; 2],
            escaped: false,
            num: Num::Int,
            key_start: 0,
            key: Key::Other,
            value_start: 0,
            out: TopLevel::default(),
            failed: None,
        }
    }

    /// `body` is everything received so far: what the previous call was given plus what has
    /// arrived since (the caller keeps one growing buffer and never changes bytes already
    /// fed). Scans the new bytes; `Err` as soon as the body can no longer become valid
    /// JSON that [`scan`] accepts, whatever follows, so a bad body is refused early. After
    /// an `Err`, every later call returns the same `Err`.
    pub fn feed(&mut self, body: &[u8]) -> Result<(), ScanError> {
        if let Some(e) = self.failed {
            return Err(e);
        }
        if body.len() < self.i {
            return Err(self.fail(body.len(), "the body shrank between pieces"));
        }
        self.run(body)
    }

    /// What the scan has found so far: a field's span is set once its value has ended. Not
    /// a verdict on the body (a later byte can still make it invalid, or repeat `model`);
    /// [`Incremental::finish`] is.
    pub fn found(&self) -> TopLevel {
        self.out
    }

    /// The body is complete and `body` is all of it: the result [`scan`] gives for it (the
    /// spans index `body`).
    pub fn finish(mut self, body: &[u8]) -> Result<TopLevel, ScanError> {
        self.feed(body)?;
        match self.state {
            State::Done => Ok(self.out),
            State::Start => Err(ScanError::NotAnObject),
            state => Err(ScanError::Invalid {
                at: body.len(),
                what: match state {
                    State::KeyString | State::ValueString => "end of input inside a string",
                    State::Value | State::Colon => "end of input where a value was expected",
                    _ if self.depth == 1 => "end of input inside the object",
                    _ => "end of input inside a container",
                },
            }),
        }
    }

    #[cold]
    #[inline(never)]
    fn fail(&mut self, at: usize, what: &'static str) -> ScanError {
        let e = ScanError::Invalid { at, what };
        self.failed = Some(e);
        e
    }

    /// A top-level member's value ended before `end`: record it if it is `model` or `stream`.
    #[inline(never)]
    fn top_value(&mut self, b: &[u8], start: usize, end: usize) -> Result<(), ScanError> {
        let slot = match self.key {
            Key::Model => &mut self.out.model,
            Key::Stream => &mut self.out.stream,
            Key::Other => return Ok(()),
        };
        if std::str::from_utf8(&b[start..end]).is_err() {
            return Err(self.fail(start, "invalid UTF-8"));
        }
        *slot = Some((start, end));
        Ok(())
    }

    /// A top-level key ended before `end`: which member it names, refusing a second `model`
    /// or `stream` (the refusal comes before its value is read).
    #[inline(never)]
    fn top_key(
        &mut self,
        b: &[u8],
        start: usize,
        end: usize,
        escaped: bool,
    ) -> Result<(), ScanError> {
        let key = top_level_key(&b[start..end], escaped).map_err(|what| self.fail(start, what))?;
        let seen = match key {
            Key::Model => self.out.model.is_some(),
            Key::Stream => self.out.stream.is_some(),
            Key::Other => false,
        };
        if seen {
            return Err(self.fail(
                start,
                if key == Key::Model {
                    "duplicate field \"model\""
                } else {
                    "duplicate field \"stream\""
                },
            ));
        }
        self.key = key;
        Ok(())
    }

    /// Scan from `self.i` to the end of `b` (or the first invalid byte). The hot state
    /// lives in locals and is written back when the input runs out.
    ///
    /// Shaped like a one-shot recursive-descent walk, not a `match` on the state per token
    /// (which cost 15-20% more instructions): the loop knows only "a value is expected"
    /// and "a value ended", keys and colons are read inline, and every place the input can
    /// run out stores the state it stopped in. A resumed feed first finishes the step it
    /// stopped in (a key, a colon, an empty-container check), then joins the loop.
    fn run(&mut self, b: &[u8]) -> Result<(), ScanError> {
        let mut i = self.i;
        let mut state = self.state;
        let mut depth = self.depth;
        let mut objects = self.objects;
        // The current container's bit, kept at hand: every value's end reads it.
        let mut in_object = is_object(&objects, depth);
        let mut escaped = self.escaped;
        let mut num = self.num;
        let mut key_start = self.key_start;
        let mut value_start = self.value_start;
        let mut specials = Specials::NONE;
        'scan: {
            macro_rules! suspend {
                ($state:expr) => {{
                    state = $state;
                    break 'scan;
                }};
            }
            macro_rules! fail {
                ($at:expr, $what:expr) => {
                    return Err(self.fail($at, $what))
                };
            }
            // At a key's opening quote (whitespace skipped).
            macro_rules! key_open {
                () => {
                    match b.get(i) {
                        Some(b'"') => {
                            key_start = i;
                            escaped = false;
                            i += 1;
                        }
                        Some(_) => fail!(i, "expected a string key"),
                        None => suspend!(State::Key),
                    }
                };
            }
            // Inside a key: its rest, then the colon.
            macro_rules! key_rest {
                () => {
                    match string(b, i, &mut escaped, &mut specials) {
                        Str::Closed(end) => {
                            i = end;
                            if depth == 1 {
                                self.top_key(b, key_start, i, escaped)?;
                            }
                        }
                        Str::More(at) => {
                            i = at;
                            suspend!(State::KeyString)
                        }
                        Str::Bad(at, what) => fail!(at, what),
                    }
                    colon!();
                };
            }
            macro_rules! colon {
                () => {
                    i = skip_ws(b, i);
                    match b.get(i) {
                        Some(b':') => i += 1,
                        Some(_) => fail!(i, "expected ':'"),
                        None => suspend!(State::Colon),
                    }
                    state = State::Value;
                };
            }
            macro_rules! close {
                () => {
                    i += 1;
                    depth -= 1;
                    in_object = is_object(&objects, depth);
                    state = State::Closed;
                };
            }
            // After a `{`: `}` or the first key.
            macro_rules! object_open {
                () => {
                    i = skip_ws(b, i);
                    match b.get(i) {
                        Some(b'}') => {
                            close!();
                        }
                        None => suspend!(State::ObjectOpen),
                        Some(_) => {
                            key_open!();
                            key_rest!();
                        }
                    }
                };
            }
            // After a `[`: `]` or the first value.
            macro_rules! array_open {
                () => {
                    i = skip_ws(b, i);
                    match b.get(i) {
                        Some(b']') => {
                            close!();
                        }
                        None => suspend!(State::ArrayOpen),
                        Some(_) => state = State::Value,
                    }
                };
            }

            // Resume a step that is not the loop's.
            match state {
                State::Start => {
                    i = skip_ws(b, i);
                    match b.get(i) {
                        Some(b'{') => {
                            i += 1;
                            depth = 1;
                            objects = [1 << 1, 0];
                            in_object = true;
                            object_open!();
                        }
                        Some(_) => {
                            self.failed = Some(ScanError::NotAnObject);
                            return Err(ScanError::NotAnObject);
                        }
                        None => suspend!(State::Start),
                    }
                }
                State::ObjectOpen => {
                    object_open!();
                }
                State::Key => {
                    i = skip_ws(b, i);
                    key_open!();
                    key_rest!();
                }
                State::KeyString => {
                    key_rest!();
                }
                State::Colon => {
                    colon!();
                }
                State::ArrayOpen => {
                    array_open!();
                }
                State::Value
                | State::ValueString
                | State::Number
                | State::Closed
                | State::AfterValue
                | State::Done => {}
            }

            loop {
                if state == State::Value {
                    i = skip_ws(b, i);
                    if depth == 1 {
                        value_start = i;
                    }
                    match b.get(i) {
                        Some(b'"') => {
                            // The common case, read here rather than through the state.
                            match string(b, i + 1, &mut escaped, &mut specials) {
                                Str::Closed(end) => {
                                    i = end;
                                    state = State::Closed;
                                }
                                Str::More(at) => {
                                    i = at;
                                    suspend!(State::ValueString);
                                }
                                Str::Bad(at, what) => fail!(at, what),
                            }
                        }
                        Some(&open @ (b'{' | b'[')) => {
                            if depth >= MAX_DEPTH {
                                fail!(i, "nesting too deep");
                            }
                            i += 1;
                            depth += 1;
                            in_object = open == b'{';
                            let (word, bit) = ((depth >> 6) as usize & 1, 1u64 << (depth & 63));
                            if in_object {
                                objects[word] |= bit;
                                object_open!();
                            } else {
                                objects[word] &= !bit;
                                array_open!();
                            }
                            continue;
                        }
                        Some(&c @ (b't' | b'f' | b'n')) => {
                            let word: &[u8] = match c {
                                b't' => b"true",
                                b'f' => b"false",
                                _ => b"null",
                            };
                            let rest = &b[i..];
                            if rest.len() >= word.len() {
                                if &rest[..word.len()] != word {
                                    fail!(i, "invalid literal");
                                }
                                i += word.len();
                                state = State::Closed;
                            } else if word.starts_with(rest) {
                                // Cut by the end of the piece: read again from its start.
                                suspend!(State::Value);
                            } else {
                                fail!(i, "invalid literal");
                            }
                        }
                        Some(&c @ (b'-' | b'0'..=b'9')) => {
                            i += 1;
                            num = match c {
                                b'-' => Num::Minus,
                                b'0' => Num::Zero,
                                _ => Num::Int,
                            };
                            state = State::Number;
                        }
                        Some(_) => fail!(i, "expected a value"),
                        None => suspend!(State::Value),
                    }
                }
                if state == State::ValueString {
                    match string(b, i, &mut escaped, &mut specials) {
                        Str::Closed(end) => {
                            i = end;
                            state = State::Closed;
                        }
                        Str::More(at) => {
                            i = at;
                            suspend!(State::ValueString);
                        }
                        Str::Bad(at, what) => fail!(at, what),
                    }
                }
                if state == State::Number {
                    match number(b, i, num) {
                        Ok(Ok(end)) => {
                            i = end;
                            state = State::Closed;
                        }
                        Ok(Err(phase)) => {
                            i = b.len();
                            num = phase;
                            suspend!(State::Number);
                        }
                        Err((at, what)) => fail!(at, what),
                    }
                }
                // A value (a container's close included) ended at `i`; `depth` is its
                // container's. A top-level one is recorded. Then `,` or closes until one.
                loop {
                    if state == State::Closed {
                        if depth == 0 {
                            state = State::Done;
                            break;
                        }
                        if depth == 1 {
                            self.top_value(b, value_start, i)?;
                        }
                        state = State::AfterValue;
                    }
                    if state != State::AfterValue {
                        break;
                    }
                    i = skip_ws(b, i);
                    match b.get(i) {
                        Some(b',') => {
                            i += 1;
                            if in_object {
                                i = skip_ws(b, i);
                                key_open!();
                                key_rest!();
                            } else {
                                state = State::Value;
                            }
                            break;
                        }
                        Some(b'}') if in_object => {}
                        Some(b']') if !in_object => {}
                        Some(_) => fail!(
                            i,
                            if in_object {
                                "expected ',' or '}'"
                            } else {
                                "expected ',' or ']'"
                            }
                        ),
                        None => suspend!(State::AfterValue),
                    }
                    close!();
                }
                if state == State::Done {
                    i = skip_ws(b, i);
                    if i != b.len() {
                        fail!(i, "trailing characters");
                    }
                    break 'scan;
                }
            }
        }
        self.i = i;
        self.state = state;
        self.depth = depth;
        self.objects = objects;
        self.escaped = escaped;
        self.num = num;
        self.key_start = key_start;
        self.value_start = value_start;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn found_names_a_field_once_its_value_has_ended() {
        let body = br#"{"model":"haiku","messages":[{"role":"user"}],"stream":true}"#;
        let mut inc = Incremental::new();
        inc.feed(&body[..12]).expect("prefix");
        assert_eq!(
            inc.found(),
            TopLevel::default(),
            "the model's value is still open"
        );
        inc.feed(&body[..20]).expect("prefix");
        assert_eq!(inc.found().model, Some((9, 16)));
        assert_eq!(inc.found().stream, None);
        assert_eq!(inc.finish(body).expect("valid"), scan(body).expect("valid"));
    }

    /// Every byte value at every place of a window, against the byte-at-a-time rule, for
    /// the build's classifier and for the word fallback (compiled here for this check).
    #[test]
    fn window_bits_are_exact_for_every_byte() {
        let scalar = |w: &[u8]| {
            w.iter()
                .enumerate()
                .filter(|(_, c)| is_special(**c))
                .fold(0u64, |bits, (k, _)| bits | 1 << k)
        };
        let fallback = |w: &[u8; WINDOW]| swar::window_specials(w);
        // A plain window with one byte value at one place, then two specials around it (a
        // flag next to a flag is where a borrow would spill).
        for c in 0..=255u8 {
            for at in 0..WINDOW {
                let mut w = [b'a'; WINDOW];
                w[at] = c;
                assert_eq!(window_specials(&w), scalar(&w), "byte {c:#x} at {at}");
                assert_eq!(fallback(&w), scalar(&w), "byte {c:#x} at {at} (words)");
                w[(at + 1) % WINDOW] = b'"';
                w[(at + 7) % WINDOW] = 0x1f;
                assert_eq!(
                    window_specials(&w),
                    scalar(&w),
                    "byte {c:#x} at {at}, with quotes"
                );
                assert_eq!(
                    fallback(&w),
                    scalar(&w),
                    "byte {c:#x} at {at}, with quotes (words)"
                );
            }
        }
    }

    /// Strings ending in every place of a window and across windows, and the last bytes
    /// of the input (fewer than a window), found the same as byte by byte.
    #[test]
    fn the_next_special_is_found_across_windows_and_in_the_tail() {
        let mut body = Vec::new();
        for n in 0..200 {
            body.extend(std::iter::repeat_n(b'x', n % 97));
            body.push(if n % 3 == 0 { b'\\' } else { b'"' });
        }
        let mut specials = Specials::NONE;
        let mut i = 0;
        while i < body.len() {
            let expected = i + body[i..].iter().position(|&c| is_special(c)).unwrap();
            assert_eq!(specials.next(&body, i), expected, "from {i}");
            i = expected + 1;
        }
        assert_eq!(specials.next(&body, body.len()), body.len());
    }

    /// `body` fed one byte at a time, then finished.
    fn bytewise(body: &[u8]) -> Result<TopLevel, ScanError> {
        let mut inc = Incremental::new();
        for end in 0..body.len() {
            if inc.feed(&body[..end]).is_err() {
                break;
            }
        }
        inc.finish(body)
    }

    /// Accepted by `scan`, and by the incremental scan in one piece and byte by byte.
    fn ok(body: &str) -> TopLevel {
        let top = scan(body.as_bytes()).unwrap_or_else(|e| panic!("{body:?} refused: {e}"));
        assert_eq!(
            Incremental::new().finish(body.as_bytes()),
            Ok(top),
            "{body:?}"
        );
        assert_eq!(bytewise(body.as_bytes()), Ok(top), "{body:?}");
        top
    }

    /// Refused by `scan`, and by the incremental scan in one piece and byte by byte.
    fn refused(body: impl AsRef<[u8]>) -> ScanError {
        let body = body.as_ref();
        let show = || String::from_utf8_lossy(body).into_owned();
        assert!(Incremental::new().finish(body).is_err(), "{:?}", show());
        assert!(bytewise(body).is_err(), "{:?}", show());
        match scan(body) {
            Err(e) => e,
            Ok(top) => panic!("{:?} accepted: {top:?}", show()),
        }
    }

    #[test]
    fn a_long_string_in_many_pieces_is_read_once() {
        // 300 KB of content with escapes every so often, in 1,000 pieces of odd sizes.
        let content = r#"abcdefghij\\klmnopqrst\u00e9uvwxyz \""#.repeat(8_000);
        let body = format!(r#"{{"messages":[{{"content":"{content}"}}],"model":"opus"}}"#);
        let body = body.as_bytes();
        let mut inc = Incremental::new();
        let mut end = 0;
        let mut inside = 0;
        while end < body.len() {
            end = (end + 307).min(body.len());
            inc.feed(&body[..end]).expect("a valid prefix");
            // Each feed stops at the end of what it has (or at a cut escape's backslash,
            // at most 5 bytes before it): the next starts there, not at the string's start.
            assert!(end - inc.i <= 5, "resumed at {} of {end}", inc.i);
            if inc.state == State::ValueString {
                inside += 1;
            }
        }
        assert!(inside > 900, "{inside}");
        let top = inc.finish(body).expect("valid");
        assert_eq!(top, scan(body).expect("valid"));
        assert_eq!(&body[top.model.expect("model").0..][..6], br#""opus""#);
    }

    #[test]
    fn an_invalid_prefix_is_refused_as_soon_as_it_arrives() {
        for (prefix, at) in [
            ("[", None),
            (" x", None),
            (r#"{"a":tru "#, Some(5)),
            (r#"{"a":nulx"#, Some(5)),
            (r#"{"a":"\x"#, Some(7)),
            (r#"{"a":"\u12G"#, Some(7)),
            ("{\"a\":\"\n", Some(6)),
            (r#"{"a":01"#, Some(6)),
            (r#"{"a":1.x"#, Some(7)),
            (r#"{"a":1,}"#, Some(7)),
            (r#"{"a":[1 2"#, Some(8)),
            // A second model is refused at its key, before its value arrives.
            (r#"{"model":"a","model""#, Some(13)),
            (r#"{"model":"a","mod\u0065l""#, Some(13)),
            (r#"{"a":1} x"#, Some(8)),
        ] {
            let body = prefix.as_bytes();
            let mut inc = Incremental::new();
            inc.feed(&body[..body.len() - 1])
                .unwrap_or_else(|e| panic!("{prefix:?} less its last byte: {e}"));
            let e = inc.feed(body).expect_err(prefix);
            match at {
                None => assert_eq!(e, ScanError::NotAnObject, "{prefix:?}"),
                Some(at) => assert!(
                    matches!(e, ScanError::Invalid { at: a, .. } if a == at),
                    "{prefix:?}: {e}"
                ),
            }
            // The refusal sticks, and the complete body is refused too.
            assert_eq!(inc.feed(body), Err(e));
            let whole = format!("{prefix}}}");
            assert!(scan(whole.as_bytes()).is_err(), "{whole}");
        }
        // What could still become valid is not refused: every prefix of a request.
        let body = br#" {"model" : "op\u0075s", "n": -1.5e+3, "t":true, "m":[null,{}]} "#;
        let mut inc = Incremental::new();
        for end in 0..=body.len() {
            inc.feed(&body[..end]).expect("a prefix of a valid body");
        }
        assert_eq!(inc.finish(body), scan(body));
    }

    #[test]
    fn a_shrinking_body_is_refused_not_a_panic() {
        let mut inc = Incremental::new();
        inc.feed(br#"{"model":"opus""#).expect("prefix");
        assert!(inc.feed(br#"{"mo"#).is_err());
    }

    fn raw(body: &str, span: Option<(usize, usize)>) -> Option<&str> {
        span.map(|(a, b)| &body[a..b])
    }

    #[test]
    fn finds_model_and_stream_spans() {
        let body = r#" { "x" : [1,{"model":"nested"}], "model" : "haiku" , "stream":true } "#;
        let top = ok(body);
        assert_eq!(raw(body, top.model), Some("\"haiku\""));
        assert_eq!(raw(body, top.stream), Some("true"));
        let top = ok(r#"{"stream":false,"model":"m"}"#);
        assert_eq!(top.stream, Some((10, 15)));
        assert_eq!(ok("{}"), TopLevel::default());
        assert_eq!(ok(r#"{"messages":[]}"#), TopLevel::default());
        // Any JSON value is located; admit decides what a non-string model means.
        let body = r#"{"model":{"a":[1]},"stream":"true"}"#;
        let top = ok(body);
        assert_eq!(raw(body, top.model), Some(r#"{"a":[1]}"#));
        assert_eq!(raw(body, top.stream), Some("\"true\""));
    }

    #[test]
    fn duplicate_model_or_stream_is_refused_however_spelled() {
        for body in [
            r#"{"model":"a","model":"b"}"#,
            r#"{"model":"a","mod\u0065l":"b"}"#,
            r#"{"\u006d\u006F\u0064\u0065\u006c":"a","x":1,"model":"b"}"#,
            r#"{"model":null,"model":"b"}"#,
            r#"{"stream":true,"stream":false}"#,
            r#"{"\u0073tream":true,"stream":false}"#,
        ] {
            let e = refused(body);
            assert!(e.to_string().contains("duplicate field"), "{body}: {e}");
        }
        // Nested, differently named or differently cased keys are not duplicates.
        ok(r#"{"model":"a","messages":[{"model":"b","model":"c"}],"Model":"d","modelx":1}"#);
        let body = r#"{"mod\u0065l":"x"}"#;
        assert_eq!(raw(body, ok(body).model), Some("\"x\""));
    }

    #[test]
    fn top_level_keys_are_decoded_strictly() {
        refused(r#"{"mod\uD800el":"a"}"#); // lone leading surrogate
        refused(r#"{"\uDC00":"a"}"#); // lone trailing surrogate
        refused(b"{\"k\xff\":1}"); // invalid UTF-8
        refused(r#"{"\x":1}"#);
        ok(r#"{"\uD83D\uDE00":1,"caf\u00e9":2}"#);
        // Nested keys and values are skipped like serde's IgnoredAny: lone surrogates and
        // bytes that are not UTF-8 pass there.
        ok(r#"{"a":{"\uD800":"\uDC00"}}"#);
        assert!(scan(b"{\"a\":[\"\xff\xfe\"]}").is_ok());
        // The model and stream values are UTF-8 checked, like serde's RawValue.
        refused(b"{\"model\":\"\xff\"}");
        refused(b"{\"stream\":[\"\xc3\"]}");
    }

    #[test]
    fn strings() {
        ok(r#"{"a":"\"\\\/\b\f\n\r\t\u0000\uFFFF\uabcd"}"#);
        ok(r#"{"a":"","b":"\u00e9\uD83D\uDE00"}"#);
        ok("{\"a\":\"\x7f caf\u{e9} \u{1F600}\"}");
        for body in [
            r#"{"a":"\x"}"#,
            r#"{"a":"\u12"}"#,
            r#"{"a":"\u12G4"}"#,
            r#"{"a":"\U0041"}"#,
            r#"{"a":"\'"}"#,
            "{\"a\":\"tab\there\"}",
            "{\"a\":\"nl\nhere\"}",
            "{\"a\":\"\x00\"}",
            "{\"a\":\"\x1f\"}",
            r#"{"a":"open}"#,
            r#"{"a":"\"#,
            r#"{"a":'x'}"#,
        ] {
            refused(body);
        }
        // A control byte is refused in every position of the word-at-a-time loop.
        for at in 0..40 {
            let mut s = "x".repeat(40);
            s.replace_range(at..=at, "\u{1}");
            refused(format!("{{\"a\":\"{s}\"}}"));
            let mut s = "x".repeat(40);
            s.replace_range(at..=at, "\"");
            refused(format!("{{\"a\":\"{s}\"}}"));
        }
    }

    #[test]
    fn numbers() {
        for n in [
            "0",
            "-0",
            "1",
            "-12",
            "1e5",
            "1E5",
            "1e+5",
            "1e-5",
            "1.5",
            "-0.0",
            "0e0",
            "1.25E-3",
            "123456789012345678901234567890",
            "1e400",
        ] {
            ok(&format!(r#"{{"n":{n},"m":[{n}]}}"#));
        }
        for n in [
            "01",
            "-01",
            "00",
            "+1",
            "-",
            ".5",
            "1.",
            "1.e5",
            "1e",
            "1e+",
            "1E-",
            "0x10",
            "1_0",
            "NaN",
            "Infinity",
            "-Infinity",
            "1.5.2",
            "--1",
        ] {
            refused(format!(r#"{{"n":{n}}}"#));
        }
    }

    #[test]
    fn literals_whitespace_commas_and_trailing_bytes() {
        ok("\t\r\n {\"a\" :\ttrue ,\n\"b\":false,\"c\":null , \"d\" : [ ] , \"e\" : { } }\n\r\t ");
        for body in [
            r#"{"a":tru}"#,
            r#"{"a":True}"#,
            r#"{"a":nul}"#,
            r#"{"a":truex}"#,
            r#"{"a":1,}"#,
            r#"{"a":[1,]}"#,
            r#"{"a":[,1]}"#,
            r#"{"a":{"b":1,}}"#,
            r#"{,"a":1}"#,
            r#"{"a" 1}"#,
            r#"{"a":1 "b":2}"#,
            r#"{"a":[1 2]}"#,
            r#"{"a":}"#,
            r#"{"a":[}"#,
            r#"{"a":{]}"#,
            r#"{a:1}"#,
            r#"{"a":1}}"#,
            r#"{"a":1} x"#,
            r#"{"a":1}{}"#,
            "{\"a\":1}\x0c",
            "{\"a\":\x0c1}",
            "{\"a\":1",
            "{",
        ] {
            refused(body);
        }
    }

    #[test]
    fn only_an_object_is_a_request() {
        for body in ["", "   ", "[]", "\"model\"", "1", "null", "\x0c{}"] {
            assert_eq!(
                scan(body.as_bytes()),
                Err(ScanError::NotAnObject),
                "{body:?}"
            );
        }
    }

    /// `depth` nested arrays in the top-level object: `depth + 1` containers in all.
    fn nested(depth: usize) -> String {
        format!(r#"{{"a":{}{}}}"#, "[".repeat(depth), "]".repeat(depth))
    }

    #[test]
    fn nesting_limit_is_serde_values() {
        let limit = MAX_DEPTH as usize;
        // serde_json's Value accepts exactly what the scanner accepts at the limit.
        for containers in [limit - 1, limit, limit + 1, limit + 50] {
            let body = nested(containers - 1);
            let serde_ok = serde_json::from_str::<serde_json::Value>(&body).is_ok();
            assert_eq!(scan(body.as_bytes()).is_ok(), serde_ok, "{containers}");
            assert_eq!(serde_ok, containers <= limit, "{containers}");
        }
        let e = refused(format!(
            r#"{{"a":{}{}}}"#,
            r#"{"b":"#.repeat(limit),
            "}".repeat(limit)
        ));
        assert!(e.to_string().contains("nesting too deep"), "{e}");
        // Deep but within the limit, then back out and on.
        ok(&format!(
            r#"{{"a":{}1{},"model":"m"}}"#,
            "[".repeat(limit - 1),
            "]".repeat(limit - 1)
        ));
    }

    #[test]
    fn errors_name_a_position_and_no_content() {
        let e = refused(r#"{"secret-prompt": tru}"#).to_string();
        assert_eq!(
            e,
            "the request body is not valid JSON: invalid literal at byte 18"
        );
        let e = refused(r#"{"model":"secret","model":"other"}"#).to_string();
        assert!(!e.contains("secret") && !e.contains("other"), "{e}");
        assert!(e.starts_with("the request body is not valid JSON: "), "{e}");
    }
}
