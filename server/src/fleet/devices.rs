//! Enrollment and devices.
//!
//! An admin mints a one-time enrollment token (optionally bound to a user and groups);
//! a device exchanges it at POST /api/v1/enroll for a device token that expires after
//! --device-ttl. Both tokens are random 256-bit values handed out once; only their
//! sha256 digests are stored (enrollments.jsonl, devices.jsonl), so the data dir holds
//! nothing a thief could present. State is a fold over the two logs.

use std::collections::{BTreeMap, HashMap};
use std::sync::Arc;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use time::OffsetDateTime;
use time::format_description::well_known::Rfc3339;
use tokio::sync::Mutex;

use crate::token::{TokenDigest, mint};
use halo_store::{Log, LogStore, StoreError};

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase", deny_unknown_fields)]
enum EnrollmentRecord {
    #[serde(rename_all = "camelCase")]
    Minted {
        id: String,
        token_sha256: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        #[serde(default)]
        groups: Vec<String>,
        expires_at: String,
        by: String,
        at: String,
    },
    #[serde(rename_all = "camelCase")]
    Used {
        id: String,
        device: String,
        at: String,
    },
}

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(tag = "event", rename_all = "lowercase", deny_unknown_fields)]
enum DeviceRecord {
    #[serde(rename_all = "camelCase")]
    Enrolled {
        id: String,
        token_sha256: String,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        user: Option<String>,
        #[serde(default)]
        groups: Vec<String>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        host: Option<String>,
        enrolled_at: String,
        expires_at: String,
    },
    #[serde(rename_all = "camelCase")]
    Revoked { id: String, by: String, at: String },
}

/// A fleet report line (reports.jsonl).
#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportRecord {
    pub at: String,
    /// The reporting device, or `None` for a fleet-token report.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub device: Option<String>,
    pub status: serde_json::Value,
}

#[derive(Debug, Clone)]
struct Enrollment {
    id: String,
    user: Option<String>,
    groups: Vec<String>,
    expires_at: OffsetDateTime,
    used: bool,
}

/// A device as admins see it.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct Device {
    pub id: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub user: Option<String>,
    pub groups: Vec<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub host: Option<String>,
    pub enrolled_at: String,
    pub expires_at: String,
    pub revoked: bool,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_report_at: Option<String>,
    /// What the last report said (halod's status line, summarized).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub last_report: Option<ReportSummary>,
    #[serde(skip)]
    expires: Option<OffsetDateTime>,
}

/// The parts of halod's status line admins look at: the ring and release it runs, how the
/// cycle went, and the files it found changed on disk (drift) and put back.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct ReportSummary {
    #[serde(skip_serializing_if = "Option::is_none")]
    pub outcome: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub ring: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub digest: Option<String>,
    #[serde(skip_serializing_if = "Vec::is_empty")]
    pub drift: Vec<String>,
}

impl ReportSummary {
    /// Read from a status line; fields it lacks or of another type are left out (a report
    /// is the device's word, shown, never trusted for a decision).
    pub fn of(status: &serde_json::Value) -> ReportSummary {
        let text = |k: &str| status.get(k).and_then(|v| v.as_str()).map(str::to_string);
        ReportSummary {
            outcome: text("outcome"),
            ring: text("ring"),
            digest: text("digest"),
            drift: status
                .get("drift")
                .and_then(|d| d.as_array())
                .map(|a| {
                    a.iter()
                        .filter_map(|f| f.as_str().map(str::to_string))
                        .collect()
                })
                .unwrap_or_default(),
        }
    }
}

impl Device {
    fn is_valid(&self, now: OffsetDateTime) -> bool {
        !self.revoked && self.expires.is_some_and(|e| now < e)
    }
}

/// A freshly minted enrollment token (shown once).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct MintedEnrollment {
    pub id: String,
    pub token: String,
    pub expires_at: String,
}

/// A freshly enrolled device and its token (shown once).
#[derive(Debug, Clone, Serialize)]
#[serde(rename_all = "camelCase")]
pub struct EnrolledDevice {
    pub device_id: String,
    pub device_token: String,
    pub expires_at: String,
}

#[derive(Debug, thiserror::Error)]
pub enum FleetError {
    #[error("the enrollment token is unknown, already used or expired")]
    BadEnrollmentToken,
    #[error("no device {0}")]
    UnknownDevice(String),
    #[error("cannot draw random bytes: {0}")]
    Random(String),
    #[error(transparent)]
    Store(#[from] StoreError),
}

#[derive(Debug, Default)]
struct State {
    enrollments: HashMap<TokenDigest, Enrollment>,
    devices: BTreeMap<String, Device>,
    by_token: HashMap<TokenDigest, String>,
}

/// Enrollments and devices over a [`LogStore`].
pub struct Devices {
    store: Arc<dyn LogStore>,
    state: Mutex<State>,
    device_ttl: Duration,
    enrollment_ttl: Duration,
}

impl std::fmt::Debug for Devices {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Devices").finish_non_exhaustive()
    }
}

