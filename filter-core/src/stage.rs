//! The per-attempt stage's flow (an upstream filter, run once per attempt after Envoy
//! picked the endpoint): the request filter's note and the endpoint's facts into
//! [`crate::attempt`]'s plan, its edits back, through a [`Host`]. Both builds run this.

use halo_providers::ResponseConversion;
use halo_providers::eventstream::EventStreamToSse;

use crate::attempt::{self, Note, Work};
use crate::host::{Host, Level, Next};
use crate::metrics::Counter;
use crate::pipeline::PrefixEdit;
use halo_policy::cluster_names::EndpointFacts;

/// One attempt's state.
pub struct StageFlow {
    note: Option<Note>,
    /// What waits for the body.
    work: Work,
    /// The body of this attempt so far (only for work that rewrites it).
    body: Vec<u8>,
    /// The Bedrock event stream to SSE conversion of this attempt's answer.
    convert: Option<EventStreamToSse>,
}

impl Default for StageFlow {
    fn default() -> Self {
        StageFlow::new()
    }
}

impl StageFlow {
    pub fn new() -> StageFlow {
        StageFlow {
            note: None,
            work: Work::None,
            body: Vec::new(),
            convert: None,
        }
    }

    pub fn on_request_headers<H: Host>(&mut self, host: &mut H, end_of_stream: bool) -> Next {
        let Some(value) = host.attempt_note() else {
            return Next::Continue;
        };
        let facts = host.endpoint_facts();
        // The first pick's attempt, as the request filter left it: nothing to do, and
        // nothing to decode.
        let path = host.request_header(":path");
        if attempt::passes_as_left(&value, facts.as_deref(), path.as_deref()) {
            return Next::Continue;
        }
        let Some(note) = Note::decode(&value) else {
            return Next::Continue;
        };
        let facts = facts.and_then(|b| EndpointFacts::decode(&b));
        let plan = attempt::plan(&note, facts.as_ref());
        if let Work::Skip(skip) = &plan.work {
            return skip_attempt(host, skip);
        }
        if plan.keeps_filtered_request(&note) && path.as_deref() == Some(note.path.as_str()) {
            return Next::Continue;
        }
        for (name, value) in &plan.restore {
            host.set_request_header(name, value.as_deref());
        }
        if path.as_deref() != Some(plan.path.as_str()) {
            host.set_request_header(":path", Some(&plan.path));
            if plan.path != note.path {
                host.count(Counter::AttemptRewrites);
            }
        }
        if let Some(authority) = &plan.authority {
            host.set_request_header(":authority", Some(authority));
        }
        remove_headers(host, &plan.remove, &plan.remove_prefixes);
        self.note = Some(note);
        self.work = plan.work;
        match &self.work {
            Work::None | Work::Skip(_) => Next::Continue,
            Work::Splice { .. } if end_of_stream => Next::Continue,
            Work::Splice { .. } => {
                // The length changes: Envoy sends the rewritten body chunked.
                host.set_request_header("content-length", None);
                Next::Stop
            }
            Work::Translate { .. } if end_of_stream => {
                if self.translate_body(host, false) {
                    Next::Continue
                } else {
                    Next::Stop
                }
            }
            Work::Translate { .. } => Next::Stop,
        }
    }

