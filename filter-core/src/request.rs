//! The request filter's flow (in the connection manager): Envoy's request through
//! [`crate::pipeline`], its answer back, through a [`Host`]. Both builds run this.
//!
//! Headers: identity, admit's header checks, and which headers hygiene removes. Body:
//! copied as it arrives and scanned while the upload runs (so when the last byte is in
//! only the last piece is left to scan), then the decision, the route pick and the model
//! edit, written into the request with the stamps and the per-attempt note.

use std::sync::Arc;

use halo_policy::Snapshot;
use halo_policy::admit;
use halo_policy::body_scan::Incremental;
use halo_policy::cluster_names;
use halo_policy::decide::UNKNOWN_RING;
use halo_policy::types::{Target, WireProtocol};

use crate::account::Account;
use crate::attempt::Note;
use crate::attempt::{self};
use crate::breaker::Failover;
use crate::cidr;
use crate::config::{Config, IdentityMode, ShadowSettings};
use crate::host::{Host, Level, Next};
use crate::hygiene;
use crate::metrics::Counter;
use crate::pipeline::{self, Forward, Head, Pending, PrefixEdit, Reply};
use crate::shadow;
use halo_contract::names::KEY_MISSING_HEADER;
use halo_policy::decide::{Caller, Decision, ShadowMirror};

/// The message of the answer when every target of a model call failed.
pub const ALL_FAILED_MESSAGE: &str =
    "every target of this model failed or is unavailable; try again later";

/// The configuration a request runs under: the settings, and the snapshot in force (the
/// policy with the kill list applied, which a poll may replace at any time).
pub trait Policy {
    fn config(&self) -> &Config;
    /// The snapshot in force now.
    fn snapshot(&self) -> Arc<Snapshot>;
}

/// One request's state.
#[derive(Default)]
pub struct RequestFlow {
    pending: Option<Pending>,
    /// The request headers as they reached this filter, names lowercase.
    headers: Vec<(String, String)>,
    /// The body length the client announced (`content-length`), read once.
    announced: Option<u64>,
    /// The body received so far, copied piece by piece as it arrives so the scan runs
    /// while the upload does. Grown as the bytes arrive, never from the announced length
    /// alone: a client could announce maxBodyBytes and send nothing ([`reservation`]).
    body: Vec<u8>,
    scan: Option<Incremental>,
    /// The model edit already written into Envoy's buffer while the body was arriving
    /// ([`RequestFlow::edit_early`]), and whether that was tried.
    early_edit: Option<PrefixEdit>,
    early_tried: bool,
    removals: Vec<String>,
    ring: Option<String>,
    variant: Option<String>,
    /// The wire of a model call routed to its targets (the answer path checks whether they
    /// all failed).
    routed: Option<WireProtocol>,
    /// The request is counted already (its answer was replaced: Envoy may end the stream
    /// while the hook that replaced it still runs, and a native build then cannot run
    /// the stream's end for it).
    counted: bool,
    /// The response side's account of a decided model call.
    account: Option<Account>,
    /// A call several targets can serve: its attempts are recorded in the breakers.
    failover: Option<Failover>,
}

/// The answer when the filter has no configuration (its configuration was refused).
pub fn unavailable() -> Reply {
    Reply {
        status: 503,
        headers: vec![("content-type".into(), "application/json".into())],
        body: br#"{"type":"error","error":{"type":"policy_unavailable","message":"the halo filter has no policy"}}"#.to_vec(),
        reason: "config",
    }
}

impl RequestFlow {
    pub fn new() -> RequestFlow {
        RequestFlow::default()
    }

    /// Answer the request locally with `reply` (and count an identity refusal).
    pub fn reply<H: Host>(&mut self, host: &mut H, reply: Reply) -> Next {
        self.pending = None;
        if reply.reason == "auth" {
            host.count(Counter::AuthFailures);
        }
        host.send_response(reply.status, &reply.headers, &reply.body);
        Next::Stop
    }

