//! A periodic tick that wakes the daemon once a period, at the same instants as every other.
//!
//! tokio's timer wheel wakes a parked runtime at the start of the wheel slot a deadline falls
//! in, then again at the deadline: a one-second sleep wakes the daemon twice, a five-second
//! one up to three times (slots of 1 ms, 64 ms, 4 s...). Each wake is a context switch, about
//! 16 µs of CPU on the project's test machine (2026-12-07), and the daemon's periodic tasks
//! (the core's second, the IMDS poll, the EFA poll, the funnel) each woke it on their own. A
//! [`Ticker`] is a `timerfd` (`CLOCK_MONOTONIC`) that expires once a period, on whole
//! multiples of the period since the clock's zero, so tickers whose periods are whole
//! seconds expire together and one wake serves them all. Where no timerfd can be had (a
//! sandbox without the call), it is tokio's interval, said once in the log.

use std::os::fd::OwnedFd;
use std::time::Duration;

use rustix::time::{
    timerfd_create, timerfd_settime, Itimerspec, TimerfdClockId, TimerfdFlags, TimerfdTimerFlags,
    Timespec,
};
use tokio::io::unix::AsyncFd;

/// A tick every period; the first completes at once, as `tokio::time::interval`'s does. The
/// timer expires every period whether its tick is awaited or not: for loops that wait on
/// every tick (a tick awaited only sometimes, as the core's save, is tokio's interval).
#[derive(Debug)]
pub struct Ticker {
    kind: Kind,
    /// The first tick is still to come (it completes at once).
    first: bool,
}

#[derive(Debug)]
enum Kind {
    /// The timerfd, armed for every whole multiple of the period.
    Timer(AsyncFd<OwnedFd>, Duration),
    /// tokio's interval (no timerfd), ticks that were missed delayed.
    Interval(tokio::time::Interval),
}

impl Ticker {
    /// A tick every `period` (at least a millisecond). Needs the runtime's I/O driver.
    pub fn new(period: Duration) -> Self {
        let period = period.max(Duration::from_millis(1));
        let kind = match aligned_timer(period) {
            Ok(fd) => Kind::Timer(fd, period),
            Err(e) => {
                static SAID: std::sync::Once = std::sync::Once::new();
                SAID.call_once(|| {
                    tracing::info!(error = %e, "No timerfd; periodic tasks use tokio's timer, which wakes the daemon more often.");
                });
                interval(period)
            }
        };
        Self { kind, first: true }
    }

    /// The next tick: at once the first time, then at the period's next multiple.
    pub async fn tick(&mut self) {
        if std::mem::take(&mut self.first) {
            return;
        }
        match &mut self.kind {
            Kind::Interval(interval) => {
                interval.tick().await;
            }
            Kind::Timer(fd, period) => {
                let period = *period;
                loop {
                    let Ok(mut ready) = fd.readable().await else {
                        // The driver is gone (the runtime is stopping): no busy loop.
                        tokio::time::sleep(period).await;
                        return;
                    };
                    // The number of expirations since the last read: missed ones are one tick.
                    let mut expirations = [0u8; 8];
                    match rustix::io::read(fd.get_ref(), &mut expirations) {
                        // The read took every expiration: not readable until the next one
                        // (the next tick then waits, with no read that finds nothing).
                        Ok(_) => {
                            ready.clear_ready();
                            return;
                        }
                        Err(rustix::io::Errno::AGAIN) => ready.clear_ready(),
                        Err(_) => {
                            self.kind = interval(period);
                            return;
                        }
                    }
                }
            }
        }
    }
}

/// tokio's interval, its first (immediate) tick taken: [`Ticker`] gives that one itself.
fn interval(period: Duration) -> Kind {
    let mut interval = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
    interval.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    Kind::Interval(interval)
}

/// A non-blocking timerfd expiring at every whole multiple of `period` of the monotonic
/// clock, the first one still to come.
fn aligned_timer(period: Duration) -> std::io::Result<AsyncFd<OwnedFd>> {
    let fd = timerfd_create(
        TimerfdClockId::Monotonic,
        TimerfdFlags::NONBLOCK | TimerfdFlags::CLOEXEC,
    )?;
    let now = rustix::time::clock_gettime(rustix::time::ClockId::Monotonic);
    let now = Duration::new(
        u64::try_from(now.tv_sec).unwrap_or(0),
        u32::try_from(now.tv_nsec).unwrap_or(0),
    );
    let first = next_multiple(now, period);
    timerfd_settime(
        &fd,
        TimerfdTimerFlags::ABSTIME,
        &Itimerspec {
            it_interval: timespec(period),
            it_value: timespec(first),
        },
    )?;
    register(fd)
}

/// `fd` on the runtime's I/O driver.
#[allow(unsafe_code)]
fn register(fd: OwnedFd) -> std::io::Result<AsyncFd<OwnedFd>> {
    // SAFETY: the `OwnedFd` is open, owned by the `AsyncFd` for its whole life, and always
    // gives the same descriptor.
    unsafe { AsyncFd::register(fd) }.map_err(|e| e.into_parts().1)
}

/// The first whole multiple of `period` after `now`.
fn next_multiple(now: Duration, period: Duration) -> Duration {
    let period_ns = period.as_nanos().max(1);
    let next = (now.as_nanos() / period_ns + 1) * period_ns;
    let secs = u64::try_from(next / 1_000_000_000).unwrap_or(u64::MAX);
    // Below a second by construction.
    let nanos = u32::try_from(next % 1_000_000_000).unwrap_or(0);
    Duration::new(secs, nanos)
}

fn timespec(d: Duration) -> Timespec {
    Timespec {
        tv_sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX),
        tv_nsec: i64::from(d.subsec_nanos()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ticks_fall_on_whole_multiples_of_the_period() {
        let s = Duration::from_secs;
        assert_eq!(next_multiple(s(0), s(1)), s(1));
        assert_eq!(next_multiple(Duration::from_millis(12_345), s(5)), s(15));
        assert_eq!(next_multiple(s(30), s(30)), s(60));
        assert_eq!(
            next_multiple(Duration::from_millis(1_001), Duration::from_millis(250)),
            Duration::from_millis(1_250)
        );
    }

    #[tokio::test]
    async fn the_first_tick_is_at_once_then_one_a_period() {
        let period = Duration::from_millis(50);
        let start = std::time::Instant::now();
        let mut ticker = Ticker::new(period);
        assert!(matches!(ticker.kind, Kind::Timer(..)), "{ticker:?}");
        // Ready on its first poll (a zero timeout polls the tick before its deadline).
        assert!(tokio::time::timeout(Duration::ZERO, ticker.tick())
            .await
            .is_ok());
        for _ in 0..3 {
            ticker.tick().await;
        }
        // Each later tick waits for an expiration after the one before, the first after
        // the ticker was made: at least two periods since.
        let elapsed = start.elapsed();
        assert!(elapsed >= 2 * period, "{elapsed:?}");
    }
}
