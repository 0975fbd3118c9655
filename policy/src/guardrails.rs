//! TODO(helper): guardrails
