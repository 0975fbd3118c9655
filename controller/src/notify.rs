//! Notifications: a generic webhook signed against replay, or a Slack-compatible payload.
//!
//! Every request carries `X-Halo-Timestamp` (Unix seconds) and `X-Halo-Signature:
//! sha256=<hex>`, an HMAC-SHA256 keyed by the shared secret over `timestamp + "." + body`
//! (ADR-0009 addendum). A receiver checks both with [`verify`], which refuses a timestamp
//! more than [`MAX_SKEW`] away from its clock, so a captured message cannot be replayed
//! later. A failed delivery (connection error, 429, 5xx) is retried with doubling backoff;
//! each attempt is signed afresh.

use std::time::Duration;

use futures_util::future::BoxFuture;
use hmac::{Hmac, KeyInit, Mac};
use serde::Serialize;
use sha2::Sha256;

use crate::decide::{Decision, Row};
use crate::kill::KillOutcome;
use crate::rollout::GateReading;

/// The timestamp header.
pub const TIMESTAMP_HEADER: &str = "x-halo-timestamp";
/// The signature header.
pub const SIGNATURE_HEADER: &str = "x-halo-signature";
/// How far a receiver accepts a timestamp from its own clock, either way.
pub const MAX_SKEW: Duration = Duration::from_secs(5 * 60);

/// What the controller tells humans.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Message {
    pub experiment: String,
    pub run: u64,
    /// rollback, promote, expired, or held (killed and not evaluated).
    pub event: String,
    pub reason: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub kill_outcome: Option<KillOutcome>,
    /// Whether traffic is known to be back on control (rollbacks only).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub enforced: Option<bool>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pull_request: Option<String>,
    pub table: Vec<Row>,
    /// One paragraph for a chat channel.
    pub text: String,
    /// A rollout's move (`event` is then `rollout_<move>`): its name, step and gates.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub rollout: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub step: Option<u32>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub gates: Vec<GateReading>,
}

impl Message {
    pub fn decision(experiment: &str, run: u64, decision: Decision, reason: &str) -> Message {
        Message {
            experiment: experiment.to_string(),
            run,
            event: decision.as_str().to_string(),
            reason: reason.to_string(),
            kill_outcome: None,
            enforced: None,
            pull_request: None,
            table: Vec::new(),
            text: String::new(),
            rollout: None,
            step: None,
            gates: Vec::new(),
        }
    }
}

/// What an action did, for the end of a message's text: the kill outcome's wording, then
/// the pull request's URL or why it is not open yet. Experiments and rollouts share it.
pub fn outcome_text(
    kill: Option<KillOutcome>,
    pull_request: Option<&str>,
    pr_error: Option<&str>,
) -> String {
    let mut text = String::new();
    if let Some(outcome) = kill {
        text.push(' ');
        text.push_str(outcome.describe());
    }
    match (pull_request, pr_error) {
        (Some(url), _) => text.push_str(&format!(" Pull request: {url}")),
        (None, Some(e)) => text.push_str(&format!(
            " The pull request could not be opened yet ({e}); the controller retries."
        )),
        (None, None) => {}
    }
    text
}

#[derive(Debug, thiserror::Error)]
pub enum NotifyError {
    #[error("webhook answered {status} after {attempts} attempts")]
    Status { status: u16, attempts: u32 },
    #[error("webhook unreachable after {attempts} attempts: {message}")]
    Unreachable { attempts: u32, message: String },
    #[error("cannot encode the message: {0}")]
    Encode(String),
}

/// Where notifications go.
pub trait Notifier: Send + Sync {
    fn notify<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), NotifyError>>;
}

/// The payload shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Format {
    /// The [`Message`] as JSON.
    Generic,
    /// `{"text": ...}`, which Slack incoming webhooks (and Mattermost, Teams' Slack
    /// compatibility) accept.
    Slack,
}

/// The HMAC-SHA256 signature header value for `timestamp` and `body`.
pub fn sign(secret: &[u8], timestamp: i64, body: &[u8]) -> String {
    format!(
        "sha256={}",
        hex::encode(mac(secret, timestamp, body).finalize().into_bytes())
    )
}

fn mac(secret: &[u8], timestamp: i64, body: &[u8]) -> Hmac<Sha256> {
    // HMAC takes a key of any length.
    let mut mac = <Hmac<Sha256> as KeyInit>::new_from_slice(secret)
        .unwrap_or_else(|_| unreachable!("HMAC accepts keys of every length"));
    mac.update(timestamp.to_string().as_bytes());
    mac.update(b".");
    mac.update(body);
    mac
}