    pub fn on_request_body<H: Host>(&mut self, host: &mut H, end_of_stream: bool) -> Next {
        let limit = match &self.work {
            Work::None | Work::Skip(_) => return Next::Continue,
            // The model sits in the head: a host that keeps the body readable copies
            // only that.
            Work::Splice { end, .. } => *end,
            Work::Translate { .. } => usize::MAX,
        };
        if H::PIECEWISE || end_of_stream {
            host.copy_request_body(&mut self.body, limit);
        }
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
                        host.write_body_edit(&edit, &body);
                        host.count(Counter::AttemptRewrites);
                    }
                    None => host.log(
                        Level::Warn,
                        "halo: per-attempt stage: the model is not where the request filter noted it; attempt sent as is",
                    ),
                }
                Next::Continue
            }
            work @ Work::Translate { .. } => {
                self.work = work;
                if self.translate_body(host, true) {
                    Next::Continue
                } else {
                    Next::Stop
                }
            }
            Work::None | Work::Skip(_) => Next::Continue,
        }
    }

    /// Translate the whole body for this attempt's target; false when the attempt was
    /// answered instead (a Skip). `in_body`: called from a body hook (else the request
    /// had no body).
    fn translate_body<H: Host>(&mut self, host: &mut H, in_body: bool) -> bool {
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
                skip_attempt(host, &skip);
                return false;
            }
        };
        host.set_request_header(":method", Some(out.method));
        host.set_request_header(":path", Some(&out.path));
        if let Some(authority) = &out.authority {
            host.set_request_header(":authority", Some(authority));
        }
        remove_headers(host, &out.remove_headers, &out.remove_header_prefixes);
        for (name, value) in &out.set_headers {
            host.set_request_header(name, Some(value));
        }
        if in_body {
            host.replace_request_body(&PrefixEdit::default(), &out.body);
        }
        for cause in &out.dropped {
            let cause = cause.as_str();
            if attempt::first_report_of(cause) {
                host.log(
                    Level::Info,
                    &format!("halo: per-attempt stage: translation drops {cause} (logged once)"),
                );
            }
        }
        if out.response == ResponseConversion::BedrockEventStreamToSse {
            self.convert = Some(EventStreamToSse::new());
        }
        host.count(Counter::AttemptRewrites);
        true
    }

    pub fn on_response_headers<H: Host>(&mut self, host: &mut H) -> Next {
        if self.convert.is_none() {
            return Next::Continue;
        }
        let status = host.response_header(":status");
        let content_type = host.response_header("content-type");
        if !attempt::converts_answer(status.as_deref(), content_type.as_deref()) {
            // An error answer (JSON) goes to the client as Bedrock wrote it.
            self.convert = None;
            return Next::Continue;
        }
        host.set_response_header("content-type", Some("text/event-stream"));
        host.set_response_header("content-length", None);
        Next::Continue
    }

    pub fn on_response_body<H: Host>(&mut self, host: &mut H, end_of_stream: bool) -> Next {
        let Some(conv) = self.convert.as_mut() else {
            return Next::Continue;
        };
        let chunk = host.response_body();
        let mut out = match attempt::convert_piece(conv, &chunk) {
            Ok(sse) => sse,
            Err((sse, why)) => {
                self.convert = None;
                host.log(
                    Level::Warn,
                    &format!("halo: per-attempt stage: Bedrock event stream unreadable: {why}"),
                );
                sse
            }
        };
        if end_of_stream && let Some(conv) = self.convert.take() {
            out.extend(attempt::finish_conversion(&conv));
        }
        // Each piece is replaced by the events it completed: streaming stays incremental.
        host.set_response_body(&out);
        Next::Continue
    }
}

/// Answer 502 bad_upstream for a target that cannot serve the request.
fn skip_attempt<H: Host>(host: &mut H, skip: &halo_providers::Skip) -> Next {
    host.log(
        Level::Info,
        &format!("halo: per-attempt stage: target skipped: {skip}"),
    );
    host.send_response(
        502,
        &[("content-type".into(), "application/json".into())],
        &attempt::skip_reply(skip),
    );
    Next::Stop
}

/// Remove `names`, and every header whose (lowercase) name starts with one of `prefixes`.
fn remove_headers<H: Host>(host: &mut H, names: &[&str], prefixes: &[&str]) {
    for name in names {
        host.set_request_header(name, None);
    }
    if prefixes.is_empty() {
        return;
    }
    for (name, _) in host.request_headers() {
        if prefixes.iter().any(|p| name.starts_with(p)) {
            host.set_request_header(&name, None);
        }
    }
}
