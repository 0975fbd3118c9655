//! The model rewrite without a second parse.
//!
//! admit has already decoded the body strictly (a JSON object with at most one top-level
//! `model`, a string). Finding that value again only needs a structural walk: track the
//! nesting depth, skip strings (honouring backslash escapes) and look at the keys of the
//! top-level object. No UTF-8 validation, no escape decoding, no number parsing: this is
//! what keeps a 1 MB conversation from costing two full parses per request. If the walk
//! finds nothing (it cannot, for an admitted body) the caller falls back to halo-policy's
//! `rewrite_body_model`, which is the reference behaviour the tests compare against.

/// The byte range of the top-level `"model"` value (quotes included) of a body that
/// admit accepted.
pub fn top_level_model(body: &[u8]) -> Option<(usize, usize)> {
    let mut i = 0;
    let mut depth = 0u32;
    // Whether the next string at depth 1 is a key.
    let mut expect_key = false;
    let mut model_value_next = false;
    while i < body.len() {
        match body[i] {
            b'"' => {
                let start = i;
                i += 1;
                // Jump to the next quote or backslash (word-at-a-time, SIMD natively).
                loop {
                    let off = memchr::memchr2(b'"', b'\\', body.get(i..)?)?;
                    i += off;
                    if body[i] == b'"' {
                        break;
                    }
                    i += 2;
                }
                let end = i + 1;
                if depth == 1 {
                    if model_value_next {
                        return Some((start, end.min(body.len())));
                    }
                    if expect_key {
                        model_value_next = body.get(start + 1..end - 1) == Some(b"model");
                        expect_key = false;
                    }
                }
            }
            b'{' | b'[' => {
                depth += 1;
                if depth == 1 {
                    expect_key = true;
                }
                // A nested value after "model": (not a string) is not ours.
                if depth == 2 {
                    model_value_next = false;
                }
            }
            b'}' | b']' => depth = depth.saturating_sub(1),
            b',' if depth == 1 => {
                expect_key = true;
                model_value_next = false;
            }
            _ => {}
        }
        i += 1;
    }
    None
}

/// Replace the top-level model of an admitted body with `model`.
pub fn rewrite_model(
    body: &[u8],
    model: &str,
) -> Result<Vec<u8>, halo_policy::admit::RewriteError> {
    let Some((start, end)) = top_level_model(body) else {
        return halo_policy::admit::rewrite_body_model(body, model);
    };
    let replacement = serde_json::to_string(model).unwrap_or_default();
    let mut out = Vec::with_capacity(body.len() - (end - start) + replacement.len());
    out.extend_from_slice(&body[..start]);
    out.extend_from_slice(replacement.as_bytes());
    out.extend_from_slice(&body[end..]);
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn matches_the_reference_rewrite() {
        let bodies = [
            r#"{"model":"a","x":1}"#,
            r#" { "messages" : [{"model":"nested","c":"\"model\""}], "model" : "a" , "z":{"model":"no"}}"#,
            r#"{"metadata":{"k":"v"},"stream":true,"model":"a\"b\\"}"#,
            r#"{"a":"model","b":["model",{"model":1}],"model":"real"}"#,
            r#"{"tools":[],"model":"h\u00e9"}"#,
        ];
        for b in bodies {
            let got = rewrite_model(b.as_bytes(), "target-1").expect("rewrite");
            let want = halo_policy::admit::rewrite_body_model(b.as_bytes(), "target-1")
                .expect("reference");
            assert_eq!(
                String::from_utf8_lossy(&got),
                String::from_utf8_lossy(&want),
                "{b}"
            );
        }
    }

    #[test]
    fn key_named_model_as_a_value_is_not_the_key() {
        let b = br#"{"name":"model","model":"m"}"#;
        let (s, e) = top_level_model(b).expect("found");
        assert_eq!(&b[s..e], br#""m""#);
    }
}
