//! The flight recorder: what a rank is doing and its last operations, written by the call
//! in progress without a lock and read by the watchdog, diagnosis and trace threads.
//!
//! Each of the ring's entries is a seqlock: the one writer (calls on a communicator hold its
//! state lock, so there is one at a time) makes the entry's version odd, writes the fields,
//! and makes it even again; a reader retries until it reads the same even version before and
//! after the fields. A call therefore costs a few plain stores, where a mutex cost two atomic
//! read-modify-writes at each end of every call.

use super::Progress;
use super::health::FlightRecord;
use crate::error::Error;
use crate::wire::{HEADER_BYTES, Header};
use std::collections::VecDeque;
use std::sync::Mutex;
use std::sync::atomic::{AtomicU64, Ordering, fence};
use std::time::{Instant, SystemTime, UNIX_EPOCH};

/// Operations the flight recorder keeps per communicator.
const FLIGHT_RECORDS: usize = 256;
/// Set in an entry's `number` for a call on device buffers: enqueued on a stream, it ends
/// when the GPU reaches its end (stamped by the stream-program monitor), and it moves neither
/// `started` nor `finished`, which follow the host calls.
const DEVICE: u64 = 1 << 63;

/// Microseconds since the Unix epoch.
pub(super) fn now_us() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() as u64)
}

/// The flight recorder's clock. Where the CPU's time-stamp counter is invariant (x86-64 CPUs
/// that say so in CPUID), a call reads the counter (11 ns on the 2-core EPYC VM
/// against 27 ns for the wall clock) and a reading becomes microseconds since the epoch only
/// when a record is read, at the counter's rate between the recorder's start and then.
/// Elsewhere a stamp is the wall clock itself.
#[derive(Clone, Copy)]
struct Clock {
    /// (counter, wall-clock µs) when the recorder started; `None`: stamps are wall clock.
    origin: Option<(u64, u64)>,
    /// The monotonic clock when the recorder started, against which the counter's rate is
    /// measured for [`Clock::seconds_per_tick`].
    since: Instant,
}

impl Default for Clock {
    fn default() -> Self {
        Self {
            origin: invariant_tsc().then(|| (tsc(), now_us())),
            since: Instant::now(),
        }
    }
}

impl Clock {
    fn stamp(&self) -> u64 {
        match self.origin {
            Some(_) => tsc(),
            None => now_us(),
        }
    }

    /// Seconds per tick of [`Clock::stamp`]: a microsecond for the wall clock; for the
    /// counter, its rate against the monotonic clock since the recorder started (two clock
    /// reads; the longer the recorder has run, the closer), or `None` until it has ticked.
    fn seconds_per_tick(&self) -> Option<f64> {
        let Some((t0, _)) = self.origin else {
            return Some(1e-6);
        };
        let elapsed = self.since.elapsed().as_secs_f64();
        let ticks = tsc().saturating_sub(t0);
        (ticks > 0 && elapsed > 0.0).then(|| elapsed / ticks as f64)
    }

    /// Turns stamps into microseconds since the epoch, at the counter's rate measured once,
    /// now, for all the stamps it is given.
    fn epoch_micros(&self) -> impl Fn(u64) -> u64 {
        let rate = self.origin.map(|(t0, w0)| {
            let (t1, w1) = (tsc(), now_us());
            let ticks_per_us = (t1 > t0 && w1 > w0).then(|| (t1 - t0) as f64 / (w1 - w0) as f64);
            (t0, w0, ticks_per_us)
        });
        move |stamp| match rate {
            None => stamp,
            Some((_, w0, None)) => w0,
            Some((t0, w0, Some(r))) => w0 + (stamp.saturating_sub(t0) as f64 / r) as u64,
        }
    }
}

