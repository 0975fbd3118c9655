//! Writing a head edit ([`PrefixEdit`]: the model rewritten) into the request body Envoy
//! holds, copying as few bytes as this ABI allows.
//!
//! While a filter reads a body, Envoy holds it in two parts: what it buffered from earlier
//! pieces, and the piece handed to the current hook. When the hook returns (to continue or
//! to buffer), Envoy moves that piece after the buffered part. The ABI can drain either
//! part's front and append at either part's end; it cannot prepend. So an edit of the
//! head goes in as appends to the buffered part and a drain of the piece's front, and the
//! piece after the model (the conversation, up to megabytes) is never copied:
//!
//! - The model inside the piece (the usual case: the model is the first field and arrives
//!   with the first piece, when nothing is buffered yet): the prefix's bytes past the
//!   buffered part are appended to it, and the piece is drained up to the model's end.
//!   Only the prefix is copied.
//! - The model inside the buffered part: the buffered part is replaced by the prefix and
//!   its own bytes after the model; the piece stays. The buffered part is copied, never
//!   the piece.
//!
//! Why it matters: a body that arrives in one piece used to be copied back whole (a
//! megabyte for a long conversation), and the early edit copied back its first piece.

use halo_filter_core::pipeline::PrefixEdit;

use crate::ffi::envoy::{Body, Stream};

/// The calls that write an edit, in order: empty the buffered part (when
/// `drain_buffered`), append `append_buffered` to it, drain `drain_piece` bytes from the
/// piece's front.
#[derive(Debug, PartialEq, Eq)]
pub struct Writes<'a> {
    pub drain_buffered: bool,
    pub append_buffered: [&'a [u8]; 2],
    pub drain_piece: usize,
}

/// The writes that turn Envoy's `body` (its first `buffered` bytes buffered, the rest the
/// current piece, both still as received) into `edit` of it.
pub fn writes<'a>(edit: &'a PrefixEdit, body: &'a [u8], buffered: usize) -> Writes<'a> {
    let buffered = buffered.min(body.len());
    let drop = edit.drop.min(body.len());
    // The edit keeps the buffered bytes as they are: write only past them.
    if drop >= buffered && edit.prefix.get(..buffered) == body.get(..buffered) {
        return Writes {
            drain_buffered: false,
            append_buffered: [&edit.prefix[buffered..], &[]],
            drain_piece: drop - buffered,
        };
    }
    Writes {
        drain_buffered: true,
        append_buffered: [&edit.prefix, body.get(drop..buffered).unwrap_or_default()],
        drain_piece: drop.saturating_sub(buffered),
    }
}

/// Write `edit` of `body` into the request body Envoy holds. `body` is what Envoy holds
/// (its buffered part, then the current piece), untouched by any earlier write: the
/// writes are relative to it.
pub fn write(s: Stream<'_>, edit: &PrefixEdit, body: &[u8]) {
    let buffered = s.request_body_size(Body::Buffered);
    // A piece that is an earlier filter's whole buffer is the buffered part itself, and
    // a buffered part longer than the body is not the one `body` describes: replace all.
    if s.received_is_buffered() || buffered > body.len() {
        replace(s, edit, body);
        return;
    }
    let w = writes(edit, body, buffered);
    if w.drain_buffered {
        s.drain_request_body(Body::Buffered, usize::MAX);
    }
    for part in w.append_buffered {
        s.append_request_body(Body::Buffered, part);
    }
    s.drain_request_body(Body::Received, w.drain_piece);
}

/// Replace everything Envoy holds with `edit` of `body`, whatever Envoy holds now (after
/// an earlier write, `body` no longer describes it): the whole body is copied.
pub fn replace(s: Stream<'_>, edit: &PrefixEdit, body: &[u8]) {
    let rest = body.get(edit.drop..).unwrap_or_default();
    s.drain_request_body(Body::Buffered, usize::MAX);
    s.replace_request_body(Body::Received, &[&edit.prefix, rest]);
}

#[cfg(test)]
mod tests {
    use super::{PrefixEdit, writes};

    /// Envoy's two parts after the writes, joined as Envoy sends them.
    fn sent(edit: &PrefixEdit, body: &[u8], buffered: usize) -> (Vec<u8>, usize) {
        let w = writes(edit, body, buffered);
        let mut head = body[..buffered].to_vec();
        let mut piece = body[buffered..].to_vec();
        if w.drain_buffered {
            head.clear();
        }
        let copied: usize = w.append_buffered.iter().map(|p| p.len()).sum();
        for part in w.append_buffered {
            head.extend_from_slice(part);
        }
        piece.drain(..w.drain_piece.min(piece.len()));
        head.extend_from_slice(&piece);
        (head, copied)
    }

    #[test]
    fn every_split_of_the_body_sends_the_edited_body() {
        let body = br#"{"model":"haiku","messages":[{"role":"user","content":"hi"}]}"#;
        let start = body.iter().position(|&c| c == b'"').unwrap() + 8;
        let end = start + br#""haiku""#.len();
        for model in ["claude-haiku-4-5", "h", "haiku"] {
            let edit = PrefixEdit::model(body, start, end, model);
            let wanted = edit.apply(body);
            for buffered in 0..=body.len() {
                let (got, copied) = sent(&edit, body, buffered);
                assert_eq!(got, wanted, "model {model}, {buffered} bytes buffered");
                // The piece after the model is never copied; the buffered part only when
                // the model is in it.
                let most = if buffered <= start {
                    edit.prefix.len() - buffered
                } else {
                    edit.prefix.len() + buffered.saturating_sub(end)
                };
                assert!(copied <= most, "{copied} > {most} bytes copied");
            }
        }
    }

    #[test]
    fn the_usual_first_piece_copies_only_the_prefix() {
        let body = br#"{"model":"haiku","messages":[]}"#;
        let edit = PrefixEdit::model(body, 9, 16, "claude-haiku-4-5");
        let w = writes(&edit, body, 0);
        assert!(!w.drain_buffered);
        assert_eq!(w.append_buffered[0], edit.prefix.as_slice());
        assert_eq!(w.drain_piece, 16);
    }

    #[test]
    fn the_undo_edit_restores_the_body() {
        let body = br#"{"model":"haiku"}"#;
        for buffered in 0..=body.len() {
            assert_eq!(sent(&PrefixEdit::default(), body, buffered).0, body);
        }
    }
}