    pub fn on_request_headers<H: Host>(
        &mut self,
        host: &mut H,
        policy: &impl Policy,
        end_of_stream: bool,
    ) -> Next {
        let cfg = policy.config();
        let headers = host.request_headers();
        let claims = match cfg.identity.mode {
            Some(IdentityMode::Jwt) => host.verified_claims(&cfg.identity, &headers),
            _ => None,
        };
        // Only trusted_header mode looks at the peer: no call otherwise.
        let peer = (cfg.identity.mode == Some(IdentityMode::TrustedHeader))
            .then(|| host.peer_address())
            .flatten()
            .and_then(|a| cidr::peer_ip(&a));
        let head = Head::new(&headers, peer, claims);
        self.removals = hygiene::removals(cfg, &headers);
        let head_result = pipeline::on_head(cfg, &head);
        self.announced = pipeline::content_length(&headers);
        self.headers = headers;
        match head_result {
            Err(reply) => self.reply(host, reply),
            Ok(pending) => {
                if admit::body_carries_model(&pending.method, &pending.path) {
                    self.scan = Some(Incremental::new());
                }
                self.pending = Some(pending);
                if end_of_stream {
                    self.finish(host, policy, false)
                } else {
                    Next::Stop
                }
            }
        }
    }

    /// A piece of the body arrived.
    pub fn on_request_body<H: Host>(
        &mut self,
        host: &mut H,
        policy: &impl Policy,
        end_of_stream: bool,
    ) -> Next {
        if self.pending.is_none() {
            return Next::Continue;
        }
        let cfg = policy.config();
        let max = cfg.max_body_bytes;
        let held = self.body.len();
        let total = host.request_body_total(held);
        if u64::try_from(total).unwrap_or(u64::MAX) > max {
            return self.reply(host, Reply::too_large(max));
        }
        if let Some(room) = reservation(
            self.announced,
            held,
            self.body.capacity(),
            total.saturating_sub(held),
            max,
        ) {
            self.body.reserve_exact(room.saturating_sub(held));
        }
        host.copy_request_body(&mut self.body, usize::MAX);
        // All the announced bytes are here, though Envoy has not said the body ended
        // (HTTP/1 ends it with an empty piece of its own): a piecewise host finishes now,
        // while this piece is still apart from what Envoy buffered, so the edit copies
        // only the head; the empty end then passes through.
        let complete = H::PIECEWISE && self.announced == u64::try_from(self.body.len()).ok();
        if !end_of_stream && !complete {
            if let Some(scan) = self.scan.as_mut()
                && scan.feed(&self.body).is_err()
            {
                // Invalid already, whatever follows: refused now with the scan's reason
                // (the error sticks), without waiting for the rest.
                return self.finish(host, policy, true);
            }
            if H::PIECEWISE {
                self.edit_early(host, policy);
            }
            return Next::Buffer;
        }
        self.finish(host, policy, true)
    }

    /// Once the model's value has arrived in a long body that has not all arrived, write
    /// the model edit into Envoy's buffer now, while the model is in the piece in hand
    /// (piecewise hosts only).
    ///
    /// Why: the dynamic-module ABI can drain a body's front and append at its end but not
    /// prepend, so an edit of the head made once the model has moved into Envoy's
    /// buffered part rewrites that part: for a long conversation, most of the body. Made
    /// when the model arrives (in the first piece when it is the first field, as coding
    /// tools send it), it writes only the edited head, and the pieces after it are
    /// buffered by Envoy untouched. The target comes from the same pipeline step the end
    /// runs; the end checks it got the same edit ([`end_write`]) and rewrites the body in
    /// full if not (a kill or a policy change in between, or a refusal). A step that
    /// refuses here refuses nothing: the end decides, in its own order (an invalid body is
    /// a 400 before an unknown model is).
    fn edit_early<H: Host>(&mut self, host: &mut H, policy: &impl Policy) {
        if self.early_tried {
            return;
        }
        let (Some(pending), Some(scan)) = (&self.pending, &self.scan) else {
            return;
        };
        let found = scan.found();
        if found.model.is_none() {
            return;
        }
        self.early_tried = true;
        // Only for a long announced body: a short one, or one without a length (chunked),
        // waits until it is complete, which saves the pipeline's second run.
        if self
            .announced
            .is_none_or(|total| total < EARLY_EDIT_MIN_BODY)
        {
            return;
        }
        let snap = policy.snapshot();
        let cfg = policy.config();
        // A tentative run: it takes no breaker's probe (the end does, and corrects the
        // edit if its lead differs). Nothing recorded (the common case): no clock read,
        // no key.
        let mut admit = |t: &Target| {
            host.with_breakers(|b| {
                b.is_empty()
                    || b.would_admit(&cfg.breaker, &cluster_names::target_cluster(t), host.now())
            })
        };
        let Ok(forward) = pipeline::on_body(
            cfg,
            &snap,
            pending,
            &self.body,
            Some(Ok(found)),
            now_ms(host),
            &mut admit,
        ) else {
            return;
        };
        if let Some(edit) = forward.body
            && !edit.keeps(&self.body)
        {
            host.write_body_edit(&edit, &self.body);
            self.early_edit = Some(edit);
        }
    }

