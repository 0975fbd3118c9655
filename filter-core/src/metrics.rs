//! The filter's counters, named once for both builds.
//!
//! Each counter has a name (`requests`) and tags (`ring`, `variant`, `status`). The wasm
//! build writes the tags into the name as `.<tag>.<value>` pairs
//! (`halo.requests.ring.canary.variant.none.status.200`), which the bootstrap's
//! `stats_config.stats_tags` (see halo-envoy-config) extracts; the native build defines
//! each counter (`halo.requests`) with its tags as labels (`halo_ring`...). Envoy keeps
//! each build's counters under a namespace it leaves out of Prometheus names
//! (`wasmcustom`; the native build's, registered by the bootstrap's runtime), so
//! Prometheus shows both as
//! `halo_requests{halo_ring="canary",halo_variant="none",halo_status="200"}`, and the
//! per-attempt stage's counts as the request filter's (`halo_attempt_rewrites`, not under
//! the cluster). The counters without tags are defined when a configuration starts, so
//! they read 0 rather than missing. The names are listed in docs/request-flows.md
//! ("Metrics"). Values never carry a user id, a header or a body: only policy names
//! (rings, variants), sources, outcomes and status codes.

use std::fmt::Write as _;

/// One count of one counter.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Counter<'a> {
    /// Requests through the filter, by ring, variant (`none` when unattributed) and
    /// response status.
    Requests {
        ring: &'a str,
        variant: Option<&'a str>,
        status: u32,
    },
    /// Local refusals of identity (401, duplicate identity header 400).
    AuthFailures,
    /// Decisions by ring, variant and which layer routed.
    Decisions {
        ring: &'a str,
        variant: Option<&'a str>,
        source: &'a str,
    },
    /// Kill-list polls (and the pushed list at start) by outcome.
    KillswitchFetch { outcome: &'a str },
    /// Upstream attempts the per-attempt stage gave another target's model id (failovers
    /// to a target with a different model, and first attempts whose endpoint changed
    /// model since the request filter's policy).
    AttemptRewrites,
    /// Hooks that panicked (native build: the request was answered 500).
    Panics,
    /// Tokens of decided model calls by ring, variant, the upstream that served (empty
    /// when none did) and kind ([`crate::account`]).
    Tokens {
        ring: &'a str,
        variant: Option<&'a str>,
        upstream: &'a str,
        kind: TokenKind,
    },
    /// Their cost from the policy's price table, in millionths of a USD (a call of
    /// unknown cost adds nothing).
    CostMicroUsd {
        ring: &'a str,
        variant: Option<&'a str>,
        upstream: &'a str,
    },
    /// Attempts refused 502 `upstream_auth_error` because the gateway has no key for
    /// their upstream (its environment variable or file missing), by upstream.
    UpstreamAuthErrors { upstream: &'a str },
    /// Shadow jobs of decided mirrors by outcome: `sent` (handed to Envoy), `not_sent`
    /// (Envoy refused to start the callout), or why none was built (`later_turn`,
    /// `too_large`, `not_served`: [`crate::shadow::Skip`]). What became of a sent job is
    /// in Envoy's own stats of the mirror service's cluster.
    ShadowJobs { outcome: &'a str },
}

/// How a token is billed (halo-providers' `usage::Usage` fields).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TokenKind {
    Input,
    Output,
    CacheWrite,
    CacheRead,
}

impl TokenKind {
    pub fn as_str(self) -> &'static str {
        match self {
            TokenKind::Input => "input",
            TokenKind::Output => "output",
            TokenKind::CacheWrite => "cache_write",
            TokenKind::CacheRead => "cache_read",
        }
    }
}

/// A counter's name and tag names, as the native build defines it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Definition {
    pub name: &'static str,
    pub tags: &'static [&'static str],
}

