//! The per-attempt stage (an upstream filter, run once per attempt after Envoy picked the
//! endpoint): the request filter's note and the endpoint's facts into halo-filter's
//! `attempt` plan, its edits back. The same steps as the wasm build's stage.

use std::sync::Arc;

use halo_envoy_config::names::{ENDPOINT_FACTS_KEY, METADATA_NAMESPACE};
use halo_filter::attempt::{self, ATTEMPT_PROPERTY, Note, Work};
use halo_policy::cluster_names::EndpointFacts;
use halo_providers::ResponseConversion;
use halo_providers::eventstream::EventStreamToSse;

use crate::abi;
use crate::body_edit;
use crate::host::{Body, Next, Stream, log};
use crate::plugin::AttemptPlugin;

/// One attempt's state.
pub struct Stage {
    plugin: Arc<AttemptPlugin>,
    note: Option<Note>,
    /// What waits for the body.
    work: Work,
    /// The body of this attempt so far (only for work that rewrites it).
    body: Vec<u8>,
    /// The Bedrock event stream to SSE conversion of this attempt's answer.
    convert: Option<EventStreamToSse>,
}

impl Stage {
    pub fn new(plugin: Arc<AttemptPlugin>) -> Stage {
        Stage {
            plugin,
            note: None,
            work: Work::None,
            body: Vec::new(),
            convert: None,
        }
    }

    fn counted(&self, s: Stream) {
        if let Some(id) = self.plugin.rewrites {
            s.increment(id, &[]);
        }
    }

    pub fn on_request_headers(&mut self, s: Stream, end_of_stream: bool) -> Next {
        let Some(value) = s.filter_state(ATTEMPT_PROPERTY) else {
            return Next::Continue;
        };
        let facts = s.host_metadata_string(METADATA_NAMESPACE, ENDPOINT_FACTS_KEY);
        // The first pick's attempt, as the request filter left it: nothing to do, and
        // nothing to decode.
        let path = s.request_header(":path");
        if attempt::passes_as_left(&value, facts.as_deref(), path.as_deref()) {
            return Next::Continue;
        }
        let Some(note) = Note::decode(&value) else {
            return Next::Continue;
        };
        let facts = facts.and_then(|b| EndpointFacts::decode(&b));
        let plan = attempt::plan(&note, facts.as_ref());
        if let Work::Skip(skip) = &plan.work {
            return skip_attempt(s, skip);
        }
        if plan.keeps_filtered_request(&note) && path.as_deref() == Some(note.path.as_str()) {
            return Next::Continue;
        }
        for (name, value) in &plan.restore {
            s.set_request_header(name, value.as_deref());
        }
        if path.as_deref() != Some(plan.path.as_str()) {
            s.set_request_header(":path", Some(&plan.path));
            if plan.path != note.path {
                self.counted(s);
            }
        }
        if let Some(authority) = &plan.authority {
            s.set_request_header(":authority", Some(authority));
        }
        remove_headers(s, &plan.remove, &plan.remove_prefixes);
        self.note = Some(note);
        self.work = plan.work;
        match &self.work {
            Work::None | Work::Skip(_) => Next::Continue,
            Work::Splice { .. } if end_of_stream => Next::Continue,
            Work::Splice { .. } => {
                // The length changes: Envoy sends the rewritten body chunked.
                s.set_request_header("content-length", None);
                Next::Stop
            }
            Work::Translate { .. } if end_of_stream => {
                if self.translate_body(s, false) {
                    Next::Continue
                } else {
                    Next::Stop
                }
            }
            Work::Translate { .. } => Next::Stop,
        }
    }

    pub fn on_request_body(&mut self, s: Stream, end_of_stream: bool) -> Next {
        if matches!(self.work, Work::None | Work::Skip(_)) {
            return Next::Continue;
        }
        if s.received_is_buffered() {
            self.body.clear();
        }
        s.copy_request_body(Body::Received, &mut self.body);
        if !end_of_stream {
            return Next::Buffer;
        }
        match std::mem::replace(&mut self.work, Work::None) {
            Work::Splice { start, end, model } => {
                let body = std::mem::take(&mut self.body);
                match attempt::rewrite_head(
                    body.get(..end.min(body.len())).unwrap_or_default(),
                    start,
                    end,
                    &model,
                ) {
                    Some(edit) => {
                        body_edit::write(s, &edit, &body);
                        self.counted(s);
                    }
                    None => log(
                        abi::LOG_WARN,
                        "halo: per-attempt stage: the model is not where the request filter noted it; attempt sent as is",
                    ),
                }
                Next::Continue
            }
            work @ Work::Translate { .. } => {
                self.work = work;
                if self.translate_body(s, true) {
                    Next::Continue
                } else {
                    Next::Stop
                }
            }
            Work::None | Work::Skip(_) => Next::Continue,
        }
    }

