//! The probe admit ran before `body_scan`: serde_json into a struct with `model` and
//! `stream` as `&RawValue`, every other field skipped. The differential test
//! (`tests/body_scan.rs`) checks the scanner against it; the body probe benchmarks
//! (`benches/body_probe.rs`, natively, and `examples/v8_probe.rs`, inside V8) time it as
//! the baseline. Each includes this file with `#[path]`, so there is one reference.

use serde::Deserialize;
use serde_json::value::RawValue;

#[derive(Deserialize)]
struct Probe<'a> {
    #[serde(borrow, default)]
    model: Option<&'a RawValue>,
    #[serde(borrow, default)]
    stream: Option<&'a RawValue>,
}

/// The byte range of `raw`, a value borrowed from `body`.
fn span(body: &[u8], raw: &RawValue) -> (usize, usize) {
    let start = raw.get().as_ptr() as usize - body.as_ptr() as usize;
    (start, start + raw.get().len())
}

/// A top-level value's byte range, for `model` and for `stream`.
pub type Spans = (Option<(usize, usize)>, Option<(usize, usize)>);

/// The `model` and `stream` spans serde finds; `None` when it refuses the body (admit
/// also required a JSON object, which serde alone would not: a struct decodes from an
/// array too).
pub fn spans(body: &[u8]) -> Option<Spans> {
    if body.iter().find(|b| !b.is_ascii_whitespace()) != Some(&b'{') {
        return None;
    }
    let probe = serde_json::from_slice::<Probe<'_>>(body).ok()?;
    Some((
        probe.model.map(|r| span(body, r)),
        probe.stream.map(|r| span(body, r)),
    ))
}

/// What the benchmarks compare: where the model starts and whether `stream` is `true`.
#[allow(dead_code)] // the differential test uses `spans` only
pub fn model_start_and_stream(body: &[u8]) -> Option<(usize, bool)> {
    let (model, stream) = spans(body)?;
    let stream = stream.is_some_and(|(a, b)| &body[a..b] == b"true");
    Some((model?.0, stream))
}