pub const REQUESTS: Definition = Definition {
    name: "requests",
    tags: &["ring", "variant", "status"],
};
pub const AUTH_FAILURES: Definition = Definition {
    name: "auth_failures",
    tags: &[],
};
pub const DECISIONS: Definition = Definition {
    name: "decisions",
    tags: &["ring", "variant", "source"],
};
pub const KILLSWITCH_FETCH: Definition = Definition {
    name: "killswitch_fetch",
    tags: &["outcome"],
};
pub const ATTEMPT_REWRITES: Definition = Definition {
    name: "attempt_rewrites",
    tags: &[],
};
pub const PANICS: Definition = Definition {
    name: "panics",
    tags: &[],
};
pub const TOKENS: Definition = Definition {
    name: "tokens",
    tags: &["ring", "variant", "upstream", "kind"],
};
pub const COST_MICRO_USD: Definition = Definition {
    name: "cost_micro_usd",
    tags: &["ring", "variant", "upstream"],
};

pub const UPSTREAM_AUTH_ERRORS: Definition = Definition {
    name: "upstream_auth_errors",
    tags: &["upstream"],
};
pub const SHADOW_JOBS: Definition = Definition {
    name: "shadow_jobs",
    tags: &["outcome"],
};

/// Every counter.
pub const ALL: [Definition; 10] = [
    REQUESTS,
    AUTH_FAILURES,
    DECISIONS,
    KILLSWITCH_FETCH,
    ATTEMPT_REWRITES,
    PANICS,
    TOKENS,
    COST_MICRO_USD,
    UPSTREAM_AUTH_ERRORS,
    SHADOW_JOBS,
];

/// The prefix of every counter name (and of every Prometheus label name).
pub const PREFIX: &str = "halo";

impl Definition {
    /// The counter's stats name without its tags (`halo.requests`): the native build's
    /// name, and the wasm build's for a counter without tags.
    pub fn stat_name(&self) -> String {
        format!("{PREFIX}.{}", self.name)
    }
}

impl Counter<'_> {
    pub fn definition(&self) -> Definition {
        match self {
            Counter::Requests { .. } => REQUESTS,
            Counter::AuthFailures => AUTH_FAILURES,
            Counter::Decisions { .. } => DECISIONS,
            Counter::KillswitchFetch { .. } => KILLSWITCH_FETCH,
            Counter::AttemptRewrites => ATTEMPT_REWRITES,
            Counter::Panics => PANICS,
            Counter::Tokens { .. } => TOKENS,
            Counter::CostMicroUsd { .. } => COST_MICRO_USD,
            Counter::UpstreamAuthErrors { .. } => UPSTREAM_AUTH_ERRORS,
            Counter::ShadowJobs { .. } => SHADOW_JOBS,
        }
    }

    /// A count made on every request (requests, decisions, auth failures, tokens, cost):
    /// both builds add these up in the worker and hand the sums to Envoy once a tick
    /// (a second), since a call into Envoy per count cost a wasm request more than its
    /// decision did. The others are rare, or counted where no tick runs (the per-attempt
    /// stage), and go to Envoy at once.
    pub fn per_request(&self) -> bool {
        match self {
            Counter::Requests { .. }
            | Counter::Decisions { .. }
            | Counter::AuthFailures
            | Counter::Tokens { .. }
            | Counter::CostMicroUsd { .. } => true,
            Counter::KillswitchFetch { .. }
            | Counter::UpstreamAuthErrors { .. }
            | Counter::ShadowJobs { .. }
            | Counter::AttemptRewrites
            | Counter::Panics => false,
        }
    }

    /// The tag values, in the order of [`Definition::tags`].
    pub fn values(&self) -> Vec<String> {
        let mut values = Vec::with_capacity(self.definition().tags.len());
        self.each_value(&mut |value| {
            values.push(match value {
                TagValue::Text(text) => text.to_string(),
                TagValue::Number(n) => n.to_string(),
            })
        });
        values
    }

    /// Each tag value, in the order of [`Definition::tags`], borrowed: the wasm build
    /// names a counter on every count, and allocating each value for it cost more than
    /// the count itself.
    fn each_value(&self, f: &mut dyn FnMut(TagValue<'_>)) {
        fn variant(v: Option<&str>) -> TagValue<'_> {
            TagValue::Text(v.unwrap_or("none"))
        }
        match *self {
            Counter::Requests {
                ring,
                variant: v,
                status,
            } => {
                f(TagValue::Text(ring));
                f(variant(v));
                f(TagValue::Number(status));
            }
            Counter::Decisions {
                ring,
                variant: v,
                source,
            } => {
                f(TagValue::Text(ring));
                f(variant(v));
                f(TagValue::Text(source));
            }
            Counter::KillswitchFetch { outcome } | Counter::ShadowJobs { outcome } => {
                f(TagValue::Text(outcome));
            }
            Counter::UpstreamAuthErrors { upstream } => f(TagValue::Text(upstream)),
            Counter::Tokens {
                ring,
                variant: v,
                upstream,
                kind,
            } => {
                f(TagValue::Text(ring));
                f(variant(v));
                f(TagValue::Text(none_if_empty(upstream)));
                f(TagValue::Text(kind.as_str()));
            }
            Counter::CostMicroUsd {
                ring,
                variant: v,
                upstream,
            } => {
                f(TagValue::Text(ring));
                f(variant(v));
                f(TagValue::Text(none_if_empty(upstream)));
            }
            Counter::AuthFailures | Counter::AttemptRewrites | Counter::Panics => {}
        }
    }

    /// The name with its tags in it (the wasm build's stats name).
    pub fn dotted(&self) -> String {
        let mut name = String::new();
        self.write_dotted(&mut name);
        name
    }

    /// [`Counter::dotted`] appended to `out`, allocating nothing when `out` has room.
    pub fn write_dotted(&self, out: &mut String) {
        let d = self.definition();
        out.push_str(PREFIX);
        out.push('.');
        out.push_str(d.name);
        let mut tags = d.tags.iter();
        self.each_value(&mut |value| {
            out.push('.');
            out.push_str(tags.next().copied().unwrap_or_default());
            out.push('.');
            match value {
                TagValue::Text(text) => push_clean(out, text),
                TagValue::Number(n) => {
                    // Writing to a String cannot fail.
                    let _ = write!(out, "{n}");
                }
            }
        });
    }
}

