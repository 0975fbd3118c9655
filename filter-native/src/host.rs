//! halo-filter-core's [`Host`] over Envoy's dynamic-module ABI ([`crate::ffi::envoy`]).
//! No decisions and no `unsafe` here: each method is one or two calls into Envoy.

use std::sync::{LazyLock, Mutex, PoisonError};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use halo_contract::facts::Fact;
use halo_contract::names::{ENDPOINT_FACTS_KEY, METADATA_NAMESPACE};
use halo_filter_core::attempt::ATTEMPT_PROPERTY;
use halo_filter_core::breaker::Breakers;
use halo_filter_core::config::IdentitySettings;
use halo_filter_core::host::{Host, Level, Telemetry};
use halo_filter_core::jwt::{self, Verified};
use halo_filter_core::metrics::Counter;
use halo_filter_core::pipeline::{PrefixEdit, VerifiedClaims};

use crate::body_edit;
use crate::ffi::envoy::{Body, Stream, log};
use crate::plugin::{Meter, OutboxJob, STAGE_COUNTS};

const JWT_METADATA: &str = "envoy.filters.http.jwt_authn";

/// The core's [`Host`] for one stream, during one hook `'h`: its Envoy side and its
/// configuration's counters.
pub struct NativeHost<'h> {
    s: Stream<'h>,
    meter: &'h Meter,
}

impl<'h> NativeHost<'h> {
    pub fn new(s: Stream<'h>, meter: &'h Meter) -> NativeHost<'h> {
        NativeHost { s, meter }
    }
}

impl Telemetry for NativeHost<'_> {
    fn log(&self, level: Level, message: &str) {
        log(level, message);
    }

    /// Per-request counts ([`Counter::per_request`]) go to the tally (handed to Envoy on
    /// the next tick); the others, rare, to Envoy at once; the per-attempt stage's (no
    /// counters of its own) to [`STAGE_COUNTS`], handed over on the next tick too.
    fn add(&self, counter: Counter<'_>, amount: u64) {
        let id = self.meter.id(&counter);
        if counter.per_request() {
            self.meter.tally.add(id, &counter.values(), amount);
            return;
        }
        match id {
            Some(id) => self.s.increment(id, &counter.values(), amount),
            None => STAGE_COUNTS.add(&counter, amount),
        }
    }
}