/// Whether the time-stamp counter ticks at one rate on every core, in every power state: the
/// CPU says so in CPUID leaf 0x80000007, EDX bit 8 (what Linux shows as `nonstop_tsc`). Asked
/// of the CPU, not of /proc/cpuinfo, which takes milliseconds to read on a large host.
fn invariant_tsc() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        use core::arch::x86_64::__cpuid;
        const POWER_LEAF: u32 = 0x8000_0007;
        // The leaf is asked for only when the CPU reports it.
        let max_extended = __cpuid(0x8000_0000).eax;
        max_extended >= POWER_LEAF && __cpuid(POWER_LEAF).edx & (1 << 8) != 0
    }
    #[cfg(not(target_arch = "x86_64"))]
    false
}

fn tsc() -> u64 {
    #[cfg(target_arch = "x86_64")]
    // SAFETY: rdtsc has no preconditions on x86-64.
    return unsafe { core::arch::x86_64::_rdtsc() };
    #[cfg(not(target_arch = "x86_64"))]
    0
}

const WORDS: usize = HEADER_BYTES / 8;

/// One operation in the ring: one cache line, so that a call writes one line at its start
/// and the same line at its end. (Its sequence number is the header's.)
#[derive(Default)]
#[repr(C, align(64))]
struct Entry {
    /// Odd while the writer is changing the entry.
    version: AtomicU64,
    /// The operation's number on this communicator plus one (0: never written).
    number: AtomicU64,
    /// [`Clock`] stamps; `end` is 0 while the operation runs.
    start: AtomicU64,
    end: AtomicU64,
    /// The operation's header, encoded.
    header: [AtomicU64; WORDS],
}

const _: () = assert!(std::mem::size_of::<Entry>() == 64);

/// An entry as read.
#[derive(Clone, Copy)]
struct Snapshot {
    number: u64,
    start: u64,
    end: u64,
    header: [u64; WORDS],
}

impl Entry {
    /// The one writer changes the entry.
    fn write(&self, f: impl FnOnce(&Self)) {
        let v = self.version.load(Ordering::Relaxed);
        self.version.store(v.wrapping_add(1), Ordering::Relaxed);
        fence(Ordering::Release);
        f(self);
        self.version.store(v.wrapping_add(2), Ordering::Release);
    }

    /// A consistent copy, retried while the writer is in the middle of a change.
    fn read(&self) -> Snapshot {
        loop {
            let before = self.version.load(Ordering::Acquire);
            if before.is_multiple_of(2) {
                let s = Snapshot {
                    number: self.number.load(Ordering::Relaxed),
                    start: self.start.load(Ordering::Relaxed),
                    end: self.end.load(Ordering::Relaxed),
                    header: std::array::from_fn(|i| self.header[i].load(Ordering::Relaxed)),
                };
                fence(Ordering::Acquire);
                if self.version.load(Ordering::Relaxed) == before {
                    return s;
                }
            }
            std::hint::spin_loop();
        }
    }
}

impl Snapshot {
    fn header(&self) -> Option<Header> {
        let mut b = [0u8; HEADER_BYTES];
        for (chunk, w) in b.chunks_exact_mut(8).zip(self.header) {
            chunk.copy_from_slice(&w.to_le_bytes());
        }
        Header::decode(&b)
    }
}

/// What a rank is doing and its last [`FLIGHT_RECORDS`] operations.
pub(super) struct Recorder {
    clock: Clock,
    started: AtomicU64,
    finished: AtomicU64,
    /// Operations recorded so far.
    recorded: AtomicU64,
    entries: Box<[Entry]>,
    /// The errors operations ended with, by operation number plus one: rare, so they keep
    /// their strings under a lock of their own.
    errors: Mutex<VecDeque<(u64, String)>>,
}

impl Default for Recorder {
    fn default() -> Self {
        Self {
            clock: Clock::default(),
            started: AtomicU64::new(0),
            finished: AtomicU64::new(0),
            recorded: AtomicU64::new(0),
            entries: (0..FLIGHT_RECORDS).map(|_| Entry::default()).collect(),
            errors: Mutex::new(VecDeque::new()),
        }
    }
}