    /// The body-time step, and writing its result into the request.
    fn finish<H: Host>(&mut self, host: &mut H, policy: &impl Policy, in_body: bool) -> Next {
        let Some(pending) = self.pending.take() else {
            return Next::Continue;
        };
        let body = std::mem::take(&mut self.body);
        let scanned = self.scan.take().map(|scan| scan.finish(&body));
        let cfg = policy.config();
        let snap = policy.snapshot();
        let mut admit = |t: &Target| {
            host.with_breakers(|b| {
                b.is_empty() || b.admit(&cfg.breaker, &cluster_names::target_cluster(t), host.now())
            })
        };
        let now = now_ms(host);
        match pipeline::on_body(cfg, &snap, &pending, &body, scanned, now, &mut admit) {
            Err(reply) => self.reply(host, reply),
            Ok(forward) => {
                self.apply(host, cfg, &snap, &pending, forward, &body, in_body);
                Next::Continue
            }
        }
    }

    #[allow(clippy::too_many_arguments)]
    fn apply<H: Host>(
        &mut self,
        host: &mut H,
        cfg: &Config,
        snap: &Snapshot,
        pending: &Pending,
        mut forward: Forward,
        body: &[u8],
        in_body: bool,
    ) {
        for name in hygiene::to_remove(&self.removals, &self.headers, &forward.stamps) {
            host.set_request_header(name, None);
        }
        if let Some(path) = &forward.path {
            host.set_request_header(":path", Some(path));
        }
        if in_body {
            // An edit that writes back the bytes received (the alias is the provider's
            // model id) is no edit: the body stays in Envoy's buffer as it came.
            let wanted = forward.body.as_ref().filter(|edit| !edit.keeps(body));
            match end_write(self.early_edit.as_ref(), wanted) {
                EndWrite::Nothing => {}
                EndWrite::Edit(edit) => host.write_body_edit(edit, body),
                EndWrite::Replace(edit) => host.replace_request_body(edit, body),
                EndWrite::Original => host.replace_request_body(&PrefixEdit::default(), body),
            }
            if let Some(edit) = &forward.body
                && edit.prefix.len() != edit.drop
            {
                // The whole body is here, so its new length is known: keep the upstream
                // request framed by length (a chunked one costs Envoy and the provider
                // more). Without a length the client sent it chunked, and so does Envoy.
                let new_length = edit.prefix.len() + body.len() - edit.drop.min(body.len());
                let length = self.announced.map(|_| new_length.to_string());
                host.set_request_header("content-length", length.as_deref());
            }
        }
        if let Some(mut note) = forward.attempt_note.take() {
            self.routed = Some(note.wire);
            // Every attempt starts from the client's values of the headers a translation
            // changes: an earlier attempt's changes stay in the shared header map.
            // The client's credentials are still here only with forwardAuth (hygiene
            // removed them otherwise): noted so each pass-through attempt gets them back.
            // Read from the headers kept at request-headers time, less what hygiene removed:
            // nothing else changes them in between, and each read from Envoy is a call.
            note.headers = attempt::noted_headers(&self.headers, &self.removals);
            host.set_attempt_note(&note.encode(forward.first_pick.as_ref()));
            if let (Some(settings), Some(decision)) = (&cfg.shadow, &forward.decision)
                && let Some(mirror) = &decision.shadow
            {
                mirror_call(
                    host, settings, snap, pending, decision, mirror, &note, &forward, body,
                );
            }
        }
        for (name, value) in &forward.stamps {
            host.set_request_header(name, Some(value));
        }
        // The stamps name the cluster (the route's cluster header); Envoy chose the
        // route's cluster before this filter ran.
        host.refresh_route();
        if cfg.kill_switch_misconfigured() {
            host.set_request_header(hygiene::KILLSWITCH, Some(hygiene::KILLSWITCH_MISCONFIGURED));
        }
        if let Some(d) = &forward.decision {
            host.count(Counter::Decisions {
                ring: &d.ring,
                variant: forward.variant.as_deref(),
                source: d.source.as_str(),
            });
        }
        if let Some(call) = forward.account.take() {
            self.account = Some(Account::start(host, call));
        }
        self.failover = forward.failover.take();
        self.ring = Some(forward.ring);
        self.variant = forward.variant;
    }