fn fmt_time(t: OffsetDateTime) -> String {
    t.format(&Rfc3339)
        .unwrap_or_else(|_| "1970-01-01T00:00:00Z".to_string())
}

fn parse_time(s: &str) -> Option<OffsetDateTime> {
    OffsetDateTime::parse(s, &Rfc3339).ok()
}

fn corrupt(log: Log, i: usize, e: impl std::fmt::Display) -> StoreError {
    StoreError::Corrupt {
        path: log.file_name().to_string(),
        line: i + 1,
        message: e.to_string(),
    }
}

fn new_id(prefix: &str) -> Result<String, FleetError> {
    let mut b = [0u8; 8];
    getrandom::fill(&mut b).map_err(|e| FleetError::Random(e.to_string()))?;
    Ok(format!("{prefix}-{}", hex::encode(b)))
}

impl Devices {
    pub fn open(
        store: Arc<dyn LogStore>,
        device_ttl: Duration,
        enrollment_ttl: Duration,
    ) -> Result<Devices, StoreError> {
        let mut state = State::default();
        let mut enrollment_by_id: HashMap<String, TokenDigest> = HashMap::new();
        for (i, v) in store.read_all(Log::Enrollments)?.into_iter().enumerate() {
            match serde_json::from_value(v).map_err(|e| corrupt(Log::Enrollments, i, e))? {
                EnrollmentRecord::Minted {
                    id,
                    token_sha256,
                    user,
                    groups,
                    expires_at,
                    ..
                } => {
                    let digest = TokenDigest::from_hex(&token_sha256)
                        .ok_or_else(|| corrupt(Log::Enrollments, i, "bad tokenSha256"))?;
                    let expires_at = parse_time(&expires_at)
                        .ok_or_else(|| corrupt(Log::Enrollments, i, "bad expiresAt"))?;
                    enrollment_by_id.insert(id.clone(), digest.clone());
                    state.enrollments.insert(
                        digest,
                        Enrollment {
                            id,
                            user,
                            groups,
                            expires_at,
                            used: false,
                        },
                    );
                }
                EnrollmentRecord::Used { id, .. } => {
                    if let Some(e) = enrollment_by_id
                        .get(&id)
                        .and_then(|d| state.enrollments.get_mut(d))
                    {
                        e.used = true;
                    }
                }
            }
        }
        for (i, v) in store.read_all(Log::Devices)?.into_iter().enumerate() {
            match serde_json::from_value(v).map_err(|e| corrupt(Log::Devices, i, e))? {
                DeviceRecord::Enrolled {
                    id,
                    token_sha256,
                    user,
                    groups,
                    host,
                    enrolled_at,
                    expires_at,
                } => {
                    let digest = TokenDigest::from_hex(&token_sha256)
                        .ok_or_else(|| corrupt(Log::Devices, i, "bad tokenSha256"))?;
                    state.by_token.insert(digest, id.clone());
                    state.devices.insert(
                        id.clone(),
                        Device {
                            id,
                            user,
                            groups,
                            host,
                            enrolled_at,
                            expires: parse_time(&expires_at),
                            expires_at,
                            revoked: false,
                            last_report_at: None,
                            last_report: None,
                        },
                    );
                }
                DeviceRecord::Revoked { id, .. } => {
                    if let Some(d) = state.devices.get_mut(&id) {
                        d.revoked = true;
                    }
                }
            }
        }
        for v in store.read_all(Log::Reports)? {
            if let Ok(r) = serde_json::from_value::<ReportRecord>(v)
                && let Some(d) = r.device.and_then(|id| state.devices.get_mut(&id))
            {
                d.last_report = Some(ReportSummary::of(&r.status));
                d.last_report_at = Some(r.at);
            }
        }
        Ok(Devices {
            store,
            state: Mutex::new(state),
            device_ttl,
            enrollment_ttl,
        })
    }

    async fn append(&self, log: Log, value: serde_json::Value) -> Result<(), StoreError> {
        let store = Arc::clone(&self.store);
        tokio::task::spawn_blocking(move || store.append(log, &value))
            .await
            .map_err(|e| StoreError::Unavailable(e.to_string()))?
    }

