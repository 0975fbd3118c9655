//! Always-valid inference for the difference treatment - control: a confidence sequence
//! that may be looked at after every sample without inflating the error rate.
//!
//! Method: the mixture sequential probability ratio test (mSPRT) with a normal mixing
//! distribution, as in Johari, Pekelis and Walsh, "Always Valid Inference: Continuous
//! Monitoring of A/B Tests" (Operations Research 70(3), 2022; arXiv:1512.04922), whose
//! inversion is the normal-mixture confidence sequence of Howard, Ramdas, McAuliffe and
//! Sekhon, "Time-uniform, nonparametric, nonasymptotic confidence sequences" (Annals of
//! Statistics 49(2), 2021), section 3.
//!
//! For an estimate `d` of the difference with variance `v` (the sum of each arm's
//! variance over its count) and a N(0, tau^2) mixture over the true difference, the
//! mixture likelihood ratio against the difference `theta` is
//!
//! ```text
//! L = sqrt(v / (v + tau^2)) * exp(tau^2 (d - theta)^2 / (2 v (v + tau^2)))
//! ```
//!
//! and `{theta : L < 1/alpha}` holds the true difference at every sample size at once with
//! probability at least 1 - alpha (Ville's inequality). Solved for theta it is `d +- w`,
//!
//! ```text
//! w^2 = v (v + tau^2) / tau^2 * (2 ln(1/alpha) + ln((v + tau^2) / v))
//! ```
//!
//! The arm variances are plug-in estimates (the test is asymptotically valid, as in
//! Johari et al.); an arm counts only from [`MIN_ARM_SAMPLES`] on, and a 0/1 metric's
//! variance is taken from the proportion with one success and one failure added, so a
//! run of zeros (no errors yet) never reads as certainty. The mixture is scale-free: its
//! standard deviation is [`MIXTURE_EFFECT_SD`] per-unit standard deviations.
//!
//! Everything here is pure and O(1) per update, so the controller can re-examine every
//! experiment on every tick, and the simulation in `tests/stats_simulation.rs` can check
//! the error rate over 10,000 runs of 1,000 looks.

use serde::{Deserialize, Serialize};

/// Samples an arm needs before it enters a confidence sequence (the plug-in variance and
/// the normal approximation need some data).
pub const MIN_ARM_SAMPLES: u64 = 30;

/// The mixture's standard deviation in units of the per-unit standard deviation: the
/// effect size the test is most sensitive to, roughly. A 10% relative regression of a
/// latency with a coefficient of variation of 0.5-1 is 0.1-0.2 standard deviations.
pub const MIXTURE_EFFECT_SD: f64 = 0.1;

/// Running summary of one arm: count, mean and sum of squared deviations (Welford), and
/// whether every value so far was 0 or 1 (a proportion). O(1) per sample.
#[derive(Debug, Clone, Copy, PartialEq, Serialize)]
pub struct Arm {
    pub n: u64,
    pub mean: f64,
    m2: f64,
    binary: bool,
}

impl Default for Arm {
    fn default() -> Self {
        Arm {
            n: 0,
            mean: 0.0,
            m2: 0.0,
            binary: true,
        }
    }
}

impl Arm {
    /// Add one value (non-finite values are the caller's to refuse; see [`Arm::push`]).
    pub fn push(&mut self, x: f64) {
        self.n += 1;
        let delta = x - self.mean;
        self.mean += delta / self.n as f64;
        self.m2 += delta * (x - self.mean);
        self.binary &= x == 0.0 || x == 1.0;
    }

    /// Every value was 0 or 1: the arm is a proportion.
    pub fn is_proportion(&self) -> bool {
        self.binary && self.n > 0
    }

    /// The per-unit variance used by the test.
    pub fn variance(&self) -> f64 {
        if self.n == 0 {
            return 0.0;
        }
        if self.is_proportion() {
            // One success and one failure added: never zero, close to p(1-p) for large n.
            let p = (self.mean * self.n as f64 + 1.0) / (self.n as f64 + 2.0);
            p * (1.0 - p)
        } else if self.n < 2 {
            0.0
        } else {
            self.m2 / (self.n - 1) as f64
        }
    }
}

/// A confidence interval for treatment - control, valid at every look.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Interval {
    /// Treatment mean - control mean.
    pub estimate: f64,
    pub low: f64,
    pub high: f64,
}

/// The always-valid (1 - alpha) confidence sequence for treatment - control at the current
/// sample sizes, or `None` while either arm has fewer than [`MIN_ARM_SAMPLES`].
pub fn difference(control: &Arm, treatment: &Arm, alpha: f64) -> Option<Interval> {
    if control.n < MIN_ARM_SAMPLES || treatment.n < MIN_ARM_SAMPLES {
        return None;
    }
    let estimate = treatment.mean - control.mean;
    let (var_c, var_t) = (control.variance(), treatment.variance());
    let v = var_c / control.n as f64 + var_t / treatment.n as f64;
    if v <= 0.0 {
        // Both arms constant: the difference is known exactly.
        return Some(Interval {
            estimate,
            low: estimate,
            high: estimate,
        });
    }
    let tau2 = MIXTURE_EFFECT_SD * MIXTURE_EFFECT_SD * (var_c + var_t) / 2.0;
    let half = half_width(v, tau2, alpha);
    Some(Interval {
        estimate,
        low: estimate - half,
        high: estimate + half,
    })
}

