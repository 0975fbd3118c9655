//! The per-attempt stage: each upstream attempt carries its own target's model id.
//!
//! Envoy walks a route's failover order itself (an aggregate cluster and a retry policy),
//! so the request filter, which runs once, can only write the first pick's model id. The
//! same module, configured with `{"stage": "attempt"}`, also runs as an upstream HTTP
//! filter on every aggregate cluster: once per attempt, after Envoy chose the endpoint.
//! It reads that endpoint's model id from its metadata (`filter_metadata.halo.model`,
//! written by the xDS translator and the standalone bootstrap) and puts it where the
//! request filter put the first pick's.
//!
//! The request filter tells the stage where that is in a note, so the stage never parses
//! the body: `body <start> <end> <model>` (the byte range of the model's JSON string,
//! quotes included, in the body as rewritten) or `path <wire> <model>`. The note is a
//! filter-state property of the request ([`ATTEMPT_PROPERTY`]), not a header: Envoy hands
//! every attempt's upstream filters the same request header map, so a header the stage
//! removed on the first attempt would be gone for the retry, and one left in place would
//! reach the provider. A client cannot set filter state.
//!
//! Each retry starts from a copy of the request body as the request filter left it, so
//! the note's byte range holds for every attempt; the path, shared like the headers, is
//! rewritten from whatever the previous attempt left (the rewrite is idempotent).
//!
//! When the endpoint's model is the one already written (the first attempt, normally),
//! the stage does nothing: no body copy on the common path.

use halo_policy::types::WireProtocol;

use crate::pipeline::PrefixEdit;

/// The request filter's note to the per-attempt stage: a filter-state property of the
/// request (Envoy's `wasm.` namespace), which every attempt's upstream filter can read.
pub const ATTEMPT_PROPERTY: &str = "halo_attempt";

/// Where the model id sits in the request the router replays to each attempt.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ModelAt {
    /// `body[start..end]` is the model's JSON string, quotes included.
    Body { start: usize, end: usize },
    /// The model is a path segment of this wire (bedrock `/model/{id}/op`, gemini).
    Path(WireProtocol),
}

/// What the request filter wrote: where, and which model id.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    pub at: ModelAt,
    pub model: String,
}

impl Note {
    /// The header value.
    pub fn encode(&self) -> String {
        match &self.at {
            ModelAt::Body { start, end } => format!("body {start} {end} {}", self.model),
            ModelAt::Path(wire) => format!("path {} {}", wire.as_str(), self.model),
        }
    }

    /// Read a header value written by [`Note::encode`]; `None` for anything else.
    pub fn decode(value: &str) -> Option<Note> {
        let (kind, rest) = value.split_once(' ')?;
        match kind {
            "body" => {
                let mut parts = rest.splitn(3, ' ');
                let start = parts.next()?.parse().ok()?;
                let end = parts.next()?.parse().ok()?;
                let model = parts.next()?.to_string();
                (start < end).then_some(Note {
                    at: ModelAt::Body { start, end },
                    model,
                })
            }
            "path" => {
                let (wire, model) = rest.split_once(' ')?;
                let wire = match wire {
                    "bedrock-invoke" => WireProtocol::BedrockInvoke,
                    "gemini" => WireProtocol::Gemini,
                    _ => return None,
                };
                Some(Note {
                    at: ModelAt::Path(wire),
                    model: model.to_string(),
                })
            }
            _ => None,
        }
    }

    /// The note for a body after [`halo_policy::admit::splice_model`] wrote `model` at
    /// `start`: the range of the JSON string now there.
    pub fn after_splice(start: usize, model: &str) -> Note {
        let len = serde_json::to_string(model).map_or(model.len() + 2, |s| s.len());
        Note {
            at: ModelAt::Body {
                start,
                end: start + len,
            },
            model: model.to_string(),
        }
    }
}

/// What this attempt needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Step {
    /// The endpoint serves the model already written (or names none): send as is.
    Keep,
    /// Replace `:path`.
    Path(String),
    /// Replace `body[start..end]` with `model` as a JSON string, once the body is in.
    Body {
        start: usize,
        end: usize,
        model: String,
    },
}