    /// Mint a one-time enrollment token. `audit` runs first: no audit, no token.
    pub async fn mint_enrollment(
        &self,
        by: &str,
        user: Option<String>,
        groups: Vec<String>,
    ) -> Result<MintedEnrollment, FleetError> {
        let token = mint().map_err(|e| FleetError::Random(e.to_string()))?;
        let digest = TokenDigest::of(&token);
        let id = new_id("enr")?;
        let now = OffsetDateTime::now_utc();
        let expires_at = now + self.enrollment_ttl;
        let rec = EnrollmentRecord::Minted {
            id: id.clone(),
            token_sha256: digest.to_hex(),
            user: user.clone(),
            groups: groups.clone(),
            expires_at: fmt_time(expires_at),
            by: by.to_string(),
            at: fmt_time(now),
        };
        let mut state = self.state.lock().await;
        self.append(Log::Enrollments, to_value(&rec)?).await?;
        state.enrollments.insert(
            digest,
            Enrollment {
                id: id.clone(),
                user,
                groups,
                expires_at,
                used: false,
            },
        );
        Ok(MintedEnrollment {
            id,
            token,
            expires_at: fmt_time(expires_at),
        })
    }

    /// Exchange an enrollment token for a device token. The token is marked used
    /// (durably) before the device token is created, so it can never enroll twice.
    pub async fn enroll(
        &self,
        enrollment_token: &str,
        host: Option<String>,
    ) -> Result<EnrolledDevice, FleetError> {
        let digest = TokenDigest::of(enrollment_token);
        let now = OffsetDateTime::now_utc();
        let mut state = self.state.lock().await;
        let enrollment = match state.enrollments.get(&digest) {
            Some(e) if !e.used && now < e.expires_at => e.clone(),
            _ => return Err(FleetError::BadEnrollmentToken),
        };
        let device_id = new_id("dev")?;
        let used = EnrollmentRecord::Used {
            id: enrollment.id.clone(),
            device: device_id.clone(),
            at: fmt_time(now),
        };
        self.append(Log::Enrollments, to_value(&used)?).await?;
        if let Some(e) = state.enrollments.get_mut(&digest) {
            e.used = true;
        }
        let device_token = mint().map_err(|e| FleetError::Random(e.to_string()))?;
        let token_digest = TokenDigest::of(&device_token);
        let expires = now + self.device_ttl;
        let rec = DeviceRecord::Enrolled {
            id: device_id.clone(),
            token_sha256: token_digest.to_hex(),
            user: enrollment.user.clone(),
            groups: enrollment.groups.clone(),
            host: host.clone(),
            enrolled_at: fmt_time(now),
            expires_at: fmt_time(expires),
        };
        self.append(Log::Devices, to_value(&rec)?).await?;
        state.by_token.insert(token_digest, device_id.clone());
        state.devices.insert(
            device_id.clone(),
            Device {
                id: device_id.clone(),
                user: enrollment.user,
                groups: enrollment.groups,
                host,
                enrolled_at: fmt_time(now),
                expires_at: fmt_time(expires),
                expires: Some(expires),
                revoked: false,
                last_report_at: None,
                last_report: None,
            },
        );
        Ok(EnrolledDevice {
            device_id,
            device_token,
            expires_at: fmt_time(expires),
        })
    }

    /// The device a token belongs to, if it is valid now (not revoked, not expired).
    pub async fn device_for_token(&self, token: &str) -> Option<Device> {
        let digest = TokenDigest::of(token);
        let state = self.state.lock().await;
        let id = state.by_token.get(&digest)?;
        state
            .devices
            .get(id)
            .filter(|d| d.is_valid(OffsetDateTime::now_utc()))
            .cloned()
    }

    pub async fn list(&self) -> Vec<Device> {
        self.state.lock().await.devices.values().cloned().collect()
    }

    /// Revoke a device: its token stops working at once.
    pub async fn revoke(&self, id: &str, by: &str) -> Result<Device, FleetError> {
        let mut state = self.state.lock().await;
        if !state.devices.contains_key(id) {
            return Err(FleetError::UnknownDevice(id.to_string()));
        }
        let rec = DeviceRecord::Revoked {
            id: id.to_string(),
            by: by.to_string(),
            at: fmt_time(OffsetDateTime::now_utc()),
        };
        self.append(Log::Devices, to_value(&rec)?).await?;
        let device = state
            .devices
            .get_mut(id)
            .ok_or_else(|| FleetError::UnknownDevice(id.to_string()))?;
        device.revoked = true;
        Ok(device.clone())
    }

    /// Store a report (durably) and note it on the device.
    pub async fn report(
        &self,
        device: Option<&str>,
        status: serde_json::Value,
    ) -> Result<(), FleetError> {
        let rec = ReportRecord {
            at: fmt_time(OffsetDateTime::now_utc()),
            device: device.map(str::to_string),
            status,
        };
        self.append(Log::Reports, to_value(&rec)?).await?;
        if let Some(id) = device
            && let Some(d) = self.state.lock().await.devices.get_mut(id)
        {
            d.last_report = Some(ReportSummary::of(&rec.status));
            d.last_report_at = Some(rec.at);
        }
        Ok(())
    }
}

fn to_value<T: Serialize>(v: &T) -> Result<serde_json::Value, StoreError> {
    serde_json::to_value(v).map_err(|e| StoreError::Encode(e.to_string()))
}
