//! CheckRendered: the backstop that refuses any rendered file carrying a
//! permission-bypass token, with the same token list as validation's guardNoBypass
//! (`halo_policy::guardrails::find_bypass_token`).
//!
//! Each JSON or TOML file is decoded and every key and string value checked, so the
//! error names the field; then the raw bytes of every file are scanned, so a file that
//! does not parse, or is neither JSON nor TOML (a shell profile), is still covered.
//! Per-harness check: a `.json`/`.toml` file that does not decode is itself refused,
//! since the harness would ignore it and fall back to unmanaged settings.

use halo_policy::guardrails::find_bypass_token;

use crate::adapters::RenderedFile;

/// Why a rendered file was refused.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CheckError {
    #[error(
        "{harness} ({os}) {file}: field {field} contains the permission-bypass token `{token}`"
    )]
    BypassField {
        harness: &'static str,
        os: &'static str,
        file: String,
        field: String,
        token: &'static str,
    },
    #[error("{harness} ({os}) {file}: contains the permission-bypass token `{token}`")]
    BypassBytes {
        harness: &'static str,
        os: &'static str,
        file: String,
        token: &'static str,
    },
    #[error("{harness} ({os}) {file}: does not decode as {format}: {message}")]
    Malformed {
        harness: &'static str,
        os: &'static str,
        file: String,
        format: &'static str,
        message: String,
    },
}

/// Check one rendered file.
pub fn check_rendered(file: &RenderedFile) -> Result<(), CheckError> {
    let harness = file.harness.as_str();
    let os = file.os.as_str();
    let lower = file.path.to_ascii_lowercase();
    let text = String::from_utf8_lossy(&file.content);
    let decoded: Option<serde_json::Value> = if lower.ends_with(".json") {
        Some(
            serde_json::from_slice(&file.content).map_err(|e| CheckError::Malformed {
                harness,
                os,
                file: file.path.clone(),
                format: "JSON",
                message: e.to_string(),
            })?,
        )
    } else if lower.ends_with(".toml") {
        let table: toml::Table = toml::from_str(&text).map_err(|e| CheckError::Malformed {
            harness,
            os,
            file: file.path.clone(),
            format: "TOML",
            message: e.message().to_string(),
        })?;
        Some(serde_json::to_value(table).unwrap_or(serde_json::Value::Null))
    } else {
        None
    };
    if let Some(value) = decoded {
        let mut found = None;
        walk(&value, String::new(), &mut |field, s| {
            if found.is_none()
                && let Some(token) = find_bypass_token(s)
            {
                found = Some((field.to_string(), token));
            }
        });
        if let Some((field, token)) = found {
            return Err(CheckError::BypassField {
                harness,
                os,
                file: file.path.clone(),
                field,
                token,
            });
        }
    }
    if let Some(token) = find_bypass_token(&text) {
        return Err(CheckError::BypassBytes {
            harness,
            os,
            file: file.path.clone(),
            token,
        });
    }
    Ok(())
}

/// Call `f(field path, string)` for every object key and string value.
fn walk(value: &serde_json::Value, path: String, f: &mut dyn FnMut(&str, &str)) {
    match value {
        serde_json::Value::String(s) => f(if path.is_empty() { "." } else { &path }, s),
        serde_json::Value::Array(items) => {
            for (i, item) in items.iter().enumerate() {
                walk(item, format!("{path}[{i}]"), f);
            }
        }
        serde_json::Value::Object(map) => {
            for (key, item) in map {
                let child = if path.is_empty() {
                    key.clone()
                } else {
                    format!("{path}.{key}")
                };
                f(&child, key);
                walk(item, child, f);
            }
        }
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::adapters::{FILE_MODE, Os};
    use halo_policy::Harness;

    fn file(path: &str, content: &str) -> RenderedFile {
        RenderedFile {
            harness: Harness::ClaudeCode,
            os: Os::Linux,
            path: path.into(),
            mode: FILE_MODE,
            content: content.as_bytes().to_vec(),
        }
    }

    #[test]
    fn names_the_json_field() {
        let err = check_rendered(&file(
            "/etc/claude-code/managed-settings.json",
            r#"{"permissions": {"allow": ["Read"], "defaultMode": "bypassPermissions"}}"#,
        ))
        .unwrap_err();
        assert_eq!(
            err,
            CheckError::BypassField {
                harness: "claude-code",
                os: "linux",
                file: "/etc/claude-code/managed-settings.json".into(),
                field: "permissions.defaultMode".into(),
                token: "bypassPermissions",
            }
        );
        assert!(err.to_string().contains("managed-settings.json"));
    }

    #[test]
    fn names_the_toml_field_and_array_index() {
        let err = check_rendered(&file(
            "/etc/codex/managed_config.toml",
            "[mcp_servers.x]\nargs = [\"ok\", \"--dangerously-bypass-approvals-and-sandbox\"]\n",
        ))
        .unwrap_err();
        assert!(
            matches!(&err, CheckError::BypassField { field, .. } if field == "mcp_servers.x.args[1]"),
            "{err}"
        );
    }

    #[test]
    fn scans_raw_bytes_of_other_files_and_refuses_malformed() {
        let err =
            check_rendered(&file("/etc/profile.d/x.sh", "alias g='gemini --yolo'\n")).unwrap_err();
        assert!(matches!(
            err,
            CheckError::BypassBytes {
                token: "--yolo",
                ..
            }
        ));
        let err =
            check_rendered(&file("/etc/claude-code/managed-settings.json", "{nope")).unwrap_err();
        assert!(matches!(err, CheckError::Malformed { format: "JSON", .. }));
        assert!(
            check_rendered(&file(
                "/etc/claude-code/managed-settings.json",
                r#"{"disableBypassPermissionsMode": "disable"}"#
            ))
            .is_ok()
        );
    }
}