/// The step for an attempt whose endpoint metadata names `endpoint_model` (`None`: the
/// endpoint carries no model, e.g. a cluster not rendered by Halos). `path` gives the
/// request's `:path` now (an earlier attempt may have rewritten it); it is asked for only
/// when the model is in the path.
pub fn step(note: &Note, endpoint_model: Option<&str>, path: impl FnOnce() -> String) -> Step {
    let Some(model) = endpoint_model.filter(|m| !m.is_empty()) else {
        return Step::Keep;
    };
    match note.at {
        ModelAt::Body { .. } if model == note.model => Step::Keep,
        ModelAt::Body { start, end } => Step::Body {
            start,
            end,
            model: model.to_string(),
        },
        ModelAt::Path(wire) => {
            let path = path();
            let rewritten = crate::pipeline::rewrite_path_model(&path, wire, model);
            if rewritten == path {
                Step::Keep
            } else {
                Step::Path(rewritten)
            }
        }
    }
}

/// The edit putting `model` at `head[start..end]`, where `head` is the body's first
/// `end` bytes (or all of it), or `None` when that range does not hold a JSON string (the
/// body is not the one the note was written for): the attempt is then sent as is rather
/// than corrupted.
pub fn rewrite_head(head: &[u8], start: usize, end: usize, model: &str) -> Option<PrefixEdit> {
    let span = head.get(start..end)?;
    if span.len() < 2 || span[0] != b'"' || span[span.len() - 1] != b'"' {
        return None;
    }
    Some(PrefixEdit::model(head, start, end, model))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn notes_round_trip_and_garbage_is_ignored() {
        let n = Note::after_splice(10, "claude \"x\"");
        assert_eq!(Note::decode(&n.encode()), Some(n));
        let p = Note {
            at: ModelAt::Path(WireProtocol::BedrockInvoke),
            model: "anthropic.claude-3:0".into(),
        };
        assert_eq!(Note::decode(&p.encode()), Some(p));
        for bad in [
            "",
            "body",
            "body 1 x m",
            "body 5 5 m",
            "path openai m",
            "x 1 2 m",
        ] {
            assert_eq!(Note::decode(bad), None, "{bad:?}");
        }
    }

    #[test]
    fn the_same_model_needs_no_work_and_another_is_spliced_where_the_note_says() {
        let body = br#"{"model":"m-a","max_tokens":1}"#;
        let note = Note::after_splice(9, "m-a");
        assert_eq!(&body[9..14], br#""m-a""#);
        assert_eq!(
            step(&note, Some("m-a"), || "/v1/messages".to_string()),
            Step::Keep
        );
        assert_eq!(step(&note, None, || "/v1/messages".to_string()), Step::Keep);
        let Step::Body { start, end, model } =
            step(&note, Some("m-bb"), || "/v1/messages".to_string())
        else {
            panic!("a different model is a body step");
        };
        let edit = rewrite_head(&body[..end], start, end, &model).expect("a string is there");
        assert_eq!(edit.apply(body), br#"{"model":"m-bb","max_tokens":1}"#);
        // A range that is not a JSON string leaves the body alone.
        assert_eq!(rewrite_head(body, 0, 5, "x"), None);
        assert_eq!(rewrite_head(body, 9, 99, "x"), None);
    }

    #[test]
    fn a_path_model_is_rewritten_per_attempt() {
        let note = Note {
            at: ModelAt::Path(WireProtocol::BedrockInvoke),
            model: "a.m:0".into(),
        };
        assert_eq!(
            step(&note, Some("b.m:1"), || "/model/a.m%3A0/invoke".to_string()),
            Step::Path("/model/b.m%3A1/invoke".into())
        );
        // A retry after that attempt sees the path it left, and puts its own model back.
        assert_eq!(
            step(&note, Some("a.m:0"), || "/model/b.m%3A1/invoke".to_string()),
            Step::Path("/model/a.m%3A0/invoke".into())
        );
        assert_eq!(
            step(&note, Some("a.m:0"), || "/model/a.m%3A0/invoke".to_string()),
            Step::Keep
        );
    }
}