impl Recorder {
    fn entry(&self, number: u64) -> &Entry {
        &self.entries[(number % FLIGHT_RECORDS as u64) as usize]
    }

    /// An operation starts: `seq` is its [`Header::call_seq`], `encoded` its header. One
    /// writer at a time (the caller holds the state lock).
    pub fn start(&self, seq: u64, encoded: &[u8; HEADER_BYTES]) {
        self.enter(0, encoded);
        if seq > 0 {
            self.started.store(seq, Ordering::Release);
        }
    }

    /// A call on device buffers was enqueued: recorded like [`Recorder::start`] (same single
    /// writer rule) but marked as on the device; returns its number for
    /// [`Recorder::finish_device`].
    pub fn start_device(&self, encoded: &[u8; HEADER_BYTES]) -> u64 {
        self.enter(DEVICE, encoded)
    }

    /// Writes the next entry (its number carrying `mark`), started now; returns its number.
    fn enter(&self, mark: u64, encoded: &[u8; HEADER_BYTES]) -> u64 {
        let n = self.recorded.load(Ordering::Relaxed);
        let start = self.clock.stamp();
        self.entry(n).write(|e| {
            e.number.store((n + 1) | mark, Ordering::Relaxed);
            e.start.store(start, Ordering::Relaxed);
            e.end.store(0, Ordering::Relaxed);
            for (w, chunk) in e.header.iter().zip(encoded.chunks_exact(8)) {
                let word = u64::from_le_bytes(chunk.try_into().unwrap_or([0; 8]));
                w.store(word, Ordering::Relaxed);
            }
        });
        self.recorded.store(n + 1, Ordering::Release);
        n + 1
    }

    /// The device call numbered `number` ended (its stream passed its end), from the monitor
    /// thread. Nothing if its entry has been reused since (256 calls later).
    pub fn finish_device(&self, number: u64, error: Option<&Error>) {
        let Some(i) = number.checked_sub(1) else {
            return;
        };
        let entry = self.entry(i);
        if entry.read().number != number | DEVICE
            || self.recorded.load(Ordering::Acquire) >= i + FLIGHT_RECORDS as u64
        {
            return;
        }
        let end = self.clock.stamp().max(1);
        entry.write(|e| e.end.store(end, Ordering::Relaxed));
        if let Some(error) = error
            && let Ok(mut errors) = self.errors.lock()
        {
            if errors.len() == FLIGHT_RECORDS {
                errors.pop_front();
            }
            errors.push_back((number, error.to_string()));
        }
    }

    /// The operation [`Recorder::start`] announced ended; returns how long it ran, in ticks
    /// of the recorder's clock ([`Recorder::seconds_per_tick`]): the straggler accounting
    /// times calls with these stamps instead of reading a clock of its own.
    pub fn finish(&self, seq: u64, error: Option<&Error>) -> u64 {
        let n = self.recorded.load(Ordering::Relaxed);
        if n == 0 {
            return 0;
        }
        let end = self.clock.stamp().max(1);
        let entry = self.entry(n - 1);
        // The one writer reads back the start it wrote.
        let ran = end.saturating_sub(entry.start.load(Ordering::Relaxed));
        entry.write(|e| e.end.store(end, Ordering::Relaxed));
        match error {
            Some(error) => {
                if let Ok(mut errors) = self.errors.lock() {
                    if errors.len() == FLIGHT_RECORDS {
                        errors.pop_front();
                    }
                    errors.push_back((n, error.to_string()));
                }
            }
            None if seq > 0 => self.finished.store(seq, Ordering::Release),
            None => {}
        }
        ran
    }

    /// Seconds per tick of the lengths [`Recorder::finish`] returns (`None` until the clock
    /// has ticked since the recorder started). Reads two clocks: callers keep the figure.
    pub fn seconds_per_tick(&self) -> Option<f64> {
        self.clock.seconds_per_tick()
    }

