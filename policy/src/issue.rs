//! Issues: what loading and validation found wrong (or worth a warning) in a policy,
//! each naming the file, the document and the field.

use std::fmt;

use crate::types::DocumentSource;

#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Severity {
    /// The policy is refused.
    Error,
    /// Printed, but the policy is accepted.
    Warning,
}

/// One problem in a policy.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Issue {
    pub severity: Severity,
    /// The document; `None` for problems of the repo as a whole (a missing halos.yaml).
    pub source: Option<DocumentSource>,
    /// Field path inside the document, for example `models.opus.targets[1].weight`;
    /// empty for the document as a whole.
    pub field: String,
    /// The rule or guardrail that found it, for example `guardNoBypass` or `reference`.
    pub rule: String,
    pub message: String,
}

impl Issue {
    pub fn error(
        source: Option<DocumentSource>,
        field: impl Into<String>,
        rule: impl Into<String>,
        message: impl Into<String>,
    ) -> Issue {
        Issue {
            severity: Severity::Error,
            source,
            field: field.into(),
            rule: rule.into(),
            message: message.into(),
        }
    }

    pub fn warning(
        source: Option<DocumentSource>,
        field: impl Into<String>,
        rule: impl Into<String>,
        message: impl Into<String>,
    ) -> Issue {
        Issue {
            severity: Severity::Warning,
            ..Issue::error(source, field, rule, message)
        }
    }

    pub fn is_error(&self) -> bool {
        self.severity == Severity::Error
    }
}

impl fmt::Display for Issue {
    /// `error: gateway.yaml (document 1): models.opus.targets[0].weight: weight must be at least 1 [range]`
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let level = match self.severity {
            Severity::Error => "error",
            Severity::Warning => "warning",
        };
        write!(f, "{level}: ")?;
        match &self.source {
            Some(source) => write!(f, "{source}: ")?,
            None => write!(f, "policy: ")?,
        }
        if !self.field.is_empty() {
            write!(f, "{}: ", self.field)?;
        }
        write!(f, "{} [{}]", self.message, self.rule)
    }
}

/// True when any issue refuses the policy.
pub fn has_errors(issues: &[Issue]) -> bool {
    issues.iter().any(Issue::is_error)
}
