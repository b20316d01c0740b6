//! The network between clients and the server, and the bits every model shares.

use std::time::Duration;

use rand::{Rng, RngExt};

/// Width of a timeline bucket: requests are counted per 100 ms.
pub const BUCKET: Duration = Duration::from_millis(100);
const BUCKET_NS: u64 = 100_000_000;

/// One-way delay of a message: `|Normal(mean, sd)|`, as in the AWS simulator.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Net {
    /// Mean one-way delay.
    pub mean: Duration,
    /// Standard deviation.
    pub sd: Duration,
}

impl Default for Net {
    /// `|Normal(10 ms, 2 ms)|`.
    fn default() -> Self {
        Self {
            mean: Duration::from_millis(10),
            sd: Duration::from_millis(2),
        }
    }
}

impl Net {
    /// One delay in nanoseconds (Box–Muller; the absolute value, like the AWS simulator).
    pub(crate) fn delay_ns<R: Rng + ?Sized>(&self, rng: &mut R) -> u64 {
        let u1: f64 = 1.0 - rng.random::<f64>(); // (0, 1]
        let u2: f64 = rng.random::<f64>();
        let z = (-2.0 * u1.ln()).sqrt() * (std::f64::consts::TAU * u2).cos();
        let ns = self.mean.as_nanos() as f64 + z * self.sd.as_nanos() as f64;
        ns.abs() as u64
    }
}

/// What one seeded run of a model produced.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct RunResult {
    /// Calls that reached the server (`occ`: writes; `capacity`: payment calls).
    pub calls: u64,
    /// Calls that did not succeed (conflicts, 429s, 503s).
    pub wasted: u64,
    /// When the last client finished (succeeded or gave up), from the start.
    pub completion: Duration,
    /// Clients that gave up (attempts spent) instead of succeeding.
    pub failed: u32,
    /// Calls not made because the breaker was open or the fleet was paused (deferrals, R10).
    pub blocked: u64,
    /// Calls per 100 ms bucket, from the start.
    pub timeline: Vec<u32>,
    /// Calls that succeeded per 100 ms bucket, from the start (`capacity` only).
    pub served: Vec<u32>,
}

impl RunResult {
    /// The most calls in one 100 ms bucket.
    pub fn peak(&self) -> u32 {
        self.timeline.iter().copied().max().unwrap_or(0)
    }

    pub(crate) fn count_call(&mut self, t_ns: u64) {
        self.calls += 1;
        if let Some(b) = bucket(&mut self.timeline, t_ns) {
            *b += 1;
        }
    }

    pub(crate) fn count_served(&mut self, t_ns: u64) {
        if let Some(b) = bucket(&mut self.served, t_ns) {
            *b += 1;
        }
    }

    /// Calls that succeeded per second between `from` and `to` (whole 100 ms buckets).
    pub fn served_per_s(&self, from: Duration, to: Duration) -> f64 {
        let (a, b) = (
            (ns(from) / BUCKET_NS) as usize,
            (ns(to) / BUCKET_NS) as usize,
        );
        let n: u32 = self.served.iter().take(b).skip(a).sum();
        f64::from(n) / (to.saturating_sub(from)).as_secs_f64().max(1e-9)
    }
}

/// The 100 ms bucket of `t_ns` in `timeline`, grown to hold it.
fn bucket(timeline: &mut Vec<u32>, t_ns: u64) -> Option<&mut u32> {
    let b = usize::try_from(t_ns / BUCKET_NS).unwrap_or(usize::MAX);
    if b >= timeline.len() {
        // Simulated time is bounded by the models' horizons; guard anyway.
        if b > 10_000_000 {
            return None;
        }
        timeline.resize(b + 1, 0);
    }
    timeline.get_mut(b)
}

/// A message in a model's event queue: `(time ns, sequence, client, kind, payload)`.
/// The sequence number breaks ties in insertion order, so runs are deterministic.
pub(crate) type Event = std::cmp::Reverse<(u64, u64, u32, u8, u64)>;

/// A min-heap of events with a sequence counter.
#[derive(Debug, Default)]
pub(crate) struct Queue {
    heap: std::collections::BinaryHeap<Event>,
    seq: u64,
}

impl Queue {
    pub(crate) fn with_capacity(n: usize) -> Self {
        Self {
            heap: std::collections::BinaryHeap::with_capacity(n),
            seq: 0,
        }
    }

    pub(crate) fn push(&mut self, t: u64, client: u32, kind: u8, payload: u64) {
        self.seq += 1;
        self.heap
            .push(std::cmp::Reverse((t, self.seq, client, kind, payload)));
    }

    pub(crate) fn pop(&mut self) -> Option<(u64, u32, u8, u64)> {
        self.heap
            .pop()
            .map(|std::cmp::Reverse((t, _, c, k, p))| (t, c, k, p))
    }
}

pub(crate) fn ns(d: Duration) -> u64 {
    u64::try_from(d.as_nanos()).unwrap_or(u64::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;
    use rand::SeedableRng;
    use rand::rngs::SmallRng;

    #[test]
    fn network_delay_has_the_right_mean_and_spread() {
        let net = Net::default();
        let mut rng = SmallRng::seed_from_u64(3);
        let xs: Vec<f64> = (0..20_000)
            .map(|_| net.delay_ns(&mut rng) as f64 / 1e6)
            .collect();
        let mean = xs.iter().sum::<f64>() / xs.len() as f64;
        let var = xs.iter().map(|x| (x - mean).powi(2)).sum::<f64>() / xs.len() as f64;
        assert!((mean - 10.0).abs() < 0.1, "{mean}");
        assert!((var.sqrt() - 2.0).abs() < 0.1, "{}", var.sqrt());
    }

    #[test]
    fn timeline_counts_per_bucket() {
        let mut r = RunResult::default();
        for t in [0, 99_999_999, 100_000_000, 350_000_000] {
            r.count_call(t);
        }
        assert_eq!(r.timeline, vec![2, 1, 0, 1]);
        assert_eq!(r.peak(), 2);
        assert_eq!(r.calls, 4);
        r.count_served(150_000_000);
        r.count_served(250_000_000);
        assert_eq!(r.served, vec![0, 1, 1]);
        assert_eq!(
            r.served_per_s(Duration::ZERO, Duration::from_millis(300)),
            2.0 / 0.3
        );
        assert_eq!(
            r.served_per_s(Duration::from_millis(200), Duration::from_secs(1)),
            1.0 / 0.8
        );
    }
}
