//! The refresher: mint, publish, wait as the [`Schedule`] says, repeat. A failed mint or
//! write leaves the SDS file as it was (the token in it stays in use while valid) and is
//! retried with backoff.
//!
//! Logs name the source, the file, lifetimes and errors; never a token or an assertion.

use std::time::SystemTime;

use crate::google::{self, TokenSource};
use crate::refresh::{Lease, Policy, Schedule};
use crate::sds::{SdsError, SdsFile};

/// The time source (injected so the schedule can be driven in tests).
pub trait Clock: Send + Sync {
    fn now(&self) -> SystemTime;
}

/// The system clock.
#[derive(Debug, Clone, Copy, Default)]
pub struct SystemClock;

impl Clock for SystemClock {
    fn now(&self) -> SystemTime {
        SystemTime::now()
    }
}

/// Why an attempt did not publish a token.
#[derive(Debug, thiserror::Error)]
pub enum AttemptError {
    #[error(transparent)]
    Mint(#[from] google::Error),
    #[error("cannot publish the token: {0}")]
    Write(#[from] SdsError),
}

/// One token kept fresh in one SDS file.
pub struct Refresher<C: Clock> {
    source: TokenSource,
    sds: SdsFile,
    http: reqwest::Client,
    schedule: Schedule,
    clock: C,
}

impl<C: Clock> Refresher<C> {
    pub fn new(
        source: TokenSource,
        sds: SdsFile,
        policy: Policy,
        clock: C,
    ) -> Result<Refresher<C>, google::Error> {
        let http = google::http_client()?;
        let schedule = Schedule::new(policy, clock.now());
        Ok(Refresher {
            source,
            sds,
            http,
            schedule,
            clock,
        })
    }

    pub fn schedule(&self) -> &Schedule {
        &self.schedule
    }

    /// Mint a token and publish it now. On failure the file is untouched and the
    /// schedule backs off.
    pub async fn attempt(&mut self) -> Result<Lease, AttemptError> {
        let asked_at = self.clock.now();
        let result = async {
            let minted = self.source.mint(&self.http, asked_at).await?;
            self.sds.write(&minted.token)?;
            Ok::<_, AttemptError>(Lease::new(asked_at, minted.expires_in))
        }
        .await;
        match result {
            Ok(lease) => {
                self.schedule.succeeded(lease);
                Ok(lease)
            }
            Err(e) => {
                self.schedule.failed(self.clock.now());
                Err(e)
            }
        }
    }

    /// Refresh forever (the caller stops it, e.g. on a signal).
    pub async fn run(mut self) {
        tracing::info!(
            source = %self.source.describe(),
            sds_file = %self.sds.path.display(),
            secret = %self.sds.secret_name,
            "keeping a Google access token fresh"
        );
        loop {
            tokio::time::sleep(self.schedule.wait(self.clock.now())).await;
            match self.attempt().await {
                Ok(lease) => {
                    let now = self.clock.now();
                    tracing::info!(
                        expires_in_secs = secs(lease.expires_at, lease.obtained_at),
                        next_refresh_in_secs = secs(self.schedule.next_attempt(), now),
                        "token published"
                    );
                }
                Err(e) => {
                    let now = self.clock.now();
                    let retry_in_secs = secs(self.schedule.next_attempt(), now);
                    match self.schedule.lease().filter(|l| l.valid_at(now)) {
                        Some(lease) => tracing::warn!(
                            error = %e,
                            retry_in_secs,
                            current_token_valid_for_secs = secs(lease.expires_at, now),
                            "refresh failed; the published token stays"
                        ),
                        None => tracing::error!(
                            error = %e,
                            retry_in_secs,
                            failures = self.schedule.failures(),
                            "no valid token published"
                        ),
                    }
                }
            }
        }
    }
}

fn secs(later: SystemTime, earlier: SystemTime) -> u64 {
    later
        .duration_since(earlier)
        .map(|d| d.as_secs())
        .unwrap_or(0)
}
