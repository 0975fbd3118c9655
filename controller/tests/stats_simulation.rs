//! The statistics, verified by simulation: A/A experiments examined at every one of 1,000
//! ticks must show a false guardrail breach in at most alpha of 10,000 runs, for 0/1
//! metrics and for means; and a 10% regression must be found (the power, with the tick at
//! which it is found, is printed for BENCHMARKS.md: `cargo test -p halo-controller --test
//! stats_simulation -- --nocapture`).
//!
//! Running sums make each look O(1); a seeded xoshiro256** makes every run repeatable.

use halo_controller::stats::{Arm, Better, GuardrailVerdict, guardrail};

/// xoshiro256** (Blackman and Vigna), seeded through splitmix64.
struct Rng([u64; 4]);

impl Rng {
    fn new(seed: u64) -> Rng {
        let mut z = seed;
        let mut next = || {
            z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
            let mut x = z;
            x = (x ^ (x >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
            x = (x ^ (x >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
            x ^ (x >> 31)
        };
        Rng([next(), next(), next(), next()])
    }
    fn u64(&mut self) -> u64 {
        let s = &mut self.0;
        let result = s[1].wrapping_mul(5).rotate_left(7).wrapping_mul(9);
        let t = s[1] << 17;
        s[2] ^= s[0];
        s[3] ^= s[1];
        s[1] ^= s[2];
        s[0] ^= s[3];
        s[2] ^= t;
        s[3] = s[3].rotate_left(45);
        result
    }
    /// Uniform in [0, 1).
    fn f64(&mut self) -> f64 {
        (self.u64() >> 11) as f64 * (1.0 / (1u64 << 53) as f64)
    }
    fn bernoulli(&mut self, p: f64) -> f64 {
        if self.f64() < p { 1.0 } else { 0.0 }
    }
    /// Standard normal (Box-Muller; the second value is discarded for simplicity).
    fn normal(&mut self) -> f64 {
        let u1 = 1.0 - self.f64();
        let u2 = self.f64();
        (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos()
    }
}

const TICKS: usize = 1_000;
const RUNS: usize = 10_000;
const ALPHA: f64 = 0.05;

/// Runs with `per_tick` new units per arm each tick; returns, per run, the first tick at
/// which the guardrail was breached (None: never).
fn simulate(
    runs: usize,
    per_tick: usize,
    seed: u64,
    tolerance: f64,
    mut draw: impl FnMut(&mut Rng, bool) -> f64,
) -> Vec<Option<usize>> {
    let mut rng = Rng::new(seed);
    (0..runs)
        .map(|_| {
            let (mut c, mut t) = (Arm::default(), Arm::default());
            for tick in 0..TICKS {
                for _ in 0..per_tick {
                    c.push(draw(&mut rng, false));
                    t.push(draw(&mut rng, true));
                }
                let (v, _) = guardrail(&c, &t, Better::Lower, tolerance, ALPHA);
                if v == GuardrailVerdict::Breached {
                    return Some(tick + 1);
                }
            }
            None
        })
        .collect()
}

fn rate(found: &[Option<usize>]) -> f64 {
    found.iter().filter(|f| f.is_some()).count() as f64 / found.len() as f64
}

fn median_tick(found: &[Option<usize>]) -> Option<usize> {
    let mut ticks: Vec<usize> = found.iter().flatten().copied().collect();
    ticks.sort_unstable();
    ticks.get(ticks.len() / 2).copied()
}

#[test]
fn aa_error_rates_hold_alpha_at_every_look() {
    // A 5% error rate in both arms, 5 new units per arm per tick (5,000 per arm at the end).
    let found = simulate(RUNS, 5, 1, 0.0, |rng, _| rng.bernoulli(0.05));
    let r = rate(&found);
    println!("A/A proportions p=0.05: false breaches {r:.4} of {RUNS} runs (alpha {ALPHA})");
    assert!(r <= ALPHA, "false breach rate {r} > alpha {ALPHA}");
}

#[test]
fn aa_latencies_hold_alpha_at_every_look() {
    // Means: a latency of 1000 ms with sd 500 ms in both arms.
    let found = simulate(RUNS, 5, 2, 0.0, |rng, _| 1000.0 + 500.0 * rng.normal());
    let r = rate(&found);
    println!("A/A means: false breaches {r:.4} of {RUNS} runs (alpha {ALPHA})");
    assert!(r <= ALPHA, "false breach rate {r} > alpha {ALPHA}");
}

#[test]
fn a_ten_percent_regression_is_found() {
    // Power at realistic rates: per 5-minute tick, 5 and 20 new units per arm.
    for per_tick in [5, 20] {
        let runs = 1_000;
        let lat = simulate(runs, per_tick, 3, 0.0, |rng, treated| {
            (if treated { 1100.0 } else { 1000.0 }) + 500.0 * rng.normal()
        });
        let err = simulate(runs, per_tick, 4, 0.0, |rng, treated| {
            rng.bernoulli(if treated { 0.055 } else { 0.05 })
        });
        println!(
            "10% regression, {per_tick} units/arm/tick over {TICKS} ticks: latency (cv 0.5) power {:.3}, median tick {:?}; error rate 5% -> 5.5% power {:.3}, median tick {:?}",
            rate(&lat),
            median_tick(&lat),
            rate(&err),
            median_tick(&err)
        );
        if per_tick == 20 {
            assert!(rate(&lat) > 0.9, "latency power {}", rate(&lat));
        }
    }
}
