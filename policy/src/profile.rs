//! Profile inheritance: `extends` resolved into one effective Profile.
//!
//! Pure, so the release builder, `halo` and halod's tooling answer the same way. The
//! child overrides the parent, field by field:
//! - `harnesses`: per harness. A harness both name takes the child's `version`, the
//!   child's `model` (else the parent's) and the parent's `overrides` with the child's
//!   merged over them (objects deep-merged, anything else replaced).
//! - `mcp` and `hooks`: per key (a server name, an event name); the child's entry wins.
//! - `models`: the child's list when it has one, else the parent's.
//! - `permissions`, `telemetry`, `egress`: the child's when set, else the parent's.

use std::collections::BTreeSet;

use crate::types::{Org, Profile, Settings};

/// Why a profile could not be resolved. Validation reports the same problems with
/// file and field; these name the profiles involved.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum ResolveError {
    #[error("profile {0:?} does not exist")]
    Missing(String),
    #[error("profile {child:?} extends {parent:?}, which does not exist")]
    MissingParent { child: String, parent: String },
    #[error("profile extends forms a cycle: {0}")]
    Cycle(String),
}

/// The effective profile `name`: its `extends` chain merged, root first. The result
/// keeps `name` and has no `extends`.
pub fn resolve(org: &Org, name: &str) -> Result<Profile, ResolveError> {
    let mut chain: Vec<&Profile> = Vec::new();
    let mut seen = BTreeSet::new();
    let mut current = org
        .profiles
        .get(name)
        .ok_or_else(|| ResolveError::Missing(name.to_string()))?;
    loop {
        if !seen.insert(current.name.as_str()) {
            let mut names: Vec<&str> = chain.iter().map(|p| p.name.as_str()).collect();
            names.push(current.name.as_str());
            return Err(ResolveError::Cycle(names.join(" -> ")));
        }
        chain.push(current);
        let Some(parent) = current.extends.as_deref() else {
            break;
        };
        current = org
            .profiles
            .get(parent)
            .ok_or_else(|| ResolveError::MissingParent {
                child: current.name.clone(),
                parent: parent.to_string(),
            })?;
    }
    let mut effective = chain.pop().cloned().unwrap_or_default();
    while let Some(child) = chain.pop() {
        effective = merge(effective, child);
    }
    effective.name = name.to_string();
    effective.extends = None;
    Ok(effective)
}

/// `child` over `parent`, by the rules in the module comment.
pub fn merge(mut parent: Profile, child: &Profile) -> Profile {
    for (harness, settings) in &child.harnesses {
        match parent.harnesses.get_mut(harness) {
            Some(base) => {
                base.version = settings.version.clone();
                if settings.model.is_some() {
                    base.model = settings.model.clone();
                }
                merge_settings(&mut base.overrides, &settings.overrides);
            }
            None => {
                parent.harnesses.insert(*harness, settings.clone());
            }
        }
    }
    for (name, server) in &child.mcp {
        parent.mcp.insert(name.clone(), server.clone());
    }
    for (event, hooks) in &child.hooks {
        parent.hooks.insert(event.clone(), hooks.clone());
    }
    if !child.models.is_empty() {
        parent.models = child.models.clone();
    }
    if child.permissions.is_some() {
        parent.permissions = child.permissions.clone();
    }
    if child.telemetry.is_some() {
        parent.telemetry = child.telemetry.clone();
    }
    if child.egress.is_some() {
        parent.egress = child.egress.clone();
    }
    parent.name = child.name.clone();
    parent.extends = child.extends.clone();
    parent
}

/// Merge `over` into `base`: objects deep-merged, any other value replaced.
pub fn merge_settings(base: &mut Settings, over: &Settings) {
    for (key, value) in over {
        match (base.get_mut(key), value) {
            (Some(serde_json::Value::Object(b)), serde_json::Value::Object(o)) => {
                merge_json_objects(b, o);
            }
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

/// Deep-merge JSON object `over` into `base`.
pub fn merge_json_objects(
    base: &mut serde_json::Map<String, serde_json::Value>,
    over: &serde_json::Map<String, serde_json::Value>,
) {
    for (key, value) in over {
        match (base.get_mut(key), value) {
            (Some(serde_json::Value::Object(b)), serde_json::Value::Object(o)) => {
                merge_json_objects(b, o);
            }
            _ => {
                base.insert(key.clone(), value.clone());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::{Harness, HarnessSettings, McpServer, Permissions};
    use serde_json::json;

    fn profile(name: &str, extends: Option<&str>) -> Profile {
        Profile {
            name: name.into(),
            extends: extends.map(Into::into),
            ..Profile::default()
        }
    }

    fn org(profiles: Vec<Profile>) -> Org {
        Org {
            profiles: profiles.into_iter().map(|p| (p.name.clone(), p)).collect(),
            ..Org::default()
        }
    }

    #[test]
    fn child_overrides_parent_field_by_field() {
        let mut base = profile("base", None);
        base.models = vec!["sonnet".into()];
        base.permissions = Some(Permissions {
            default_mode: Some("default".into()),
            ..Permissions::default()
        });
        base.harnesses.insert(
            Harness::ClaudeCode,
            HarnessSettings {
                version: "1.0.0".into(),
                model: Some("sonnet".into()),
                overrides: [
                    ("a".to_string(), json!({"x": 1, "y": 2})),
                    ("b".to_string(), json!(true)),
                ]
                .into(),
            },
        );
        base.mcp.insert("one".into(), McpServer::default());
        let mut child = profile("child", Some("base"));
        child.harnesses.insert(
            Harness::ClaudeCode,
            HarnessSettings {
                version: "2.0.0".into(),
                model: None,
                overrides: [("a".to_string(), json!({"y": 3}))].into(),
            },
        );
        child.mcp.insert(
            "two".into(),
            McpServer {
                url: Some("https://mcp.example.com".into()),
                ..McpServer::default()
            },
        );
        let resolved = resolve(&org(vec![base, child]), "child").unwrap();
        let cc = &resolved.harnesses[&Harness::ClaudeCode];
        assert_eq!(cc.version, "2.0.0");
        assert_eq!(cc.model.as_deref(), Some("sonnet"), "model falls back");
        assert_eq!(cc.overrides["a"], json!({"x": 1, "y": 3}), "deep merge");
        assert_eq!(cc.overrides["b"], json!(true));
        assert_eq!(resolved.models, vec!["sonnet".to_string()]);
        assert_eq!(
            resolved.permissions.unwrap().default_mode.as_deref(),
            Some("default")
        );
        assert_eq!(resolved.mcp.len(), 2);
        assert_eq!(resolved.name, "child");
        assert_eq!(resolved.extends, None);
    }

    #[test]
    fn missing_parent_and_cycles_are_errors() {
        let o = org(vec![profile("a", Some("nope"))]);
        assert_eq!(
            resolve(&o, "a"),
            Err(ResolveError::MissingParent {
                child: "a".into(),
                parent: "nope".into()
            })
        );
        let o = org(vec![profile("a", Some("b")), profile("b", Some("a"))]);
        assert_eq!(
            resolve(&o, "a"),
            Err(ResolveError::Cycle("a -> b -> a".into()))
        );
        assert_eq!(resolve(&o, "zzz"), Err(ResolveError::Missing("zzz".into())));
    }
}
