//! Claims as Envoy hands them to the filter: jwt_authn's verified payload read through
//! properties (`metadata.filter_metadata."envoy.filters.http.jwt_authn".halo_jwt.<claim>`).
//! A string claim comes back as its bytes; a list claim in Envoy's serialized pairs format.

/// A list claim as Envoy serializes it for a property (count, lengths, NUL-terminated
/// strings), or a plain string claim (one group).
pub fn parse_string_list(bytes: &[u8]) -> Vec<String> {
    if let Some(list) = parse_pairs(bytes) {
        return list;
    }
    String::from_utf8(bytes.to_vec())
        .ok()
        .filter(|s| !s.is_empty())
        .map(|s| vec![s])
        .unwrap_or_default()
}

fn parse_pairs(bytes: &[u8]) -> Option<Vec<String>> {
    let u32_at = |i: usize| -> Option<usize> {
        let b = bytes.get(i..i + 4)?;
        usize::try_from(u32::from_le_bytes([b[0], b[1], b[2], b[3]])).ok()
    };
    let n = u32_at(0)?;
    if n > 10_000 {
        return None;
    }
    // Header: count, then (key length, value length) per pair; then key\0value\0 ...
    let mut lens = Vec::with_capacity(n);
    for i in 0..n {
        lens.push((u32_at(4 + i * 8)?, u32_at(8 + i * 8)?));
    }
    let mut at = 4 + n * 8;
    let mut out = Vec::with_capacity(n);
    for (klen, vlen) in lens {
        let key = bytes.get(at..at + klen)?;
        at += klen + 1;
        let _value = bytes.get(at..at + vlen)?;
        at += vlen + 1;
        out.push(String::from_utf8(key.to_vec()).ok()?);
    }
    (at == bytes.len()).then_some(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Envoy's pairs format: count, then (key length, value length) per pair, then each
    /// key and value NUL-terminated.
    fn pairs(items: &[&str]) -> Vec<u8> {
        let mut out = u32::try_from(items.len())
            .unwrap_or(0)
            .to_le_bytes()
            .to_vec();
        for i in items {
            out.extend(u32::try_from(i.len()).unwrap_or(0).to_le_bytes());
            out.extend(0u32.to_le_bytes());
        }
        for i in items {
            out.extend(i.as_bytes());
            out.extend([0, 0]);
        }
        out
    }

    #[test]
    fn list_claims_in_pairs_format_and_plain_strings() {
        assert_eq!(
            parse_string_list(&pairs(&["eng", "canary-group"])),
            ["eng", "canary-group"]
        );
        assert_eq!(parse_string_list(&pairs(&[])), Vec::<String>::new());
        assert_eq!(parse_string_list(b"solo"), ["solo"]);
        assert_eq!(parse_string_list(b""), Vec::<String>::new());
    }
}
