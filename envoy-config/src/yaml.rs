//! A deterministic YAML printer for JSON values (block style; strings as JSON strings,
//! which YAML reads as double-quoted scalars). Enough for Envoy configuration: no
//! anchors, no multi-line scalars, keys in the map's order.

use serde_json::Value;

/// `value` as a YAML document (trailing newline).
pub fn to_yaml(value: &Value) -> String {
    let mut out = String::new();
    match value {
        Value::Object(m) if !m.is_empty() => write_map(&mut out, m, 0),
        Value::Array(a) if !a.is_empty() => write_seq(&mut out, a, 0),
        scalar => {
            out.push_str(&scalar_text(scalar));
            out.push('\n');
        }
    }
    out
}

fn write_map(out: &mut String, map: &serde_json::Map<String, Value>, indent: usize) {
    for (key, value) in map {
        out.push_str(&" ".repeat(indent));
        out.push_str(&key_text(key));
        out.push(':');
        write_value(out, value, indent);
    }
}

fn write_seq(out: &mut String, items: &[Value], indent: usize) {
    for item in items {
        out.push_str(&" ".repeat(indent));
        out.push('-');
        match item {
            Value::Object(m) if !m.is_empty() => {
                // The first key shares the dash's line; the rest align under it.
                let mut first = true;
                for (key, value) in m {
                    if first {
                        out.push(' ');
                        first = false;
                    } else {
                        out.push_str(&" ".repeat(indent + 2));
                    }
                    out.push_str(&key_text(key));
                    out.push(':');
                    write_value(out, value, indent + 2);
                }
            }
            other => write_value(out, other, indent),
        }
    }
}

fn write_value(out: &mut String, value: &Value, indent: usize) {
    match value {
        Value::Object(m) if !m.is_empty() => {
            out.push('\n');
            write_map(out, m, indent + 2);
        }
        Value::Array(a) if !a.is_empty() => {
            out.push('\n');
            write_seq(out, a, indent + 2);
        }
        scalar => {
            out.push(' ');
            out.push_str(&scalar_text(scalar));
            out.push('\n');
        }
    }
}

fn scalar_text(value: &Value) -> String {
    match value {
        Value::Object(_) => "{}".to_string(),
        Value::Array(_) => "[]".to_string(),
        // Null, booleans, numbers and JSON strings are all valid YAML as they print.
        other => other.to_string(),
    }
}

fn key_text(key: &str) -> String {
    let plain = key
        .chars()
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && key
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "_.-".contains(c));
    if plain {
        key.to_string()
    } else {
        Value::String(key.to_string()).to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn prints_nested_maps_and_sequences() {
        let v = json!({"a": {"b": [1, {"c": "x", "d": []}], "@type": "t"}, "e": "line\nbreak"});
        assert_eq!(
            to_yaml(&v),
            "a:\n  \"@type\": \"t\"\n  b:\n    - 1\n    - c: \"x\"\n      d: []\ne: \"line\\nbreak\"\n"
        );
    }
}