/// The normal-mixture boundary (module doc) for estimator variance `v` and mixture
/// variance `tau2`.
fn half_width(v: f64, tau2: f64, alpha: f64) -> f64 {
    let w2 = v * (v + tau2) / tau2 * (2.0 * (1.0 / alpha).ln() + ((v + tau2) / v).ln());
    w2.sqrt()
}

/// Which way is better for a metric.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Better {
    Higher,
    Lower,
}

/// What a guardrail's interval says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum GuardrailVerdict {
    /// Too few samples for an interval yet.
    Insufficient,
    /// No regression beyond the tolerance shown.
    Holding,
    /// The whole interval is worse than control by more than the tolerance.
    Breached,
}

/// A guardrail: breached when the interval lies entirely on the worse side of
/// `tolerance` (relative to control's mean: 0.1 tolerates a 10% regression).
pub fn guardrail(
    control: &Arm,
    treatment: &Arm,
    better: Better,
    tolerance: f64,
    alpha: f64,
) -> (GuardrailVerdict, Option<Interval>) {
    let Some(iv) = difference(control, treatment, alpha) else {
        return (GuardrailVerdict::Insufficient, None);
    };
    let margin = tolerance.max(0.0) * control.mean.abs();
    let breached = match better {
        Better::Lower => iv.low > margin,
        Better::Higher => iv.high < -margin,
    };
    let verdict = if breached {
        GuardrailVerdict::Breached
    } else {
        GuardrailVerdict::Holding
    };
    (verdict, Some(iv))
}

/// What the primary metric's interval says.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum PrimaryVerdict {
    Insufficient,
    Inconclusive,
    Improved,
    Regressed,
}

/// The primary metric: improved or regressed when the interval excludes zero.
pub fn primary(
    control: &Arm,
    treatment: &Arm,
    better: Better,
    alpha: f64,
) -> (PrimaryVerdict, Option<Interval>) {
    let Some(iv) = difference(control, treatment, alpha) else {
        return (PrimaryVerdict::Insufficient, None);
    };
    let (good, bad) = match better {
        Better::Higher => (iv.low > 0.0, iv.high < 0.0),
        Better::Lower => (iv.high < 0.0, iv.low > 0.0),
    };
    let verdict = if good {
        PrimaryVerdict::Improved
    } else if bad {
        PrimaryVerdict::Regressed
    } else {
        PrimaryVerdict::Inconclusive
    };
    (verdict, Some(iv))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn arm(values: impl IntoIterator<Item = f64>) -> Arm {
        let mut a = Arm::default();
        for v in values {
            a.push(v);
        }
        a
    }

    #[test]
    fn welford_matches_the_two_pass_variance() {
        let xs: Vec<f64> = (0..100)
            .map(|i| (i as f64 * 0.37).sin() * 10.0 + 3.0)
            .collect();
        let a = arm(xs.iter().copied());
        let mean = xs.iter().sum::<f64>() / 100.0;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / 99.0;
        assert!((a.mean - mean).abs() < 1e-12);
        assert!((a.variance() - var).abs() < 1e-9);
        assert!(!a.is_proportion());
    }

    #[test]
    fn proportions_never_have_zero_variance() {
        let a = arm(std::iter::repeat_n(0.0, 50));
        assert!(a.is_proportion());
        assert!(a.variance() > 0.0);
    }

    #[test]
    fn no_interval_below_the_floor() {
        let a = arm(std::iter::repeat_n(1.0, MIN_ARM_SAMPLES as usize - 1));
        let b = arm(std::iter::repeat_n(0.0, 100));
        assert_eq!(difference(&b, &a, 0.05), None);
    }

    #[test]
    fn the_interval_narrows_with_samples_and_alpha() {
        let make = |n: usize, p: f64| {
            arm((0..n).map(|i| if (i as f64) < p * n as f64 { 1.0 } else { 0.0 }))
        };
        let small = difference(&make(100, 0.1), &make(100, 0.3), 0.05).unwrap();
        let large = difference(&make(10_000, 0.1), &make(10_000, 0.3), 0.05).unwrap();
        let strict = difference(&make(10_000, 0.1), &make(10_000, 0.3), 0.001).unwrap();
        assert!((large.estimate - 0.2).abs() < 1e-9);
        assert!(large.high - large.low < small.high - small.low);
        assert!(strict.high - strict.low > large.high - large.low);
    }

    #[test]
    fn a_guardrail_tolerates_its_threshold() {
        // Control 1000 ms, treatment 1050 ms: a 5% regression, clearly measured.
        let c = arm((0..20_000).map(|i| 1000.0 + if i % 2 == 0 { 50.0 } else { -50.0 }));
        let t = arm((0..20_000).map(|i| 1050.0 + if i % 2 == 0 { 50.0 } else { -50.0 }));
        let (tolerated, _) = guardrail(&c, &t, Better::Lower, 0.10, 0.05);
        assert_eq!(tolerated, GuardrailVerdict::Holding);
        let (breached, _) = guardrail(&c, &t, Better::Lower, 0.0, 0.05);
        assert_eq!(breached, GuardrailVerdict::Breached);
        // The same numbers are an improvement if higher is better.
        let (p, _) = primary(&c, &t, Better::Higher, 0.05);
        assert_eq!(p, PrimaryVerdict::Improved);
        let (p, _) = primary(&c, &t, Better::Lower, 0.05);
        assert_eq!(p, PrimaryVerdict::Regressed);
    }
}
