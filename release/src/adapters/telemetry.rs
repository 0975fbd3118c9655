//! The device's part of a harness's telemetry settings (spec: halod apply loop, step 5
//! "Variant"; DESIGN.md "The evidence loop"): the attribution that makes a harness's own
//! OpenTelemetry records evidence at halo-server's CLI receiver, and the receiver's
//! optional token.
//!
//! A release is built per ring and variant channel, but its records must name the
//! device's unit, which only the device knows (the developer's subject, hashed), and the
//! release digest, which the release cannot contain. So nothing of this is rendered at
//! build time: halod adds it to the files it is about to write, after the client toggles,
//! with [`attribute`], and the signed release stays device-agnostic (and holds no token).
//!
//! The attribution is OpenTelemetry resource attributes in the gateway's record names
//! (`halo.ring`, `halo.release`, `halo.experiment`, `halo.variant`, `halo.unit`:
//! [`halo_envoy_config::evidence`]), the unit computed with the gateway's own function
//! (`halo_policy::assign::unit` over `unit_salt`), never the subject. What each pinned
//! harness honours (seen on the wire, e2e/tests/harnesses.rs):
//! - Claude Code: its managed settings' `env` (`OTEL_RESOURCE_ATTRIBUTES`, and the token
//!   as `OTEL_EXPORTER_OTLP_HEADERS`), applied to its own process only.
//! - Gemini CLI and Codex read `OTEL_RESOURCE_ATTRIBUTES` from their environment only
//!   (no setting for it), so when either one's telemetry is on halod writes a login-shell
//!   script of its own, [`profile_path`], exporting it (added to any value the shell had).
//!   Every OpenTelemetry program started from that shell then carries the attribution too
//!   (it names no one: ring, release, experiment, variant, unit hash). Windows has no
//!   login-shell script: a warning says so.
//! - The token: Codex's `[otel.exporter.otlp-http]` takes `headers`; Gemini CLI has no
//!   setting for OTLP headers, and the token is never exported from a shell script: every
//!   OpenTelemetry program would send it to its own collector.
//!
//! Only a harness whose rendered settings enable telemetry is touched.

use halo_contract::facts as names;
use halo_policy::{Harness, assign};

use super::{FILE_MODE, Os, RenderedFile, codex, gemini_cli, json_bytes, settings_file};
use crate::check::check_rendered;

/// What a harness's records say about this device.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Attribution {
    pub ring: String,
    /// The digest of the release the device applied (`sha256:...`).
    pub release: String,
    /// The client-axis experiment and the device's variant, when it is in one.
    pub experiment: Option<(String, String)>,
    /// The salted hash of the subject (the gateway's unit for the same subject).
    pub unit: String,
}

/// The experiment a device resolved: its name, salt and the device's variant.
#[derive(Debug, Clone, Copy)]
pub struct Resolved<'a> {
    pub experiment: &'a str,
    pub salt: &'a str,
    pub variant: &'a str,
}

impl Attribution {
    /// The attribution of `user` on `ring` running `release`, in `resolved` if any. The
    /// unit is the gateway's: the experiment's salt when in one, else the ring's.
    pub fn new(ring: &str, release: &str, resolved: Option<Resolved<'_>>, user: &str) -> Self {
        let salt = assign::unit_salt(resolved.map(|r| r.salt), ring);
        Attribution {
            ring: ring.to_string(),
            release: release.to_string(),
            experiment: resolved.map(|r| (r.experiment.to_string(), r.variant.to_string())),
            unit: assign::unit(&salt, user),
        }
    }

    /// The `OTEL_RESOURCE_ATTRIBUTES` value: `key=value` pairs, comma-separated, values
    /// percent-encoded outside the W3C baggage octets (policy names and digests need
    /// none, so every SDK reads them the same whether it decodes or not).
    pub fn resource_attributes(&self) -> String {
        let (experiment, variant) = match &self.experiment {
            Some((e, v)) => (e.as_str(), v.as_str()),
            None => ("", ""),
        };
        [
            (names::RING, self.ring.as_str()),
            (names::RELEASE, self.release.as_str()),
            (names::EXPERIMENT, experiment),
            (names::VARIANT, variant),
            (names::UNIT, self.unit.as_str()),
        ]
        .iter()
        .filter(|(_, v)| !v.is_empty())
        .map(|(k, v)| format!("{k}={}", percent_encode(v)))
        .collect::<Vec<_>>()
        .join(",")
    }
}