    /// What the rank is doing now.
    pub fn progress(&self) -> Progress {
        let n = self.recorded.load(Ordering::Acquire);
        let current = (n > 0)
            .then(|| self.entry(n - 1).read())
            .filter(|s| s.number == n && s.end == 0)
            .and_then(|s| s.header())
            .map(|h| h.describe());
        Progress {
            started: self.started.load(Ordering::Acquire),
            finished: self.finished.load(Ordering::Acquire),
            current,
        }
    }

    /// The host call in progress, if any (not a device call's entry), and how long it has
    /// run.
    pub fn current_call(&self) -> Option<(Header, std::time::Duration)> {
        let n = self.recorded.load(Ordering::Acquire);
        let s = (n > 0).then(|| self.entry(n - 1).read())?;
        if s.number != n || s.end != 0 {
            return None;
        }
        let header = s.header()?;
        let micros = self.clock.epoch_micros();
        let ran = micros(self.clock.stamp()).saturating_sub(micros(s.start));
        Some((header, std::time::Duration::from_micros(ran)))
    }

    /// The records, oldest first (an entry overwritten while they are read is left out).
    pub fn records(&self) -> Vec<FlightRecord> {
        let n = self.recorded.load(Ordering::Acquire);
        let errors: Vec<(u64, String)> = self
            .errors
            .lock()
            .map(|e| e.iter().cloned().collect())
            .unwrap_or_default();
        let micros = self.clock.epoch_micros();
        (n.saturating_sub(FLIGHT_RECORDS as u64)..n)
            .filter_map(|i| {
                let s = self.entry(i).read();
                let device = s.number & DEVICE != 0;
                let op = s.header().filter(|_| s.number & !DEVICE == i + 1)?;
                Some(FlightRecord {
                    seq: if device { 0 } else { op.call_seq() },
                    op: if device {
                        op.describe() + " on device buffers"
                    } else {
                        op.describe()
                    },
                    start_us: micros(s.start),
                    end_us: (s.end != 0).then(|| micros(s.end)),
                    error: errors.iter().find(|e| e.0 == i + 1).map(|e| e.1.clone()),
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::dtype::DataType;
    use strata_algorithms::{Algorithm, Collective};

    fn call(seq: u64) -> Header {
        Header {
            collective: Collective::AllReduce,
            seq,
            dtype: DataType::Float32,
            count: 8,
            op: 0,
            param: 0,
            algorithm: Algorithm::Ring,
        }
    }

    fn start(r: &Recorder, seq: u64) {
        let h = call(seq);
        r.start(h.call_seq(), &h.encode());
    }

    /// What `finish` returns is the call's length on the recorder's clock: at the rate
    /// `seconds_per_tick` gives, at least the time slept inside the call, and the same
    /// length as the record's own start and end.
    #[test]
    fn finish_returns_the_calls_length_in_ticks_of_the_recorders_clock() {
        let r = Recorder::default();
        start(&r, 1);
        std::thread::sleep(std::time::Duration::from_millis(20));
        let ran = r.finish(1, None);
        let per_tick = r.seconds_per_tick().expect("the clock has ticked");
        let seconds = ran as f64 * per_tick;
        assert!(seconds >= 0.019, "{seconds} s for a call that slept 20 ms");
        assert!(seconds < 60.0, "{seconds} s");
        let rec = &r.records()[0];
        let end = rec.end_us.expect("ended");
        let by_record = (end - rec.start_us) as f64 * 1e-6;
        assert!(
            (by_record - seconds).abs() <= 0.001 + 0.05 * seconds,
            "{by_record} s by the record against {seconds} s"
        );
        // Nothing started: nothing ran.
        assert_eq!(Recorder::default().finish(0, None), 0);
    }

    #[test]
    fn device_calls_end_out_of_order_and_leave_the_host_progress_alone() {
        let r = Recorder::default();
        start(&r, 1);
        r.finish(1, None);
        let a = r.start_device(&call(1).encode());
        let b = r.start_device(&call(2).encode());
        // A host call while both are on their streams.
        start(&r, 2);
        let p = r.progress();
        assert_eq!((p.started, p.finished), (2, 1));
        assert!(p.current.is_some_and(|c| c.starts_with("all_reduce #2")));
        r.finish(2, None);
        r.finish_device(b, Some(&Error::Aborted(None)));
        let recs = r.records();
        assert_eq!(recs.len(), 4);
        assert!(recs[1].op.ends_with(" on device buffers") && recs[1].end_us.is_none());
        assert!(recs[2].op.ends_with(" on device buffers") && recs[2].error.is_some());
        assert!(!recs[3].op.contains("device") && recs[3].end_us.is_some());
        r.finish_device(a, None);
        assert!(r.records()[1].end_us.is_some());
        assert_eq!(
            r.progress().finished,
            2,
            "device calls move no host counter"
        );
        // An entry reused since is left alone.
        for s in 3..(3 + FLIGHT_RECORDS as u64) {
            start(&r, s);
            r.finish(s, None);
        }
        r.finish_device(b, None);
        assert!(r.records().iter().all(|x| !x.op.contains("device")));
    }

    #[test]
    fn records_progress_errors_and_wraps_the_ring() {
        let r = Recorder::default();
        assert_eq!(r.progress(), Progress::default());
        start(&r, 1);
        let p = r.progress();
        assert_eq!((p.started, p.finished), (1, 0));
        assert!(p.current.unwrap().starts_with("all_reduce #1"));
        r.finish(1, None);
        assert_eq!(r.progress().current, None);
        assert_eq!(r.progress().finished, 1);
        start(&r, 2);
        r.finish(2, Some(&Error::Aborted(None)));
        let recs = r.records();
        assert_eq!(recs.len(), 2);
        assert!(recs[0].end_us.is_some_and(|e| e >= recs[0].start_us));
        assert!(recs[0].error.is_none());
        assert!(recs[1].error.is_some(), "{recs:?}");
        assert_eq!(
            r.progress().finished,
            1,
            "a failed call does not count as finished"
        );
        for seq in 3..3 + FLIGHT_RECORDS as u64 + 10 {
            start(&r, seq);
            r.finish(seq, None);
        }
        let recs = r.records();
        assert_eq!(recs.len(), FLIGHT_RECORDS);
        assert_eq!(recs[0].seq, 13);
        assert!(recs.windows(2).all(|w| w[0].seq + 1 == w[1].seq));
        let now = now_us();
        let last = recs.last().unwrap();
        assert!(
            last.start_us <= now && now - last.start_us < 5_000_000,
            "{last:?} at {now}"
        );
    }

    #[test]
    fn a_reader_never_sees_a_torn_entry() {
        let r = std::sync::Arc::new(Recorder::default());
        let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
        let seen = std::sync::Arc::new(AtomicU64::new(0));
        let reader = {
            let (r, stop, seen) = (r.clone(), stop.clone(), seen.clone());
            std::thread::spawn(move || {
                while !stop.load(Ordering::Relaxed) {
                    for rec in r.records() {
                        // The header's sequence number and the entry's agree.
                        assert!(rec.op.contains(&format!("#{} ", rec.seq)), "{rec:?}");
                        seen.fetch_add(1, Ordering::Relaxed);
                    }
                }
                seen.load(Ordering::Relaxed)
            })
        };
        // Write at least 200,000 calls, and on until the reader has read while the writes go
        // on (on a loaded machine it may not run at all during the first 200,000), for at
        // most 30 s.
        let began = std::time::Instant::now();
        let mut seq = 1;
        while seq < 200_000
            || (seen.load(Ordering::Relaxed) == 0
                && began.elapsed() < std::time::Duration::from_secs(30))
        {
            start(&r, seq);
            r.finish(seq, None);
            seq += 1;
        }
        stop.store(true, Ordering::Relaxed);
        assert!(reader.join().unwrap() > 0);
    }
}