    /// Translate the whole body for this attempt's target; false when the attempt was
    /// answered instead (a Skip).
    fn translate_body(&mut self, s: Stream, in_body: bool) -> bool {
        let Work::Translate { upstream, model } = std::mem::replace(&mut self.work, Work::None)
        else {
            return true;
        };
        let Some(note) = self.note.as_ref() else {
            return true;
        };
        let body = std::mem::take(&mut self.body);
        let out = match attempt::translate(note, &upstream, &model, &body) {
            Ok(out) => out,
            Err(skip) => {
                skip_attempt(s, &skip);
                return false;
            }
        };
        s.set_request_header(":method", Some(out.method));
        s.set_request_header(":path", Some(&out.path));
        if let Some(authority) = &out.authority {
            s.set_request_header(":authority", Some(authority));
        }
        remove_headers(s, &out.remove_headers, &out.remove_header_prefixes);
        for (name, value) in &out.set_headers {
            s.set_request_header(name, Some(value));
        }
        if in_body {
            s.drain_request_body(Body::Buffered, usize::MAX);
            s.replace_request_body(Body::Received, &[&out.body]);
        }
        for cause in &out.dropped {
            let cause = cause.as_str();
            if attempt::first_report_of(cause) {
                log(
                    abi::LOG_INFO,
                    &format!("halo: per-attempt stage: translation drops {cause} (logged once)"),
                );
            }
        }
        if out.response == ResponseConversion::BedrockEventStreamToSse {
            self.convert = Some(EventStreamToSse::new());
        }
        self.counted(s);
        true
    }

    pub fn on_response_headers(&mut self, s: Stream) {
        if self.convert.is_none() {
            return;
        }
        let status = s.response_header(":status");
        let content_type = s.response_header("content-type");
        if !attempt::converts_answer(status.as_deref(), content_type.as_deref()) {
            // An error answer (JSON) goes to the client as Bedrock wrote it.
            self.convert = None;
            return;
        }
        s.set_response_header("content-type", Some("text/event-stream"));
        s.set_response_header("content-length", None);
    }

    pub fn on_response_body(&mut self, s: Stream, end_of_stream: bool) {
        let Some(conv) = self.convert.as_mut() else {
            return;
        };
        let chunk = s.received_response_body();
        let mut out = match attempt::convert_piece(conv, &chunk) {
            Ok(sse) => sse,
            Err((sse, why)) => {
                self.convert = None;
                log(
                    abi::LOG_WARN,
                    &format!("halo: per-attempt stage: Bedrock event stream unreadable: {why}"),
                );
                sse
            }
        };
        if end_of_stream && let Some(conv) = self.convert.take() {
            out.extend(attempt::finish_conversion(&conv));
        }
        // Each piece is replaced by the events it completed: streaming stays incremental.
        s.replace_received_response_body(&out);
    }
}

/// Answer 502 bad_upstream for a target that cannot serve the request.
fn skip_attempt(s: Stream, skip: &halo_providers::Skip) -> Next {
    log(
        abi::LOG_INFO,
        &format!("halo: per-attempt stage: target skipped: {skip}"),
    );
    s.send_response(
        502,
        &[("content-type".into(), "application/json".into())],
        &attempt::skip_reply(skip),
    );
    Next::Stop
}

fn remove_headers(s: Stream, names: &[&str], prefixes: &[&str]) {
    for name in names {
        s.set_request_header(name, None);
    }
    if prefixes.is_empty() {
        return;
    }
    for (name, _) in s.request_headers() {
        if prefixes.iter().any(|p| name.starts_with(p)) {
            s.set_request_header(&name, None);
        }
    }
}
