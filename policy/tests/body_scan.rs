//! Differential test: `body_scan::scan` accepts and refuses exactly what the serde_json probe
//! it replaced did (a struct with `model` and `stream` as `&RawValue`, every other field
//! skipped), and finds the same spans, on many generated documents and their mutations.
//!
//! Every body is also fed to `body_scan::Incremental` in pieces (one byte at a time, and
//! at random cut points, which land inside escapes, `\u` escapes, numbers, literals, keys
//! and the model value) and must find the same spans and refuse the same bodies as `scan`
//! (a refusal's text may differ: see `Incremental`).
//!
//! The generator is a fixed-seed PRNG, so a failure reproduces; it prints the document.
//! Nesting stays far below `MAX_DEPTH` (the one place the scanner is deliberately stricter;
//! that limit has its own unit tests).

use halo_policy::body_scan::{Incremental, ScanError, TopLevel, scan};
#[path = "reference/serde_probe.rs"]
mod serde_probe;

use serde_probe::Spans;

/// serde's answer: the reference.
fn reference(body: &[u8]) -> Option<Spans> {
    serde_probe::spans(body)
}

/// The scanner's answer in the reference's terms (serde's `Option` reads `null` as absent).
fn scanned(body: &[u8]) -> Option<Spans> {
    let TopLevel { model, stream } = scan(body).ok()?;
    let not_null = |s: Option<(usize, usize)>| s.filter(|&(a, b)| &body[a..b] != b"null");
    Some((not_null(model), not_null(stream)))
}

/// splitmix64: small, deterministic, good enough to pick shapes.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9E37_79B9_7F4A_7C15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94D0_49BB_1331_11EB);
        z ^ (z >> 31)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n as u64) as usize
    }
    fn pick<T: Copy>(&mut self, items: &[T]) -> T {
        items[self.below(items.len())]
    }
    fn chance(&mut self, percent: usize) -> bool {
        self.below(100) < percent
    }
}

/// Pieces of string content: plain text, every escape, surrogate pairs and lone halves,
/// raw UTF-8, invalid UTF-8, DEL, and (rarely) a raw control byte.
const STRING_PIECES: &[&[u8]] = &[
    b"a",
    b"hello world",
    b"model",
    b"stream",
    b"Refactor the parser so that it reports every error; keep the tests green.",
    b"\\\"",
    b"\\\\",
    b"\\/",
    b"\\b\\f\\n\\r\\t",
    b"\\u00e9",
    b"\\u0065",
    b"\\uD83D\\uDE00",
    b"\\uD800",
    b"\\uDC00",
    b"\\uD800\\u0041",
    b"\\uDBFF\\uDFFF",
    b"\\uabcd",
    "caf\u{e9} \u{1F600}".as_bytes(),
    b"\xff",
    b"\xc3",
    b"\xe2\x82",
    b"\x7f",
    b"01234567",
];

const NUMBERS: &[&[u8]] = &[
    b"0",
    b"-0",
    b"1",
    b"16",
    b"-12",
    b"1e5",
    b"1E+2",
    b"2.5e-3",
    b"0.000",
    b"123456789012345678901234567890",
    b"1.7976931348623157e309",
    b"-0.0e0",
];

const KEYS: &[&[u8]] = &[
    b"\"model\"",
    b"\"stream\"",
    b"\"mod\\u0065l\"",
    b"\"\\u006d\\u006f\\u0064\\u0065\\u006c\"",
    b"\"\\u0073tream\"",
    b"\"modelx\"",
    b"\"Model\"",
    b"\"messages\"",
    b"\"max_tokens\"",
    b"\"tools\"",
    b"\"\"",
    b"\"caf\xc3\xa9\"",
    b"\"bad\xff\"",
    b"\"lone\\uD800\"",
    b"\"pair\\uD83D\\uDE00\"",
    b"\"esc\\n\"",
];

fn ws(rng: &mut Rng, out: &mut Vec<u8>) {
    if rng.chance(25) {
        for _ in 0..=rng.below(3) {
            out.push(rng.pick(b" \t\r\n"));
        }
    }
}

fn string(rng: &mut Rng, out: &mut Vec<u8>) {
    out.push(b'"');
    for _ in 0..rng.below(4) {
        out.extend_from_slice(rng.pick(STRING_PIECES));
    }
    if rng.chance(2) {
        out.push(rng.below(0x20) as u8);
    }
    out.push(b'"');
}

fn value(rng: &mut Rng, out: &mut Vec<u8>, depth: usize) {
    let kind = if depth >= 6 {
        rng.below(5)
    } else {
        rng.below(8)
    };
    match kind {
        0 | 1 => string(rng, out),
        2 => out.extend_from_slice(rng.pick(NUMBERS)),
        3 => out.extend_from_slice(rng.pick(&[b"true".as_slice(), b"false", b"null"])),
        4 => out.extend_from_slice(rng.pick(&[b"\"haiku\"".as_slice(), b"\"sonnet\"", b"7"])),
        5 | 6 => {
            out.push(b'{');
            let n = rng.below(4);
            for k in 0..n {
                if k > 0 {
                    out.push(b',');
                }
                ws(rng, out);
                out.extend_from_slice(rng.pick(KEYS));
                ws(rng, out);
                out.push(b':');
                ws(rng, out);
                value(rng, out, depth + 1);
                ws(rng, out);
            }
            out.push(b'}');
        }
        _ => {
            out.push(b'[');
            let n = rng.below(4);
            for k in 0..n {
                if k > 0 {
                    out.push(b',');
                }
                ws(rng, out);
                value(rng, out, depth + 1);
                ws(rng, out);
            }
            out.push(b']');
        }
    }
}

