//! The response side of a decided model call (DESIGN.md "The evidence loop", step 1):
//! usage read from the answer as it streams by, its cost, the time to its first byte and
//! the target that served it, written as [`Fact`]s where Envoy's OpenTelemetry access
//! logger reads them (halo-envoy-config's `evidence`), and counted for Prometheus.
//!
//! Never in the way of the answer: each piece is fed to the usage [`Meter`] and passed
//! on unchanged in the same hook (nothing is held, nothing waits), and nothing here can
//! refuse or alter a response. The facts are written as they become known (usage at
//! `message_start` and again at `message_delta`, say), not at the end: a stream cut
//! before its end leaves what was seen, and `halo.complete` is written only when the
//! answer ended normally with its final usage.
//!
//! Envoy itself supplies what it measures (status, attempts, duration) and what the
//! serving endpoint's metadata says (upstream, model, target): each fact once.

use std::sync::Arc;
use std::time::Duration;

use halo_contract::facts::Fact;
use halo_policy::Snapshot;
use halo_policy::admit::Operation;
use halo_policy::types::{Price, WireProtocol};
use halo_providers::usage::{Dialect, Framing, Meter, Usage};

use crate::host::Host;
use crate::metrics::{Counter, TokenKind};

/// The endpoint metadata keys (`filter_metadata.halo`) of the target that served.
const SERVED_UPSTREAM: &str = "upstream";
const SERVED_MODEL: &str = "model";

/// What the decision tells the account about a call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Call {
    /// The wire the answer comes back in: the client's (a translated answer is converted
    /// back by the per-attempt stage before it reaches the request filter).
    pub dialect: Dialect,
    /// The salted hash of the verified subject (halo-policy's `assign::unit`).
    pub unit: String,
    pub alias: String,
    /// The budgets that apply to the caller, encoded for the budget check
    /// (halo-policy's `budgets::encode_keys`), and the client's wire; `None`: no budget
    /// applies, and Envoy's budget check asks nothing.
    pub budgets: Option<(String, WireProtocol)>,
}

impl Call {
    /// The account of a model call on `wire`; `None` for an operation that is not one
    /// (token counting: the spec records model calls only).
    pub fn new(
        wire: WireProtocol,
        operation: Operation,
        unit: String,
        alias: String,
        budgets: Option<String>,
    ) -> Option<Call> {
        if operation == Operation::CountTokens {
            return None;
        }
        Some(Call {
            dialect: Dialect::of(wire, operation),
            unit,
            alias,
            budgets: budgets.map(|b| (b, wire)),
        })
    }
}

/// The target that served: its upstream's name (the Prometheus label) and its price.
#[derive(Debug, Clone, Default)]
struct Served {
    upstream: String,
    price: Option<Price>,
}

/// `d` in seconds with three decimals, rounded to the millisecond (integer formatting: a
/// float's costs several times as much, on every call).
fn seconds_3(d: Duration) -> String {
    let ms = (d.as_micros() + 500) / 1000;
    format!("{}.{:03}", ms / 1000, ms % 1000)
}

/// One call's account, from the decision to the end of the stream.
pub struct Account {
    call: Call,
    started: Duration,
    /// Read from the serving endpoint when first needed (the first usage to price): an
    /// answer without usage costs no metadata lookups.
    served: Option<Served>,
    /// The snapshot in force when the answer began: its price table.
    prices: Option<Arc<Snapshot>>,
    meter: Option<Meter>,
    /// The first response byte was seen (its time written).
    first_byte: bool,
    /// The usage and cost as last written.
    written: Usage,
    cost: Option<f64>,
    /// The answer ended (finished or cut): nothing more to read.
    ended: bool,
    /// The stream's end was counted.
    counted: bool,
}

impl Account {
    /// The decision was made: note the unit and alias, and start the clock.
    pub fn start<H: Host>(host: &mut H, call: Call) -> Account {
        host.set_fact(Fact::Unit, &call.unit);
        host.set_fact(Fact::Alias, &call.alias);
        if let Some((keys, wire)) = &call.budgets {
            // Before the budget check reads them (it runs after this filter), and the
            // amounts from 0: a descriptor whose amount is absent would not be sent.
            host.set_fact(Fact::Budgets, keys);
            host.set_fact(Fact::Wire, wire.as_str());
            host.set_fact(Fact::BudgetTokens, "0");
            host.set_fact(Fact::BudgetMicroUsd, "0");
        }
        Account {
            started: host.now(),
            call,
            served: None,
            prices: None,
            meter: None,
            first_byte: false,
            written: Usage::default(),
            cost: None,
            ended: false,
            counted: false,
        }
    }

    /// The answer's headers (`status`: its `:status`): the price table in force (which target served is read when
    /// its first usage is priced), and how to read the body
    /// (a success only: an error answer carries no usage). `end_of_stream`: the answer
    /// has no body.
    pub fn on_response_headers<H: Host>(
        &mut self,
        host: &mut H,
        prices: Arc<Snapshot>,
        status: Option<u16>,
        end_of_stream: bool,
    ) {
        self.prices = Some(prices);
        let success = status.is_some_and(|s| (200..300).contains(&s));
        if success {
            let framing = host
                .response_header("content-type")
                .map_or(Framing::Json, |ct| Framing::from_content_type(&ct));
            self.meter = Some(Meter::new(self.call.dialect, framing));
        }
        if end_of_stream {
            self.first_byte(host);
            self.finish(host);
        }
    }

