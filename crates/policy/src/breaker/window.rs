//! The sliding failure window: the last N calls, or the calls of a time span in buckets.

use super::config::Window;

const BUCKETS: usize = 10;

#[derive(Debug, Clone, Copy, Default)]
pub(super) struct Counts {
    pub(super) calls: u32,
    pub(super) failures: u32,
    pub(super) slow: u32,
}

#[derive(Debug, Clone)]
pub(super) enum WindowState {
    Count {
        ring: Vec<u8>, // bit 0: failure, bit 1: slow, bit 2: present
        next: usize,
        totals: Counts,
    },
    Time {
        bucket_ms: i64,
        buckets: Box<[(i64, Counts); BUCKETS]>,
    },
}

impl WindowState {
    pub(super) fn new(w: Window) -> Self {
        match w {
            Window::Count { size } => WindowState::Count {
                ring: vec![0; size as usize],
                next: 0,
                totals: Counts::default(),
            },
            Window::Time { length } => WindowState::Time {
                bucket_ms: (length.as_millis() as i64 / BUCKETS as i64).max(1),
                buckets: Box::new([(i64::MIN, Counts::default()); BUCKETS]),
            },
        }
    }

    pub(super) fn reset(&mut self) {
        match self {
            WindowState::Count { ring, next, totals } => {
                ring.iter_mut().for_each(|x| *x = 0);
                *next = 0;
                *totals = Counts::default();
            }
            WindowState::Time { buckets, .. } => {
                **buckets = [(i64::MIN, Counts::default()); BUCKETS];
            }
        }
    }

    pub(super) fn add(&mut self, failure: bool, slow: bool, now_ms: i64) {
        match self {
            WindowState::Count { ring, next, totals } => {
                let old = ring[*next];
                if old & 4 != 0 {
                    totals.calls -= 1;
                    totals.failures -= u32::from(old & 1);
                    totals.slow -= u32::from((old >> 1) & 1);
                }
                ring[*next] = 4 | u8::from(failure) | (u8::from(slow) << 1);
                totals.calls += 1;
                totals.failures += u32::from(failure);
                totals.slow += u32::from(slow);
                *next = (*next + 1) % ring.len();
            }
            WindowState::Time { bucket_ms, buckets } => {
                let epoch = now_ms.div_euclid(*bucket_ms);
                let slot = &mut buckets[epoch.rem_euclid(BUCKETS as i64) as usize];
                if slot.0 != epoch {
                    *slot = (epoch, Counts::default());
                }
                slot.1.calls += 1;
                slot.1.failures += u32::from(failure);
                slot.1.slow += u32::from(slow);
            }
        }
    }

    pub(super) fn totals(&self, now_ms: i64) -> Counts {
        match self {
            WindowState::Count { totals, .. } => *totals,
            WindowState::Time { bucket_ms, buckets } => {
                let epoch = now_ms.div_euclid(*bucket_ms);
                let oldest = epoch - (BUCKETS as i64 - 1);
                buckets
                    .iter()
                    .filter(|(e, _)| *e >= oldest && *e <= epoch)
                    .fold(Counts::default(), |a, (_, c)| Counts {
                        calls: a.calls + c.calls,
                        failures: a.failures + c.failures,
                        slow: a.slow + c.slow,
                    })
            }
        }
    }
}