    /// The answer's headers. When every attempt of a model call failed, Envoy sends on
    /// the last failure it met: a provider's 5xx or 429 body, or its own plain-text 503
    /// for a refused connection. The filter answers 503 `no_available_target` in the
    /// client wire's error shape instead ([`every_target_failed`]). Decidable here: the
    /// router retries each such failure while attempts and targets remain (the route's
    /// `retry_on`), so one that reaches the request filter is the last. A streamed answer
    /// began with a success and passes untouched.
    ///
    /// A decided call's account reads which target served ([`Account`]) when the answer
    /// is passed on.
    pub fn on_response_headers<H: Host>(
        &mut self,
        host: &mut H,
        policy: &impl Policy,
        end_of_stream: bool,
    ) -> Next {
        // An attempt refused for its upstream's missing key (the credential chain's
        // `upstream_auth_error`, which logged where the key was looked for): counted by
        // upstream, the marker kept from the client.
        if let Some(upstream) = host.response_header(KEY_MISSING_HEADER) {
            host.count(Counter::UpstreamAuthErrors {
                upstream: &upstream,
            });
            host.set_response_header(KEY_MISSING_HEADER, None);
        }
        let status = host
            .response_header(":status")
            .and_then(|s| s.parse::<u16>().ok());
        let Some(wire) = self.routed.take() else {
            return self.account_headers(host, policy, status, end_of_stream);
        };
        // Envoy's details only when they decide something: a status that moves a call on,
        // or the outcome of a call the breakers watch.
        let details = (moves_on(status) || self.failover.is_some())
            .then(|| host.response_code_details())
            .flatten();
        let outcome = attempt_outcome(status, details.as_deref());
        if let Some(failover) = self.failover.take() {
            let attempts = host.attempt_count();
            let now = host.now();
            host.with_breakers(|b| failover.record(b, attempts, outcome, now));
        }
        if outcome != Some(true) {
            return self.account_headers(host, policy, status, end_of_stream);
        }
        host.log(
            Level::Info,
            &format!(
                "halo: every target of a model call failed (last: {} {}); answered 503 no_available_target",
                status.unwrap_or(0),
                details.as_deref().unwrap_or("-"),
            ),
        );
        let reply = Reply::no_available_target(wire, ALL_FAILED_MESSAGE);
        self.count_request(host, u32::from(reply.status));
        host.send_response(reply.status, &reply.headers, &reply.body);
        Next::Stop
    }

    fn account_headers<H: Host>(
        &mut self,
        host: &mut H,
        policy: &impl Policy,
        status: Option<u16>,
        end_of_stream: bool,
    ) -> Next {
        if let Some(account) = self.account.as_mut() {
            account.on_response_headers(host, policy.snapshot(), status, end_of_stream);
        }
        Next::Continue
    }

    /// A piece of the answer: metered as it passes, never held.
    pub fn on_response_body<H: Host>(&mut self, host: &mut H, end_of_stream: bool) -> Next {
        if let Some(account) = self.account.as_mut() {
            account.on_response_body(host, end_of_stream);
        }
        Next::Continue
    }

    /// The stream ended: count it by ring, variant and status, and a decided call's
    /// tokens and cost.
    pub fn on_stream_complete<H: Host>(&mut self, host: &mut H) {
        if let Some(failover) = self.failover.take() {
            // No answer came (the client went away, or the stream was reset): every
            // attempt before the last failed; the last one's outcome is unknown.
            let attempts = host.attempt_count();
            let now = host.now();
            host.with_breakers(|b| failover.record(b, attempts, None, now));
        }
        let status = host.response_code().unwrap_or(0);
        self.count_request(host, status);
        if let Some(account) = self.account.as_mut() {
            let ring = self.ring.as_deref().unwrap_or(UNKNOWN_RING);
            account.on_stream_complete(host, ring, self.variant.as_deref());
        }
    }

    /// Count the request by ring, variant and `status`, once.
    fn count_request<H: Host>(&mut self, host: &mut H, status: u32) {
        if std::mem::replace(&mut self.counted, true) {
            return;
        }
        host.count(Counter::Requests {
            ring: self.ring.as_deref().unwrap_or(UNKNOWN_RING),
            variant: self.variant.as_deref(),
            status,
        });
    }
}

/// The host's clock in Unix milliseconds (what an exhausted budget's `untilMs` is read against).
fn now_ms<H: Host>(host: &H) -> i64 {
    i64::try_from(host.now().as_millis()).unwrap_or(i64::MAX)
}