fn percent_encode(v: &str) -> String {
    let mut out = String::with_capacity(v.len());
    for b in v.bytes() {
        // Baggage octets: printable ASCII but space, '"', ',', ';', '\\'; '%' escapes.
        if (0x21..=0x7e).contains(&b) && !matches!(b, b'"' | b',' | b';' | b'\\' | b'%') {
            out.push(b as char);
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// The login-shell script halod writes with the attribution for the harnesses that read
/// it from their environment (`None` on Windows).
pub fn profile_path(os: Os) -> Option<&'static str> {
    match os {
        Os::Darwin | Os::Linux => Some("/etc/profile.d/halos-telemetry.sh"),
        Os::Windows => None,
    }
}

/// The CLI receiver's token is a bearer token in an OTLP header (`key=value` lists in
/// the environment, TOML strings in Codex): one that could break either is refused.
fn token_is_header_safe(token: &str) -> bool {
    !token.is_empty()
        && token.bytes().all(|b| {
            b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~' | b'+' | b'/')
        })
}

/// Add the attribution, and the CLI receiver's `token` when set, to the telemetry
/// settings among `files` (one OS's files of one release, client toggles already
/// merged), and the login-shell script ([`profile_path`]) when a harness reads the
/// attribution from its environment. A changed file passes CheckRendered again; a file
/// that cannot take them is left as it was and a warning says why (never the token).
pub fn attribute(
    files: &mut Vec<RenderedFile>,
    attribution: &Attribution,
    token: Option<&str>,
) -> Vec<String> {
    let mut warnings = Vec::new();
    let token = match token {
        Some(t) if !token_is_header_safe(t) => {
            warnings.push(
                "the CLI receiver token has characters an OTLP header cannot carry; not written"
                    .to_string(),
            );
            None
        }
        t => t,
    };
    // The harness (and OS) whose telemetry needs the attribution in the environment.
    let mut from_environment: Option<(Harness, Os)> = None;
    for file in files.iter_mut() {
        let changed = match file.harness {
            Harness::ClaudeCode
                if settings_file(file.harness, file.os) == Some(file.path.clone()) =>
            {
                claude_code(&file.content, attribution, token)
            }
            Harness::Codex if codex::managed_path(file.os) == Some(file.path.as_str()) => {
                if toml_has_otel(&file.content) {
                    from_environment.get_or_insert((file.harness, file.os));
                }
                codex_headers(&file.content, token)
            }
            Harness::GeminiCli if file.path == gemini_cli::settings_path(file.os) => {
                if gemini_telemetry(&file.content) {
                    from_environment.get_or_insert((file.harness, file.os));
                }
                Ok(None)
            }
            _ => Ok(None),
        };
        let content = match changed {
            Ok(Some(content)) => content,
            Ok(None) => continue,
            Err(e) => {
                warnings.push(format!(
                    "telemetry attribution not added to {}: {e}",
                    file.path
                ));
                continue;
            }
        };
        let candidate = RenderedFile {
            content,
            ..file.clone()
        };
        match check_rendered(&candidate) {
            Ok(()) => *file = candidate,
            Err(e) => warnings.push(format!(
                "telemetry attribution not added to {}: {e}",
                file.path
            )),
        }
    }
    if let Some((harness, os)) = from_environment {
        match profile_path(os) {
            Some(path) => {
                let script = RenderedFile {
                    harness,
                    os,
                    path: path.to_string(),
                    mode: FILE_MODE,
                    content: profile_script(attribution).into_bytes(),
                };
                match check_rendered(&script) {
                    Ok(()) => files.push(script),
                    Err(e) => warnings.push(format!("telemetry attribution not written: {e}")),
                }
            }
            None => warnings.push(format!(
                "{}'s telemetry carries no Halos attribution on {}: it reads OTEL_RESOURCE_ATTRIBUTES from its environment only, and there is no login-shell script to export it",
                harness.as_str(),
                os.as_str()
            )),
        }
    }
    warnings
}

fn toml_has_otel(content: &[u8]) -> bool {
    std::str::from_utf8(content)
        .ok()
        .and_then(|t| toml::from_str::<toml::Table>(t).ok())
        .is_some_and(|t| t.contains_key("otel"))
}

fn gemini_telemetry(content: &[u8]) -> bool {
    serde_json::from_slice::<serde_json::Value>(content)
        .ok()
        .and_then(|v| v.pointer("/telemetry/enabled").and_then(|e| e.as_bool()))
        == Some(true)
}

/// Claude Code: `env` of the managed settings, when they enable its telemetry.
fn claude_code(
    content: &[u8],
    attribution: &Attribution,
    token: Option<&str>,
) -> Result<Option<Vec<u8>>, String> {
    let mut value: serde_json::Value =
        serde_json::from_slice(content).map_err(|e| format!("not JSON: {e}"))?;
    let Some(env) = value.get_mut("env").and_then(|e| e.as_object_mut()) else {
        return Ok(None);
    };
    if env
        .get("CLAUDE_CODE_ENABLE_TELEMETRY")
        .and_then(|v| v.as_str())
        != Some("1")
    {
        return Ok(None);
    }
    env.insert(
        "OTEL_RESOURCE_ATTRIBUTES".into(),
        attribution.resource_attributes().into(),
    );
    if let Some(token) = token {
        env.insert(
            "OTEL_EXPORTER_OTLP_HEADERS".into(),
            format!("Authorization=Bearer {token}").into(),
        );
    }
    Ok(Some(json_bytes(&value)))
}

/// Codex: the token as a header of its OTLP/HTTP exporter, when the release has one.
fn codex_headers(content: &[u8], token: Option<&str>) -> Result<Option<Vec<u8>>, String> {
    let Some(token) = token else {
        return Ok(None);
    };
    let text = std::str::from_utf8(content).map_err(|e| format!("not UTF-8: {e}"))?;
    let mut table: toml::Table = toml::from_str(text).map_err(|e| format!("not TOML: {e}"))?;
    let Some(http) = table
        .get_mut("otel")
        .and_then(|o| o.get_mut("exporter"))
        .and_then(|e| e.get_mut("otlp-http"))
        .and_then(|h| h.as_table_mut())
    else {
        return Ok(None);
    };
    let mut headers = toml::Table::new();
    headers.insert(
        "authorization".into(),
        toml::Value::String(format!("Bearer {token}")),
    );
    http.insert("headers".into(), toml::Value::Table(headers));
    Ok(Some(
        toml::to_string(&table)
            .map_err(|e| e.to_string())?
            .into_bytes(),
    ))
}

/// The login-shell script: the attribution exported after what the shell had.
fn profile_script(attribution: &Attribution) -> String {
    format!(
        "# Managed by Halos (halod). This device's attribution for the coding tools' own\n\
         # telemetry (Codex and Gemini CLI read it from the environment): ring, release,\n\
         # experiment, variant and the salted unit hash; no user id, no token.\n\
         OTEL_RESOURCE_ATTRIBUTES=\"${{OTEL_RESOURCE_ATTRIBUTES:+$OTEL_RESOURCE_ATTRIBUTES,}}\"{}\n\
         export OTEL_RESOURCE_ATTRIBUTES\n",
        gemini_cli::shell_single_quote(&attribution.resource_attributes())
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn file(harness: Harness, path: &str, content: &str) -> RenderedFile {
        RenderedFile {
            harness,
            os: Os::Linux,
            path: path.into(),
            mode: FILE_MODE,
            content: content.as_bytes().to_vec(),
        }
    }

    fn attribution() -> Attribution {
        Attribution::new(
            "canary",
            "sha256:00ff",
            Some(Resolved {
                experiment: "cc-effort",
                salt: "s1",
                variant: "treatment",
            }),
            "alice@acme.com",
        )
    }

    #[test]
    fn the_unit_is_the_gateways_and_no_subject_is_written() {
        let a = attribution();
        assert_eq!(
            a.unit,
            assign::unit(&assign::unit_salt(Some("s1"), "canary"), "alice@acme.com")
        );
        let line = a.resource_attributes();
        assert_eq!(
            line,
            format!(
                "halo.ring=canary,halo.release=sha256:00ff,halo.experiment=cc-effort,halo.variant=treatment,halo.unit={}",
                a.unit
            )
        );
        assert!(!line.contains("alice"));
        let ring_only = Attribution::new("canary", "sha256:00ff", None, "alice@acme.com");
        assert_eq!(
            ring_only.unit,
            assign::unit(&assign::unit_salt(None, "canary"), "alice@acme.com")
        );
        assert!(!ring_only.resource_attributes().contains("halo.experiment"));
        assert_eq!(percent_encode("a b,c%"), "a%20b%2Cc%25");
    }

    #[test]
    fn each_harness_gets_what_it_honours_only_with_telemetry_on() {
        let cc = "/etc/claude-code/managed-settings.json";
        let mut files = vec![
            file(
                Harness::ClaudeCode,
                cc,
                "{\"env\": {\"CLAUDE_CODE_ENABLE_TELEMETRY\": \"1\"}}",
            ),
            file(
                Harness::Codex,
                "/etc/codex/managed_config.toml",
                "[otel.exporter.otlp-http]\nendpoint = \"http://h:4318/v1/logs\"\n",
            ),
            file(
                Harness::GeminiCli,
                "/etc/gemini-cli/settings.json",
                "{\"telemetry\": {\"enabled\": true}}",
            ),
            file(
                Harness::GeminiCli,
                "/etc/profile.d/halos-gemini-cli.sh",
                "GEMINI_API_KEY=x\n",
            ),
        ];
        let a = attribution();
        let warnings = attribute(&mut files, &a, Some("cli-token-1234"));
        assert!(warnings.is_empty(), "{warnings:?}");
        let got: serde_json::Value = serde_json::from_slice(&files[0].content).unwrap();
        assert_eq!(
            got["env"]["OTEL_RESOURCE_ATTRIBUTES"],
            a.resource_attributes()
        );
        assert_eq!(
            got["env"]["OTEL_EXPORTER_OTLP_HEADERS"],
            "Authorization=Bearer cli-token-1234"
        );
        let codex = String::from_utf8(files[1].content.clone()).unwrap();
        assert!(
            codex.contains("authorization = \"Bearer cli-token-1234\""),
            "{codex}"
        );
        assert_eq!(
            files[3].content, b"GEMINI_API_KEY=x\n",
            "Gemini CLI's own script"
        );
        // Codex and Gemini CLI read the attribution from the environment: one script of
        // halod's exports it.
        assert_eq!(files.len(), 5);
        assert_eq!(files[4].path, "/etc/profile.d/halos-telemetry.sh");
        let profile = String::from_utf8(files[4].content.clone()).unwrap();
        assert!(profile.contains(&format!("'{}'", a.resource_attributes())));
        assert!(!profile.contains("cli-token"), "no token in a shell export");
        // Telemetry off: nothing changes.
        let mut off = vec![
            file(Harness::ClaudeCode, cc, "{\"env\": {}}"),
            file(
                Harness::GeminiCli,
                "/etc/gemini-cli/settings.json",
                "{\"telemetry\": {\"enabled\": false}}",
            ),
            file(
                Harness::GeminiCli,
                "/etc/profile.d/halos-gemini-cli.sh",
                "GEMINI_API_KEY=x\n",
            ),
        ];
        let before = off.clone();
        attribute(&mut off, &a, Some("cli-token-1234"));
        assert_eq!(off, before);
    }

    #[test]
    fn codex_alone_gets_the_script_and_windows_a_warning() {
        let codex = |os: Os, path: &str| RenderedFile {
            os,
            ..file(Harness::Codex, path, "[otel]\nlog_user_prompt = false\n")
        };
        let mut files = vec![codex(Os::Linux, "/etc/codex/managed_config.toml")];
        assert!(attribute(&mut files, &attribution(), None).is_empty());
        assert_eq!(files[1].path, "/etc/profile.d/halos-telemetry.sh");
        let mut files = vec![RenderedFile {
            os: Os::Windows,
            ..file(
                Harness::GeminiCli,
                gemini_cli::settings_path(Os::Windows),
                "{\"telemetry\": {\"enabled\": true}}",
            )
        }];
        let warnings = attribute(&mut files, &attribution(), None);
        assert_eq!(files.len(), 1);
        assert_eq!(warnings.len(), 1, "{warnings:?}");
        assert!(warnings[0].contains("OTEL_RESOURCE_ATTRIBUTES"));
    }

    #[test]
    fn a_token_that_breaks_a_header_is_not_written() {
        let mut files = vec![file(
            Harness::ClaudeCode,
            "/etc/claude-code/managed-settings.json",
            "{\"env\": {\"CLAUDE_CODE_ENABLE_TELEMETRY\": \"1\"}}",
        )];
        let warnings = attribute(&mut files, &attribution(), Some("a,b=c"));
        assert_eq!(warnings.len(), 1);
        assert!(!warnings[0].contains("a,b=c"));
        let cc: serde_json::Value = serde_json::from_slice(&files[0].content).unwrap();
        assert!(cc["env"].get("OTEL_EXPORTER_OTLP_HEADERS").is_none());
        assert!(cc["env"].get("OTEL_RESOURCE_ATTRIBUTES").is_some());
    }
}
