//! A JSON object edited at the top level only: every value keeps its exact bytes and the
//! keys keep their order, so a translated body differs from the client's only where the
//! translation says (prompt-cache prefixes, number spellings and escapes are untouched).
//! serde_json's own map would sort keys (preserve_order is off in this workspace).

use std::fmt;

use serde::Deserializer as _;
use serde::de::{MapAccess, Visitor};
use serde_json::value::RawValue;

/// A top-level JSON object as (key, raw value) pairs, borrowed from the body.
pub(crate) struct RawObject<'a> {
    entries: Vec<(String, &'a RawValue)>,
    /// Keys the translation set: (key, JSON text, placed before the client's keys).
    added: Vec<(String, String, bool)>,
}

impl<'a> RawObject<'a> {
    /// Parse `body` as one JSON object; duplicate top-level keys are refused (the gateway
    /// and the upstream must not read two different values from one body).
    pub(crate) fn parse(body: &'a [u8]) -> Result<RawObject<'a>, String> {
        let first = body.iter().find(|b| !b.is_ascii_whitespace());
        if first != Some(&b'{') {
            return Err("the request body is not a JSON object".to_string());
        }
        let mut de = serde_json::Deserializer::from_slice(body);
        let entries = de
            .deserialize_map(EntriesVisitor)
            .map_err(|e| format!("the request body is not valid JSON: {e}"))?;
        de.end()
            .map_err(|e| format!("the request body is not valid JSON: {e}"))?;
        let mut seen = std::collections::BTreeSet::new();
        for (key, _) in &entries {
            if !seen.insert(key.as_str()) {
                return Err(format!("the request body has \"{key}\" twice"));
            }
        }
        Ok(RawObject {
            entries,
            added: Vec::new(),
        })
    }

    /// Remove `key`; whether it was there.
    pub(crate) fn remove(&mut self, key: &str) -> bool {
        let before = self.entries.len() + self.added.len();
        self.entries.retain(|(k, _)| k != key);
        self.added.retain(|(k, _, _)| k != key);
        before != self.entries.len() + self.added.len()
    }

    /// Set `key` to the JSON text `value` (replacing any), placed first.
    pub(crate) fn set_first(&mut self, key: &str, value: String) {
        self.remove(key);
        self.added.push((key.to_string(), value, true));
    }

    /// Set `key` to the JSON text `value` (replacing any), placed last.
    pub(crate) fn set_last(&mut self, key: &str, value: String) {
        self.remove(key);
        self.added.push((key.to_string(), value, false));
    }

    pub(crate) fn to_bytes(&self) -> Vec<u8> {
        let mut out = Vec::new();
        out.push(b'{');
        let mut first = true;
        let mut push = |out: &mut Vec<u8>, key: &str, value: &str| {
            if !first {
                out.push(b',');
            }
            first = false;
            // Serializing a str cannot fail.
            out.extend_from_slice(serde_json::to_string(key).unwrap_or_default().as_bytes());
            out.push(b':');
            out.extend_from_slice(value.as_bytes());
        };
        for (k, v, _) in self.added.iter().filter(|(_, _, front)| *front) {
            push(&mut out, k, v);
        }
        for (k, v) in &self.entries {
            push(&mut out, k, v.get());
        }
        for (k, v, _) in self.added.iter().filter(|(_, _, front)| !*front) {
            push(&mut out, k, v);
        }
        out.push(b'}');
        out
    }
}

struct EntriesVisitor;

impl<'de> Visitor<'de> for EntriesVisitor {
    type Value = Vec<(String, &'de RawValue)>;

    fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("a JSON object")
    }

    fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
        let mut entries = Vec::new();
        while let Some(key) = map.next_key::<String>()? {
            let value: &'de RawValue = map.next_value()?;
            entries.push((key, value));
        }
        Ok(entries)
    }
}