/// Build the shadow job of a decided call ([`shadow`]) and hand it to Envoy, which sends
/// it on its own: the live call goes on at once, whatever becomes of the job.
#[allow(clippy::too_many_arguments)]
fn mirror_call<H: Host>(
    host: &mut H,
    settings: &ShadowSettings,
    snap: &Snapshot,
    pending: &Pending,
    decision: &Decision,
    mirror: &ShadowMirror,
    note: &Note,
    forward: &Forward,
    received: &[u8],
) {
    let Caller::Verified(subject) = &pending.caller else {
        return;
    };
    // Every attempt starts from the body as the request filter leaves it.
    let edited;
    let body = match &forward.body {
        Some(edit) => {
            edited = edit.apply(received);
            edited.as_slice()
        }
        None => received,
    };
    let call = shadow::Call {
        snap,
        mirror,
        ring: &decision.ring,
        user: &subject.user,
        pick_key: pending.pick_key.as_deref(),
        alias: &decision.alias,
        note,
        body,
        now_unix_ms: u64::try_from(host.now().as_millis()).unwrap_or(u64::MAX),
    };
    let outcome = match shadow::build(settings, &call) {
        Err(skip) => skip.as_str(),
        Ok(job) => {
            let envelope = job.envelope();
            let headers = shadow::callout_headers(settings, envelope.len());
            if host.dispatch(&settings.cluster, &headers, &envelope, settings.timeout_ms) {
                shadow::SENT
            } else {
                shadow::NOT_SENT
            }
        }
    };
    host.count(Counter::ShadowJobs { outcome });
}

/// Whether an answer with `status`, which Envoy describes as `details` (its response
/// code details), is the last failure of a model call's attempts: a status that moves an
/// attempt to the next target (5xx, 429: the route's `retry_on`) that came from an
/// upstream (`via_upstream`) or from Envoy failing to reach one (`upstream_*`: a refused
/// or reset connection, a timeout; `no_healthy_upstream`: every target's breaker open).
/// A refusal of the gateway's own on an attempt (the per-attempt stage's `bad_upstream`,
/// the credential chain's `upstream_auth_error`) is a filter's local reply, with other
/// details, and passes as it is.
pub fn every_target_failed(status: Option<u16>, details: Option<&str>) -> bool {
    attempt_outcome(status, details) == Some(true)
}

/// How the attempt that produced an answer with `status` and `details` ended for the
/// breakers ([`crate::breaker`]): `Some(true)` failed (it moved the call on), `Some(false)`
/// the upstream answered, `None` when the answer is not an upstream's (a filter's local
/// reply: the target was never asked).
pub fn attempt_outcome(status: Option<u16>, details: Option<&str>) -> Option<bool> {
    let from_upstream = details.is_some_and(|d| {
        d == "via_upstream" || d.starts_with("upstream_") || d == "no_healthy_upstream"
    });
    from_upstream.then(|| moves_on(status))
}

/// Whether `status` moves a call to its next target (the route's `retry_on`: 5xx, 429).
fn moves_on(status: Option<u16>) -> bool {
    status.is_some_and(|s| {
        s >= 500 || halo_contract::attempts::RETRIABLE_STATUS_CODES.contains(&u32::from(s))
    })
}

/// The least announced body length for which [`RequestFlow::edit_early`] edits before
/// the end: the copy it saves (what Envoy buffered before the last piece) must outweigh
/// running the pipeline twice.
const EARLY_EDIT_MIN_BODY: u64 = 64 * 1024;

/// What the end of the body writes into Envoy's buffer, given the edit written while the
/// body arrived (`early`) and the one the end wants (`wanted`).
#[derive(Debug, PartialEq, Eq)]
enum EndWrite<'a> {
    /// Envoy's buffer already holds what should go upstream.
    Nothing,
    /// Write this edit into Envoy's buffer, which still holds the body as received.
    Edit(&'a PrefixEdit),
    /// Replace everything with this edit of the body as received: the early edit wrote
    /// another one, so Envoy's buffer no longer holds the body as received.
    Replace(&'a PrefixEdit),
    /// Replace everything with the body as received (an early edit is to be undone).
    Original,
}

fn end_write<'a>(early: Option<&PrefixEdit>, wanted: Option<&'a PrefixEdit>) -> EndWrite<'a> {
    match (early, wanted) {
        (None, None) => EndWrite::Nothing,
        (Some(early), Some(wanted)) if early == wanted => EndWrite::Nothing,
        (None, Some(wanted)) => EndWrite::Edit(wanted),
        (Some(_), Some(wanted)) => EndWrite::Replace(wanted),
        (Some(_), None) => EndWrite::Original,
    }
}

