//! Shared secrets under the per-address throttle (ADR-0009 final amendment): a blocked
//! address is refused with 429 before its secret is looked at; otherwise the check waits
//! the address's delay, and a failure counts against the address and in
//! `halo_server_secret_failures_total{kind}`.

use std::net::IpAddr;

use axum::http::StatusCode;
use halo_metrics::{CounterMap, Kind, Text};

use super::ApiError;
use super::throttle::{Gate, Throttle};

/// A shared secret as a refusal names it.
#[derive(Debug, Clone)]
pub struct Secret {
    /// What it is called: the metrics label (`gateway token`, `device token`, ...).
    pub kind: &'static str,
    /// The 401's message: how a caller presents a valid one.
    pub refusal: String,
}

impl Secret {
    /// A secret sent as `Authorization: Bearer <token>`.
    pub fn bearer(kind: &'static str) -> Secret {
        Secret {
            kind,
            refusal: format!("a valid {kind} is required as `Authorization: Bearer <token>`"),
        }
    }
}

/// The throttle and the failure counts of one listener's shared secrets.
#[derive(Debug, Default)]
pub struct SecretGate {
    throttle: Throttle,
    failures: CounterMap<&'static str>,
}

impl SecretGate {
    /// Check a secret: `check` answers `Some` for a valid one.
    pub async fn check<T, F, Fut>(
        &self,
        ip: IpAddr,
        secret: &Secret,
        check: F,
    ) -> Result<T, ApiError>
    where
        F: FnOnce() -> Fut,
        Fut: std::future::Future<Output = Option<T>>,
    {
        self.wait(ip).await?;
        match check().await {
            Some(v) => {
                self.throttle.success(ip);
                Ok(v)
            }
            None => {
                self.throttle.failure(ip);
                self.failures.inc(secret.kind);
                Err(ApiError::new(
                    StatusCode::UNAUTHORIZED,
                    "authentication_error",
                    secret.refusal.clone(),
                ))
            }
        }
    }

    /// The throttle's gate alone, for a listener that answers failures its own way (the
    /// mirror service): 429 when blocked, else after the address's delay.
    pub async fn wait(&self, ip: IpAddr) -> Result<(), ApiError> {
        let delay = match self.throttle.gate(ip) {
            Gate::Blocked => {
                return Err(ApiError::new(
                    StatusCode::TOO_MANY_REQUESTS,
                    "too_many_attempts",
                    "too many failed token attempts from this address; try again later",
                ));
            }
            Gate::Check(d) => d,
        };
        if !delay.is_zero() {
            tokio::time::sleep(delay).await;
        }
        Ok(())
    }

    /// Record the outcome of a check made after [`SecretGate::wait`].
    pub fn outcome(&self, ip: IpAddr, valid: bool) {
        if valid {
            self.throttle.success(ip);
        } else {
            self.throttle.failure(ip);
        }
    }

    pub fn write_prometheus(&self, out: &mut Text) {
        out.counters(
            "halo_server_secret_failures_total",
            "Refused shared-secret attempts (gateway, fleet, enrollment, device tokens).",
            &["kind"],
            &self.failures,
        );
        out.single(
            "halo_server_blocked_addresses",
            Kind::Gauge,
            "Addresses blocked for failed token attempts.",
            self.throttle.blocked_count(),
        );
    }
}