impl Host for NativeHost<'_> {
    /// Envoy hands each body piece once, and an edit of the head can be written into the
    /// buffered part before the body ends ([`body_edit`]).
    const PIECEWISE: bool = true;

    fn request_headers(&self) -> Vec<(String, String)> {
        self.s.request_headers()
    }

    fn request_header(&self, name: &str) -> Option<String> {
        self.s.request_header(name)
    }

    fn set_request_header(&mut self, name: &str, value: Option<&str>) {
        self.s.set_request_header(name, value);
    }

    fn response_header(&self, name: &str) -> Option<String> {
        self.s.response_header(name)
    }

    fn set_response_header(&mut self, name: &str, value: Option<&str>) {
        self.s.set_response_header(name, value);
    }

    fn peer_address(&self) -> Option<String> {
        self.s.source_address()
    }

    /// The payload jwt_authn forwarded in a header, believed only when jwt_authn's
    /// metadata says it verified a token on this request ([`halo_filter_core::jwt`]).
    fn verified_claims(
        &self,
        identity: &IdentitySettings,
        headers: &[(String, String)],
    ) -> Option<VerifiedClaims> {
        let verified = self
            .s
            .dynamic_metadata_keys(JWT_METADATA)
            .contains(&identity.jwt_metadata_key);
        if !verified {
            return None;
        }
        let values: Vec<String> = headers
            .iter()
            .filter(|(n, _)| n == jwt::PAYLOAD_HEADER)
            .map(|(_, v)| v.clone())
            .collect();
        match jwt::claims(&values, &identity.user_claim, &identity.groups_claim) {
            Verified::Claims(c) => Some(c),
            Verified::None | Verified::Unreadable => None,
        }
    }

    fn response_code(&self) -> Option<u32> {
        self.s.response_code()
    }

    fn response_code_details(&self) -> Option<String> {
        self.s.response_code_details()
    }

    fn attempt_count(&self) -> Option<u32> {
        self.s.attempt_count()
    }

    /// The process's breakers: one module per Envoy process, its workers' streams share
    /// them.
    fn with_breakers<R>(&self, f: impl FnOnce(&mut Breakers) -> R) -> R {
        static BREAKERS: LazyLock<Mutex<Breakers>> = LazyLock::new(Mutex::default);
        // A panic while the lock was held (caught by the hook's guard) leaves the state
        // as it was written: still usable.
        let mut guard = BREAKERS.lock().unwrap_or_else(PoisonError::into_inner);
        f(&mut guard)
    }

    fn set_attempt_note(&mut self, value: &[u8]) {
        self.s.set_filter_state(ATTEMPT_PROPERTY, value);
    }

    fn attempt_note(&self) -> Option<Vec<u8>> {
        self.s.filter_state(ATTEMPT_PROPERTY)
    }

    fn endpoint_facts(&self) -> Option<Vec<u8>> {
        self.s
            .host_metadata_string(METADATA_NAMESPACE, ENDPOINT_FACTS_KEY)
    }

    fn refresh_route(&mut self) {
        self.s.refresh_route();
    }

    fn send_response(&mut self, status: u16, headers: &[(String, String)], body: &[u8]) {
        self.s.send_response(status, headers, body);
    }

    fn request_body_total(&self, held: usize) -> usize {
        let received = self.s.request_body_size(Body::Received);
        // A piece that is an earlier filter's whole buffer is all of it.
        if self.s.received_is_buffered() {
            received
        } else {
            held + received
        }
    }

    fn copy_request_body(&mut self, body: &mut Vec<u8>, _limit: usize) {
        // The piece of this call; an earlier filter's whole buffer when it resumed (then
        // it is everything, and what was copied before is in it).
        if self.s.received_is_buffered() {
            body.clear();
        }
        self.s.copy_request_body(Body::Received, body);
    }

    fn write_body_edit(&mut self, edit: &PrefixEdit, body: &[u8]) {
        body_edit::write(self.s, edit, body);
    }

    fn replace_request_body(&mut self, edit: &PrefixEdit, body: &[u8]) {
        body_edit::replace(self.s, edit, body);
    }

    fn now(&self) -> Duration {
        SystemTime::now()
            .duration_since(UNIX_EPOCH)
            .unwrap_or_default()
    }

    fn set_fact(&mut self, fact: Fact, value: &str) {
        self.s.set_filter_state(fact.state_key(), value.as_bytes());
    }

    fn served_metadata(&self, key: &str) -> Option<String> {
        self.s
            .host_metadata_string(METADATA_NAMESPACE, key)
            .and_then(|b| String::from_utf8(b).ok())
    }

    fn response_body(&self) -> Vec<u8> {
        self.s.received_response_body()
    }

    fn set_response_body(&mut self, bytes: &[u8]) {
        self.s.replace_received_response_body(bytes);
    }

    fn dispatch(
        &mut self,
        cluster: &str,
        headers: &[(String, String)],
        body: &[u8],
        timeout_ms: u64,
    ) -> bool {
        let mut pairs: Vec<(&str, &str)> = headers
            .iter()
            .map(|(n, v)| (n.as_str(), v.as_str()))
            .collect();
        // The ABI's callout requires `host` beside `:authority` (as the kill-list poll's).
        if let Some((_, authority)) = headers.iter().find(|(n, _)| n == ":authority")
            && !headers.iter().any(|(n, _)| n == "host")
        {
            pairs.push(("host", authority.as_str()));
        }
        // Started by the main thread as the configuration's, not this stream's: a
        // stream's callout ends with the stream ([`crate::plugin::Outbox`]).
        self.meter.outbox.push(OutboxJob {
            cluster: cluster.to_string(),
            headers: pairs
                .into_iter()
                .map(|(n, v)| (n.to_string(), v.to_string()))
                .collect(),
            body: body.to_vec(),
            timeout_ms,
        })
    }
}