/// The room to make for the body before a piece of `received` bytes is copied onto the
/// `held` bytes copied so far (in a buffer of `capacity`): the total to reserve, or `None`
/// to let the buffer grow as it does.
///
/// Growing from nothing re-copies the body at each doubling: a 1 MB body whose first
/// piece is small (HTTP/1 clients often send the headers and the body's first bytes
/// together) was copied 896 KB more on the way (callgrind). The first piece reserves the
/// announced length, but at most eight times that piece (and 128 KiB for a small one):
/// reserving the announced length outright would let a client that announces
/// maxBodyBytes and sends a byte make every request allocate that much. A body that
/// outgrows that first room has sent at least 128 KiB, and then the rest of the announced
/// length is reserved at once: one more copy, of what arrived first.
fn reservation(
    announced: Option<u64>,
    held: usize,
    capacity: usize,
    received: usize,
    max: u64,
) -> Option<usize> {
    let needed = held.saturating_add(received);
    if needed <= capacity {
        return None;
    }
    let announced = announced
        .filter(|a| *a <= max)
        .and_then(|a| usize::try_from(a).ok())?;
    if held == 0 {
        let first_room = received.max(16 * 1024).saturating_mul(8);
        return Some(announced.min(first_room).max(needed));
    }
    // More than announced: the length was wrong, and Envoy's codec refuses the request;
    // nothing to plan for.
    (announced >= needed).then_some(announced)
}

#[cfg(test)]
mod tests {
    use super::{EndWrite, PrefixEdit, end_write, reservation};

    #[test]
    fn the_end_rewrites_only_when_the_early_edit_is_not_the_one_wanted() {
        let edit = |model: &str| PrefixEdit {
            drop: 16,
            prefix: format!(r#"{{"model":"{model}""#).into_bytes(),
        };
        let (a, b) = (edit("claude-haiku-4-5"), edit("haiku-b-model"));
        // Nothing written early and nothing wanted, or the same edit: nothing to write.
        assert_eq!(end_write(None, None), EndWrite::Nothing);
        assert_eq!(end_write(Some(&a), Some(&a.clone())), EndWrite::Nothing);
        // Not written early (a body in one piece): the end writes it.
        assert_eq!(end_write(None, Some(&a)), EndWrite::Edit(&a));
        // The decision changed between (a kill): the end's edit replaces the early one.
        assert_eq!(end_write(Some(&a), Some(&b)), EndWrite::Replace(&b));
        // The end wants the body as sent: the early edit is undone.
        assert_eq!(end_write(Some(&a), None), EndWrite::Original);
    }

    #[test]
    fn the_body_is_reserved_once_small_then_once_in_full() {
        const MAX: u64 = 1 << 25;
        // A 100 KB body whose first piece is 16 KB: room for all of it at once.
        assert_eq!(reservation(Some(100_000), 0, 0, 16_384, MAX), Some(100_000));
        // A client announcing the maximum and sending one byte gets 128 KiB, not 32 MiB.
        assert_eq!(reservation(Some(1 << 25), 0, 0, 1, MAX), Some(128 * 1024));
        // A 1 MB body whose first piece is 1,224 bytes: 128 KiB first; once it outgrows
        // that, the announced length in one step (not three doublings).
        let first = reservation(Some(1_048_462), 0, 0, 1_224, MAX);
        assert_eq!(first, Some(128 * 1024));
        assert_eq!(
            reservation(Some(1_048_462), 130_000, 128 * 1024, 65_536, MAX),
            Some(1_048_462)
        );
        // Room enough already: nothing to do.
        assert_eq!(
            reservation(Some(1_048_462), 1_224, 128 * 1024, 65_536, MAX),
            None
        );
        // Nothing announced, more than the limit (answered 413 anyway), or more arriving
        // than announced: no guess.
        assert_eq!(reservation(None, 0, 0, 4096, MAX), None);
        assert_eq!(reservation(Some(MAX + 1), 0, 0, 4096, MAX), None);
        assert_eq!(
            reservation(Some(100_000), 90_000, 90_000, 20_000, MAX),
            None
        );
        // A first piece larger than announced still fits.
        assert_eq!(reservation(Some(100), 0, 0, 4096, MAX), Some(4096));
    }
}