/// A request-like top-level object: mostly distinct keys, sometimes a duplicate.
fn document(rng: &mut Rng) -> Vec<u8> {
    let mut out = Vec::new();
    ws(rng, &mut out);
    out.push(b'{');
    let n = rng.below(6);
    let mut keys: Vec<&[u8]> = Vec::new();
    for k in 0..n {
        if k > 0 {
            out.push(b',');
        }
        ws(rng, &mut out);
        // Duplicates (possibly spelled differently) in about one document in six.
        let key = loop {
            let key = rng.pick(KEYS);
            let dup = keys.contains(&key);
            if !dup || rng.chance(15) {
                break key;
            }
        };
        keys.push(key);
        out.extend_from_slice(key);
        ws(rng, &mut out);
        out.push(b':');
        ws(rng, &mut out);
        value(rng, &mut out, 1);
        ws(rng, &mut out);
    }
    out.push(b'}');
    ws(rng, &mut out);
    out
}

const INTERESTING: &[u8] = b"\"\\{}[],: \t\n\x00\x1f\x7f\xffeE+-.0159unlrtfa";

fn mutate(rng: &mut Rng, doc: &[u8]) -> Vec<u8> {
    let mut out = doc.to_vec();
    for _ in 0..=rng.below(2) {
        let at = rng.below(out.len() + 1);
        match rng.below(4) {
            0 if at < out.len() => out[at] = rng.pick(INTERESTING),
            1 => out.truncate(at),
            2 if at < out.len() => {
                out.remove(at);
            }
            _ => out.insert(at, rng.pick(INTERESTING)),
        }
    }
    out
}

/// `body` fed to [`Incremental`] in pieces ending at `cuts` (ascending), then finished.
/// A feed's refusal must be the final answer: it may only refuse what no continuation
/// could make valid, and this body is one continuation.
fn pieces(body: &[u8], cuts: impl IntoIterator<Item = usize>) -> Result<TopLevel, ScanError> {
    let mut inc = Incremental::new();
    for end in cuts {
        if let Err(e) = inc.feed(&body[..end]) {
            let last = inc.finish(body);
            assert_eq!(last, Err(e), "a refusal must stick");
            return last;
        }
    }
    inc.finish(body)
}

/// The incremental scan agrees with `scan` however `body` is cut.
fn check_pieces(rng: &mut Rng, body: &[u8]) {
    let want = scan(body);
    let show = || String::from_utf8_lossy(body).into_owned();
    // One byte at a time (a third of the bodies: in a debug build this is most of the
    // test's time).
    if rng.chance(33) {
        assert_eq!(
            pieces(body, 0..=body.len()).ok(),
            want.ok(),
            "byte by byte: {:?}",
            show()
        );
    }
    // A few random cuts (sometimes empty pieces: the same length fed twice).
    let mut cuts: Vec<usize> = (0..rng.below(6))
        .map(|_| rng.below(body.len() + 1))
        .collect();
    cuts.sort_unstable();
    assert_eq!(
        pieces(body, cuts.iter().copied()).ok(),
        want.ok(),
        "cut at {cuts:?}: {:?}",
        show()
    );
}

fn check(rng: &mut Rng, body: &[u8], accepted: &mut usize, refused: &mut usize) {
    check_pieces(rng, body);
    let want = reference(body);
    let got = scanned(body);
    assert_eq!(
        got,
        want,
        "scanner and serde disagree on {:?}",
        String::from_utf8_lossy(body)
    );
    if want.is_some() {
        *accepted += 1;
    } else {
        *refused += 1;
    }
}

#[test]
fn scanner_agrees_with_serde_on_generated_documents_and_mutations() {
    let mut rng = Rng(0x5EED_B0D1_5CA7);
    let (mut accepted, mut refused) = (0, 0);
    for _ in 0..25_000 {
        let doc = document(&mut rng);
        check(&mut rng, &doc, &mut accepted, &mut refused);
        for _ in 0..12 {
            let m = mutate(&mut rng, &doc);
            check(&mut rng, &m, &mut accepted, &mut refused);
        }
    }
    // Both outcomes are well represented, or the comparison proves little.
    let total = accepted + refused;
    assert!(accepted * 10 > total, "{accepted} accepted of {total}");
    assert!(refused * 5 > total, "{refused} refused of {total}");
}

#[test]
fn scanner_agrees_with_serde_on_every_truncation_of_a_request() {
    let doc = br#" {"model" : "mod\u0065l\uD83D\uDE00", "max_tokens": -1.5e+3, "stream":true,
        "messages":[{"role":"user","content":"caf\u00e9 \"quoted\" \\ \/ \b\f\n\r\t"},
        {"role":"assistant","content":[{"type":"text","text":"","model":null}]}],
        "tools":[{"name":"t","input_schema":{"type":"object","properties":{"a":{"type":"array",
        "items":{"enum":[0,-0,1e5,true,false,null,{}, []]}}}}}]}
"#;
    let mut rng = Rng(7);
    let (mut accepted, mut refused) = (0, 0);
    for end in 0..=doc.len() {
        check(&mut rng, &doc[..end], &mut accepted, &mut refused);
        check(&mut rng, &doc[end..], &mut accepted, &mut refused);
    }
    // The whole document, less its leading space, less its trailing newline.
    assert_eq!(accepted, 4);
}