#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum VerifyError {
    #[error("no or malformed {TIMESTAMP_HEADER}")]
    BadTimestamp,
    #[error("{TIMESTAMP_HEADER} is {seconds} s from now, more than 5 minutes")]
    Skew { seconds: i64 },
    #[error("no or malformed {SIGNATURE_HEADER}")]
    BadSignatureHeader,
    #[error("the signature does not match")]
    Mismatch,
}

/// What a receiver runs: the timestamp within [`MAX_SKEW`] of `now` (Unix seconds) and
/// the signature over exactly these bytes, compared in constant time.
pub fn verify(
    secret: &[u8],
    timestamp: Option<&str>,
    signature: Option<&str>,
    body: &[u8],
    now: i64,
) -> Result<(), VerifyError> {
    let ts: i64 = timestamp
        .and_then(|t| t.trim().parse().ok())
        .ok_or(VerifyError::BadTimestamp)?;
    let skew = now.saturating_sub(ts);
    if skew.unsigned_abs() > MAX_SKEW.as_secs() {
        return Err(VerifyError::Skew { seconds: skew });
    }
    let sig = signature
        .and_then(|s| s.trim().strip_prefix("sha256="))
        .and_then(|h| hex::decode(h).ok())
        .ok_or(VerifyError::BadSignatureHeader)?;
    mac(secret, ts, body)
        .verify_slice(&sig)
        .map_err(|_| VerifyError::Mismatch)
}

/// A webhook endpoint.
#[derive(Debug, Clone)]
pub struct Webhook {
    pub url: reqwest::Url,
    secret: Vec<u8>,
    pub format: Format,
    /// Attempts in all (at least 1).
    pub attempts: u32,
    /// The wait after the first failure; doubled after each.
    pub backoff: Duration,
    client: reqwest::Client,
}

impl Webhook {
    pub fn new(url: reqwest::Url, secret: Vec<u8>, format: Format) -> Result<Webhook, NotifyError> {
        let _ = rustls::crypto::ring::default_provider().install_default();
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(10))
            .build()
            .map_err(|e| NotifyError::Unreachable {
                attempts: 0,
                message: e.to_string(),
            })?;
        Ok(Webhook {
            url,
            secret,
            format,
            attempts: 5,
            backoff: Duration::from_secs(1),
            client,
        })
    }

    /// The body sent for a message.
    pub fn body(&self, message: &Message) -> Result<Vec<u8>, NotifyError> {
        let encoded = match self.format {
            Format::Generic => serde_json::to_vec(message),
            Format::Slack => serde_json::to_vec(&serde_json::json!({ "text": message.text })),
        };
        encoded.map_err(|e| NotifyError::Encode(e.to_string()))
    }
}

impl Notifier for Webhook {
    fn notify<'a>(&'a self, message: &'a Message) -> BoxFuture<'a, Result<(), NotifyError>> {
        Box::pin(async move {
            let body = self.body(message)?;
            let attempts = self.attempts.max(1);
            let mut wait = self.backoff;
            let mut last = NotifyError::Unreachable {
                attempts: 0,
                message: "not attempted".to_string(),
            };
            for attempt in 1..=attempts {
                if attempt > 1 {
                    tokio::time::sleep(wait).await;
                    wait = wait.saturating_mul(2);
                }
                let ts = time::OffsetDateTime::now_utc().unix_timestamp();
                let sent = self
                    .client
                    .post(self.url.clone())
                    .header("content-type", "application/json")
                    .header(TIMESTAMP_HEADER, ts.to_string())
                    .header(SIGNATURE_HEADER, sign(&self.secret, ts, &body))
                    .body(body.clone())
                    .send()
                    .await;
                match sent {
                    Ok(r) if r.status().is_success() => return Ok(()),
                    Ok(r) => {
                        let status = r.status();
                        last = NotifyError::Status {
                            status: status.as_u16(),
                            attempts: attempt,
                        };
                        // A refusal other than rate limiting will not change on retry.
                        if !(status.is_server_error() || status.as_u16() == 429) {
                            return Err(last);
                        }
                    }
                    Err(e) => {
                        last = NotifyError::Unreachable {
                            attempts: attempt,
                            message: e.without_url().to_string(),
                        }
                    }
                }
            }
            Err(last)
        })
    }
}