    /// A piece of the answer, as it goes to the client.
    pub fn on_response_body<H: Host>(&mut self, host: &mut H, end_of_stream: bool) {
        if self.ended {
            return;
        }
        self.first_byte(host);
        if let Some(meter) = self.meter.as_mut() {
            meter.feed(&host.response_body());
            let usage = meter.usage();
            self.write(host, usage);
        }
        if end_of_stream {
            self.finish(host);
        }
    }

    /// The stream is over (answered in full, cut, or reset): count what was seen.
    pub fn on_stream_complete<H: Host>(&mut self, host: &mut H, ring: &str, variant: Option<&str>) {
        self.ended = true;
        if std::mem::replace(&mut self.counted, true) {
            return;
        }
        let upstream = self.served.as_ref().map_or("", |s| s.upstream.as_str());
        let u = self.written;
        for (kind, n) in [
            (TokenKind::Input, u.input_tokens),
            (TokenKind::Output, u.output_tokens),
            (TokenKind::CacheWrite, u.cache_write_tokens),
            (TokenKind::CacheRead, u.cache_read_tokens),
        ] {
            if let Some(n) = n.filter(|n| *n > 0) {
                host.add(
                    Counter::Tokens {
                        ring,
                        variant,
                        upstream,
                        kind,
                    },
                    n,
                );
            }
        }
        if let Some(cost) = self.cost {
            let micros = (cost * 1e6).round();
            if micros >= 1.0 {
                host.add(
                    Counter::CostMicroUsd {
                        ring,
                        variant,
                        upstream,
                    },
                    micros as u64,
                );
            }
        }
    }

    fn first_byte<H: Host>(&mut self, host: &mut H) {
        if self.first_byte {
            return;
        }
        self.first_byte = true;
        let ttft = host.now().saturating_sub(self.started);
        host.set_fact(Fact::TimeToFirstToken, &seconds_3(ttft));
    }

    /// The answer ended normally: its last usage, and whether it is complete.
    fn finish<H: Host>(&mut self, host: &mut H) {
        self.ended = true;
        let Some(meter) = self.meter.take() else {
            return;
        };
        let accounting = meter.finish();
        self.write(host, accounting.usage);
        if accounting.complete {
            host.set_fact(Fact::Complete, "true");
        }
    }

    /// The target that served, read once from its endpoint's metadata.
    fn served<H: Host>(&mut self, host: &H) -> &Served {
        let prices = self.prices.as_deref();
        self.served.get_or_insert_with(|| {
            let upstream = host.served_metadata(SERVED_UPSTREAM).unwrap_or_default();
            let model = host.served_metadata(SERVED_MODEL).unwrap_or_default();
            let price = prices.and_then(|p| p.price(&upstream, &model)).copied();
            Served { upstream, price }
        })
    }

    /// Write the usage fields that changed since the last write, and the cost.
    fn write<H: Host>(&mut self, host: &mut H, usage: Usage) {
        if usage == self.written {
            return;
        }
        let old = self.written;
        // GenAI's input_tokens counts every prompt token, the cache's included.
        let prompt = |u: &Usage| {
            u.input_tokens
                .map(|i| i + u.cache_write_tokens.unwrap_or(0) + u.cache_read_tokens.unwrap_or(0))
        };
        for (fact, new, was) in [
            (Fact::InputTokens, prompt(&usage), prompt(&old)),
            (Fact::OutputTokens, usage.output_tokens, old.output_tokens),
            (
                Fact::CacheWriteTokens,
                usage.cache_write_tokens,
                old.cache_write_tokens,
            ),
            (
                Fact::CacheReadTokens,
                usage.cache_read_tokens,
                old.cache_read_tokens,
            ),
        ] {
            if let Some(n) = new.filter(|_| new != was) {
                host.set_fact(fact, &n.to_string());
            }
        }
        self.written = usage;
        let price = self.served(host).price.as_ref();
        let cost = usage.cost_usd(price);
        if let Some(c) = cost.filter(|_| cost != self.cost) {
            host.set_fact(Fact::CostUsd, &c.to_string());
            if self.call.budgets.is_some() {
                let micros = halo_policy::budgets::micro_usd(c);
                host.set_fact(Fact::BudgetMicroUsd, &micros.to_string());
            }
        }
        self.cost = cost;
        if self.call.budgets.is_some() {
            // What a token budget counts: every prompt token and every output token.
            let tokens = |u: &Usage| prompt(u).unwrap_or(0) + u.output_tokens.unwrap_or(0);
            if tokens(&usage) != tokens(&old) {
                host.set_fact(Fact::BudgetTokens, &tokens(&usage).to_string());
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::seconds_3;
    use std::time::Duration;

    #[test]
    fn the_time_to_first_byte_is_seconds_with_three_decimals_rounded() {
        assert_eq!(seconds_3(Duration::from_millis(50)), "0.050");
        assert_eq!(seconds_3(Duration::from_micros(12_499)), "0.012");
        assert_eq!(seconds_3(Duration::from_micros(12_500)), "0.013");
        assert_eq!(seconds_3(Duration::from_micros(61_999_600)), "62.000");
        assert_eq!(seconds_3(Duration::ZERO), "0.000");
    }
}