/// One tag value as [`Counter::each_value`] lends it.
enum TagValue<'a> {
    Text(&'a str),
    Number(u32),
}

fn none_if_empty(value: &str) -> &str {
    if value.is_empty() { "none" } else { value }
}

/// The Prometheus label name of tag `tag` (`halo_ring`).
pub fn label(tag: &str) -> String {
    format!("{PREFIX}_{tag}")
}

/// `value` appended to `out`, made safe in a dotted stats name and a Prometheus label.
fn push_clean(out: &mut String, value: &str) {
    out.extend(value.chars().map(|c| {
        if c.is_ascii_alphanumeric() || c == '-' || c == '_' {
            c
        } else {
            '_'
        }
    }));
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_carry_tags() {
        let requests = Counter::Requests {
            ring: "canary",
            variant: None,
            status: 200,
        };
        assert_eq!(
            requests.dotted(),
            "halo.requests.ring.canary.variant.none.status.200"
        );
        let decisions = Counter::Decisions {
            ring: "a.b",
            variant: Some("v 1"),
            source: "experiment",
        };
        assert_eq!(
            decisions.dotted(),
            "halo.decisions.ring.a_b.variant.v_1.source.experiment"
        );
        assert_eq!(decisions.values(), ["a.b", "v 1", "experiment"]);
        assert_eq!(Counter::AttemptRewrites.dotted(), "halo.attempt_rewrites");
        assert_eq!(
            Counter::KillswitchFetch {
                outcome: "accepted"
            }
            .dotted(),
            "halo.killswitch_fetch.outcome.accepted"
        );
        let tokens = Counter::Tokens {
            ring: "general",
            variant: Some("canary"),
            upstream: "anthropic-direct",
            kind: TokenKind::CacheRead,
        };
        assert_eq!(
            tokens.dotted(),
            "halo.tokens.ring.general.variant.canary.upstream.anthropic-direct.kind.cache_read"
        );
        let cost = Counter::CostMicroUsd {
            ring: "general",
            variant: None,
            upstream: "",
        };
        assert_eq!(
            cost.dotted(),
            "halo.cost_micro_usd.ring.general.variant.none.upstream.none"
        );
    }
}
