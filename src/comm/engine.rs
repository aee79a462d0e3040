//! The engine under every call: planning, header exchange, execution, and turning a
//! failure into an error that names the rank at fault.

use super::*;

/// How long a timed-out call spends finding out who holds it up.
const DIAGNOSIS_LIMIT: Duration = Duration::from_secs(5);

impl Communicator {
    pub(super) fn lock_state(&self) -> Result<std::sync::MutexGuard<'_, State>> {
        // A call made on this thread after stream-ordered calls follows them on every rank:
        // it waits until the progress thread has run them (unless it is that thread).
        self.wait_for_stream_calls()?;
        self.inner
            .state
            .lock()
            .map_err(|_| Error::Aborted(Some("an earlier call panicked".into())))
    }

    /// Plans and executes one call.
    ///
    /// # Safety
    /// `input`/`output` must be valid for reads/writes of the given byte counts for the whole
    /// call (they may alias as NCCL's in-place rules allow).
    pub(super) unsafe fn run(
        &self,
        spec: CallSpec,
        input: *const u8,
        input_bytes: usize,
        output: *mut u8,
        output_bytes: usize,
    ) -> Result<()> {
        let inner = &*self.inner;
        if let Some(e) = self.async_error() {
            return Err(e);
        }
        if let ReduceOp::PreMulSum(s) = spec.op
            && spec.collective.reduces()
            && s.dtype != spec.dtype
        {
            return Err(Error::InvalidArgument(format!(
                "premulsum scalar is {} but the buffers are {}",
                s.dtype, spec.dtype
            )));
        }
        let (p, es) = (inner.size, spec.dtype.size());
        let mut guard = self.lock_state()?;
        let st = &mut *guard;
        let forced = self.forced_word(spec.collective);
        // The last call's derivation is taken out of the state for the call and put back
        // after it, rather than shared by reference counting: a repeated call then does no
        // atomic read-modify-write for it, and moves one pointer each way.
        let call = match st.last_call.take() {
            Some(last) if last.spec == spec && last.forced == forced && !last.in_trial => last,
            _ => self.derive_call(st, spec, forced, true)?,
        };
        // A call of a size class whose rivals are being timed ([`trial`]).
        let timed = call
            .in_trial
            .then(|| (trial::key(spec.collective, spec.count * es), Instant::now()));
        st.seq += 1;
        let local = Header {
            seq: st.seq,
            ..call.header
        };
        st.exec.stalls.begin_call();
        let mut encoded = call.encoded;
        encoded[Header::SEQ_BYTES].copy_from_slice(&st.seq.to_le_bytes());
        crate::wire::set_stall_share(&mut encoded, st.exec.stalls.own_share);
        let cached = &*call.cached;
        let small = cached.small.as_ref().filter(|_| {
            !matches!(spec.op, ReduceOp::PreMulSum(_))
                && (1..=SMALL_MAX_BYTES).contains(&input_bytes)
                && output_bytes == input_bytes
        });
        // A small all-reduce over connections already open announces itself to the flight
        // recorder once its first message is out, so that the bookkeeping overlaps the
        // message's way to the partner instead of delaying it. Nothing between here and that
        // send can block; a failure before it announces the call first.
        let connected = st.connected_to(&cached.exchange);
        let announce_late = small.is_some() && connected;
        if !announce_late {
            inner.health.op_started(local.call_seq(), &encoded);
        }
        let result = (|| {
            if !connected {
                self.ensure_connections(st, &cached.exchange, &local)?;
            }
            if let Some(small) = small {
                let (combine, divide_by) = match spec.op {
                    ReduceOp::Avg => (Combine::Sum, Some(p)),
                    op => (reduce::combine_of(op), None),
                };
                st.small_calls += 1;
                let mut run = self.op_run(st, local, spec.dtype, (combine, divide_by));
                let announce = || {
                    if announce_late {
                        inner.health.op_started(local.call_seq(), &encoded);
                    }
                };
                let buffers = (input, output, input_bytes);
                // SAFETY: the caller guarantees both buffers for their byte counts.
                return unsafe {
                    match small {
                        SmallPath::Doubling(d) => {
                            run.run_small_doubling(d, buffers, &encoded, announce)
                        }
                        SmallPath::OneShot(o) => {
                            run.run_small_one_shot(o, buffers, &encoded, announce)
                        }
                    }
                };
            }
            // Inputs the schedule must not read from the caller's memory.
            let mut input = input;
            let premul = match spec.op {
                ReduceOp::PreMulSum(s) if spec.collective.reduces() => Some(s),
                _ => None,
            };
            let private_copy = spec.collective == Collective::AllToAll
                && input_bytes > 0
                && std::ptr::eq(input, output);
            if premul.is_some() || private_copy {
                grow(&mut st.staging, input_bytes);
                let staged =
                    &mut bytemuck::cast_slice_mut::<u64, u8>(&mut st.staging)[..input_bytes];
                // SAFETY: the caller guarantees input is readable for input_bytes.
                let original = unsafe { std::slice::from_raw_parts(input, input_bytes) };
                match premul {
                    Some(s) => reduce::scale(spec.dtype, staged, original, &s),
                    None => crate::copy::copy(staged, original),
                }
                input = staged.as_ptr();
            }
            let scratch_bytes = cached.sched.scratch_elems * es;
            grow(&mut st.scratch, scratch_bytes);
            let bufs = Buffers {
                input,
                input_bytes,
                output,
                output_bytes,
                scratch: st.scratch.as_mut_ptr() as *mut u8,
                scratch_bytes,
                input_parts: Vec::new(),
                output_parts: Vec::new(),
            };
            let (combine, divide_by) = match spec.op {
                _ if !spec.collective.reduces() => (Combine::Sum, None),
                ReduceOp::Avg => (Combine::Sum, Some(p)),
                op => (reduce::combine_of(op), None),
            };
            let dtype = if spec.collective == Collective::Barrier {
                DataType::Uint8
            } else {
                spec.dtype
            };
            self.op_run(st, local, dtype, (combine, divide_by))
                .with_headers(&cached.exchange, &cached.exchange, &[])
                .run(&cached.sched, &bufs)
        })();
        let (r, ticks) = self.conclude_timed(st, &local, result);
        if r.is_ok() {
            let (took, stalled) = self.note_stalls(st, &local, ticks);
            if let Some(m) = inner.metrics.as_ref().filter(|_| !st.agreeing) {
                m.record(
                    spec.collective,
                    input_bytes.max(output_bytes),
                    took,
                    stalled,
                );
            }
        } else if let Some(m) = &inner.metrics {
            m.fault();
        }
        let agree = match timed {
            Some((k, t0)) if r.is_ok() => st
                .trials
                .get_mut(&k)
                .is_some_and(|t| t.record(t0.elapsed().as_secs_f64()))
                .then_some(k),
            _ => None,
        };
        st.last_call = Some(call);
        drop(guard);
        if let Some(k) = agree {
            r?;
            return self.agree_on_trial(k);
        }
        r
    }

    /// Writes this rank's flight record where `STRATA_TRACE_DIR` says (nothing when unset).
    fn write_trace(&self) {
        let inner = &*self.inner;
        watchdog::dump_trace(
            inner.cfg.trace_dir.as_deref(),
            &inner.comm_id,
            &inner.peers[inner.rank],
            &inner.peers[0],
            &inner.health,
        );
    }

    /// Feeds a finished call's stalls to the straggler view, and says so when a peer becomes,
    /// or stops being, persistently slow. `ticks` is how long the call ran by the flight
    /// recorder's stamps. Returns how long it took (zero for a quiet call when no metrics
    /// are kept, which then reads no clock) and how long it stalled.
    fn note_stalls(&self, st: &mut State, call: &Header, ticks: u64) -> (Duration, Duration) {
        use crate::watchdog::stragglers::{Change, coarse_now, ticks_to_time};
        let log = &mut st.exec.stalls;
        // A quiet call is set aside with the flight recorder's two stamps for its time, and
        // no clock read of its own: the fold below reads the clocks for a batch.
        if st.stragglers.set_aside(ticks, log.stalled, &log.stalls) {
            let took = if self.inner.metrics.is_some() {
                ticks_to_time(ticks, self.seconds_per_tick(st, false))
            } else {
                Duration::ZERO
            };
            return (took, Duration::ZERO);
        }
        // The counter's rate, measured against a baseline that grows with the communicator's
        // age: again at the 1st, 2nd, 4th, 8th ... fold, where it has had time to settle.
        st.folds += 1;
        let per_tick = self.seconds_per_tick(st, st.folds.is_power_of_two());
        st.stragglers.settle(per_tick);
        let log = &mut st.exec.stalls;
        let now = coarse_now();
        let took = ticks_to_time(ticks, per_tick);
        let changes =
            st.stragglers
                .observe((now, took, log.stalled), &log.stalls, &log.peer_shares);
        log.own_share = st.stragglers.own_share_per_mille();
        let stalled = log.stalled;
        if self.inner.metrics.is_some() {
            self.inner.health.set_own_stall_share(log.own_share);
        }
        // What `Communicator::stragglers` reads: fresh at a change, and at most a quarter of a
        // second old while anyone is named.
        let stale = st.stragglers.any_named()
            && now.saturating_sub(st.stragglers_published) >= Duration::from_millis(250);
        if stale || !changes.is_empty() {
            st.stragglers_published = now;
            self.inner.health.set_stragglers(st.stragglers.current());
        }
        if !changes.is_empty() {
            self.write_trace();
        }
        for change in changes {
            let (s, late) = match &change {
                Change::Late(s) => (s, true),
                Change::Recovered(s) => (s, false),
            };
            let who = self
                .inner
                .peers
                .get(s.rank)
                .map(|p| p.describe())
                .unwrap_or_default();
            if late {
                tracing::warn!(
                    rank = self.inner.rank,
                    "rank {} ({who}) is a straggler: this rank stalled on it in {:.0}% of its \
                     last {} calls, {:.0}% of its collective time, a median {:.1} ms each, \
                     while it stalls {:.0}% of its own (up to {})",
                    s.rank,
                    100.0 * s.late_share,
                    s.calls,
                    100.0 * s.stall_share,
                    s.median_late_ms,
                    100.0 * s.own_stall_share,
                    call.describe()
                );
            } else {
                tracing::warn!(
                    rank = self.inner.rank,
                    "rank {} ({who}) is on time again: stalled on in {:.0}% of the last {} \
                     calls, {:.0}% of the time (up to {})",
                    s.rank,
                    100.0 * s.late_share,
                    s.calls,
                    100.0 * s.stall_share,
                    call.describe()
                );
            }
        }
        (took, stalled)
    }

    /// What a call of `spec` is made of besides its sequence number: the algorithm (chosen
    /// under the explicit choice `forced`), the schedule, and the header.
    fn derive_call(
        &self,
        st: &mut State,
        spec: CallSpec,
        forced: u8,
        trial: bool,
    ) -> Result<Box<LastCall>> {
        let inner = &*self.inner;
        let (p, rank, es) = (inner.size, inner.rank, spec.dtype.size());
        let (algorithm, in_trial) =
            self.chosen_algorithm(st, spec.collective, spec.count * es, trial);
        // The slice of a ring all-reduce (0 for anything else); it travels in the header.
        let ring_slice = if spec.collective == Collective::AllReduce
            && algorithm.normalized() == Algorithm::Ring
        {
            self.ring_slice_bytes(spec.count * es) / es
        } else {
            0
        };
        let plan = Plan {
            collective: spec.collective,
            algorithm,
            nranks: p,
            rank,
            count: spec.count,
            root: spec.root,
            chunk_elems: (inner.cfg.chunk_bytes / es).max(1),
        };
        let cached = match st.schedules.get(&plan) {
            Some(c) => c.clone(),
            None => {
                let sched = strata_algorithms::plan_to_run_on(
                    &plan,
                    inner.tuner.hierarchy(),
                    inner.tuner.ordered(),
                    ring_slice,
                )
                .map_err(|e| Error::InvalidArgument(e.to_string()))?;
                inner.schedules_built.fetch_add(1, Ordering::Relaxed);
                let c = Arc::new(CachedPlan::new(&plan, sched, rank, p));
                if st.schedules.len() >= SCHEDULE_CACHE {
                    st.schedules.clear();
                }
                st.schedules.insert(plan, c.clone());
                c
            }
        };
        let header = Header {
            collective: spec.collective,
            seq: 0,
            dtype: spec.dtype,
            count: spec.count as u64,
            op: if spec.collective.reduces() {
                spec.op.code()
            } else {
                0
            },
            param: if spec.collective.rooted() {
                spec.root as u64
            } else {
                ring_slice as u64
            },
            algorithm,
        };
        Ok(Box::new(LastCall {
            spec,
            forced,
            header,
            encoded: header.encode(),
            cached,
            in_trial,
        }))
    }

    /// The algorithm and schedule a call of `spec` would run, derived as for a call but
    /// neither numbered nor entered in the flight recorder: what the device path times at
    /// bind to find where its kernels stop paying.
    pub(super) fn plan_device_call(&self, spec: CallSpec) -> Result<(Algorithm, Arc<CachedPlan>)> {
        let mut st = self.lock_state()?;
        let forced = self.forced_word(spec.collective);
        let call = self.derive_call(&mut st, spec, forced, false)?;
        Ok((call.header.algorithm, call.cached.clone()))
    }

    /// Whether `collective`'s algorithm is set (`STRATA_ALGO`, [`Communicator::set_algorithm`])
    /// rather than chosen per size: the device path then runs that algorithm's schedule and
    /// never its kernels.
    pub(super) fn algorithm_is_set(&self, collective: Collective) -> bool {
        self.forced_word(collective) != 0
    }

    /// The algorithm and schedule a call of `spec` runs, derived as the host path derives
    /// them, for the device path that compiles the same schedule into a stream program.
    /// The algorithm and schedule of a call enqueued on device buffers, which it also enters
    /// in the flight recorder (numbered apart from host calls); returns the entry's number,
    /// for the monitor to stamp its end.
    pub(super) fn derive_device_call(
        &self,
        spec: CallSpec,
    ) -> Result<(Algorithm, Arc<CachedPlan>, u64, [u8; HEADER_BYTES])> {
        let mut st = self.lock_state()?;
        let forced = self.forced_word(spec.collective);
        let call = self.derive_call(&mut st, spec, forced, false)?;
        let (algorithm, cached, mut header) =
            (call.header.algorithm, call.cached.clone(), call.header);
        st.device_seq += 1;
        header.seq = st.device_seq;
        let encoded = header.encode();
        let record = self.inner.health.device_op_started(&encoded);
        Ok((algorithm, cached, record, encoded))
    }

    /// [`Communicator::algorithm_for`], remembering the tuner's last answer, and whether a
    /// near-tie trial still timing chose it. A host call (`trial`) of a size class whose best
    /// two algorithms the model prices alike runs the one its trial says ([`trial`]); the
    /// call by which the ranks agree on a trial's outcome runs recursive doubling.
    fn chosen_algorithm(
        &self,
        st: &mut State,
        collective: Collective,
        bytes: usize,
        trial: bool,
    ) -> (Algorithm, bool) {
        if let Some(a) = self.forced_algorithm(collective) {
            return (a, false);
        }
        if trial && st.agreeing {
            return (Algorithm::RecursiveDoubling, false);
        }
        if !st.trials.is_empty()
            && let Some(t) = st.trials.get(&trial::key(collective, bytes))
        {
            match t.decided {
                Some(a) => return (a, false),
                None if trial => return (t.current(), true),
                None => {}
            }
        }
        match st.last_choice {
            Some((c, b, a)) if c == collective && b == bytes => (a, false),
            _ => {
                let choice = self.inner.tuner.choose_with_rivals(collective, bytes);
                let a = choice.chosen();
                if choice.len() > 1 && trial && self.inner.cfg.tuner_trials {
                    let key = trial::key(collective, bytes);
                    st.trials.insert(key, trial::Trial::new(choice, key));
                    return (a, true);
                }
                st.last_choice = Some((collective, bytes, a));
                (a, false)
            }
        }
    }

    /// The executor's context for one call described by `local`, with no headers yet.
    pub(super) fn op_run<'a>(
        &'a self,
        st: &'a mut State,
        local: Header,
        dtype: DataType,
        (combine, divide_by): (Combine, Option<usize>),
    ) -> OpRun<'a> {
        let inner = &*self.inner;
        OpRun {
            rank: inner.rank,
            peers: &inner.peers,
            conns: &mut st.conns,
            dtype,
            combine,
            divide_by,
            hdr_out: &[],
            hdr_in: &[],
            wire_out: local,
            wire_in: local,
            per_peer: &[],
            local,
            timeout: self.timeout(),
            clock: None,
            abort: &inner.health.interrupt,
            reuse: &mut st.exec,
            progress_events: 0,
            goodbye_seen: None,
            abort_seen: false,
            spin: inner.spin,
            sent_ahead: inner.cfg.send_ahead.then_some(&inner.sent_ahead),
        }
    }

    /// Ends a call: an interruption reports the fault behind it, a collective's timeout is
    /// diagnosed, and a failure breaks the communicator and is told to the peers.
    pub(super) fn conclude(
        &self,
        st: &mut State,
        local: &Header,
        result: Result<()>,
    ) -> Result<()> {
        self.conclude_timed(st, local, result).0
    }

    /// [`Communicator::conclude`], and how long the call ran in ticks of the flight
    /// recorder's clock ([`Communicator::seconds_per_tick`]).
    fn conclude_timed(
        &self,
        st: &mut State,
        local: &Header,
        result: Result<()>,
    ) -> (Result<()>, u64) {
        let seq = local.call_seq();
        let result = result.map_err(|e| match e {
            Error::Aborted(None) => self.async_error().unwrap_or(Error::Aborted(None)),
            e @ Error::Timeout { .. } if seq > 0 => self.diagnose(e),
            e => e,
        });
        let ticks = self.inner.health.op_finished(seq, result.as_ref().err());
        if let Err(e) = &result
            && let Some(earlier) = self.fail(st, e, &local.describe())
            && !outranks(e, &earlier)
        {
            // Another error broke the communicator first (this one is likely its echo):
            // every rank reports that one.
            return (Err(earlier), ticks);
        }
        (result, ticks)
    }

    /// Seconds per tick of the flight recorder's clock, as last measured; measured now if
    /// `again` or never (the straggler accounting measures again at some of its folds).
    fn seconds_per_tick(&self, st: &mut State, again: bool) -> f64 {
        if again || st.seconds_per_tick <= 0.0 {
            st.seconds_per_tick = self.inner.health.seconds_per_tick().unwrap_or(0.0);
        }
        st.seconds_per_tick
    }

    /// Opens (as the lower rank) or waits for (as the higher rank) every connection needed.
    pub(super) fn ensure_connections(
        &self,
        st: &mut State,
        peers: &[usize],
        call: &Header,
    ) -> Result<()> {
        if st.connected_to(peers) {
            return Ok(());
        }
        let deadline = Instant::now() + self.timeout();
        let inner = &*self.inner;
        let me = &inner.peers[inner.rank];
        // Open every connection even after one fails, so that the failure notice reaches all
        // the peers that would otherwise wait for this rank to connect.
        let mut first_err = None;
        for &q in peers.iter().filter(|&&q| q > inner.rank) {
            if st.conns[q].is_none() {
                match connection::connect(
                    &inner.comm_id,
                    me,
                    &inner.peers[q],
                    &inner.secret,
                    &inner.cfg,
                    deadline,
                ) {
                    Ok(c) => {
                        tracing::debug!(
                            rank = inner.rank,
                            peer = q,
                            transport = c.data.name(),
                            "connected"
                        );
                        st.conns[q] = Some(c);
                    }
                    Err(e) => {
                        first_err.get_or_insert(e);
                    }
                }
            }
        }
        if let Some(e) = first_err {
            // A failure notice already received explains more than "cannot connect".
            executor::check_control(&mut st.conns, &inner.peers)?;
            return Err(e);
        }
        let started = Instant::now();
        let mut next_probe = started + Duration::from_secs(1);
        loop {
            let mut missing = Vec::new();
            for &q in peers.iter().filter(|&&q| q < inner.rank) {
                if st.conns[q].is_none() {
                    match inner.listener.take(q) {
                        Some(c) => st.conns[q] = Some(c),
                        None => missing.push(q),
                    }
                }
            }
            if missing.is_empty() {
                return Ok(());
            }
            if inner.health.interrupt.load(Ordering::Acquire) {
                return Err(self.async_error().unwrap_or(Error::Aborted(None)));
            }
            if Instant::now() >= deadline {
                return Err(Error::Timeout {
                    op: format!("{} (connecting)", call.describe()),
                    seq: call.seq,
                    waiting_on: missing,
                    after_s: started.elapsed().as_secs_f64(),
                    diagnosis: None,
                });
            }
            executor::check_control(&mut st.conns, &inner.peers)?;
            if Instant::now() >= next_probe {
                // A lower rank that is slow to connect may be gone: ask its listener.
                for &q in &missing {
                    connection::probe(
                        &inner.comm_id,
                        me,
                        &inner.peers[q],
                        &inner.secret,
                        &inner.cfg,
                    )?;
                }
                next_probe = Instant::now() + Duration::from_secs(1);
            }
            inner
                .listener
                .wait_for_any(&missing, Duration::from_millis(20));
        }
    }

    /// Turns the timeout of collective call `seq` into one that names the ranks holding
    /// everyone up, from the job's census of the call (see `diagnosis`: taken once over the
    /// rank tree, within [`DIAGNOSIS_LIMIT`]).
    fn diagnose(&self, e: Error) -> Error {
        let Error::Timeout {
            op,
            seq,
            waiting_on,
            after_s,
            diagnosis: None,
        } = e
        else {
            return e;
        };
        let inner = &*self.inner;
        let census = inner
            .diagnoser
            .census(seq, true, Instant::now() + DIAGNOSIS_LIMIT);
        let waiters = census.in_call;
        let laggards = census.laggards;
        let unasked = match census.unasked {
            0 => String::new(),
            n => format!(" ({n} ranks below one that did not answer were not asked)"),
        };
        if laggards.is_empty() && census.unnamed == 0 {
            let diagnosis = format!(
                "every rank asked is in it; the transfers from {} stalled{unasked}",
                RankList(&waiting_on)
            );
            return Error::Timeout {
                op,
                seq,
                waiting_on,
                after_s,
                diagnosis: Some(diagnosis),
            };
        }
        let named: Vec<String> = laggards
            .iter()
            .map(|(q, what)| {
                let p = &inner.peers[*q];
                format!("rank {q} (host {}, pid {}) {what}", p.host.hostname, p.pid)
            })
            .collect();
        let more = match census.unnamed {
            0 => String::new(),
            n => format!("; and {n} more ranks not in it"),
        };
        let diagnosis = format!(
            "{}{more}; {} {} on {}{unasked}",
            named.join("; "),
            RankList(&waiters),
            if waiters.len() == 1 { "waits" } else { "wait" },
            if laggards.len() == 1 { "it" } else { "them" }
        );
        Error::Timeout {
            op,
            seq,
            waiting_on: laggards.iter().map(|l| l.0).collect(),
            after_s,
            diagnosis: Some(diagnosis),
        }
    }

    /// Marks the communicator failed and tells every connected peer (the watchdog tells the
    /// rest). Returns the fault recorded earlier, if `e` was not the first.
    fn fail(&self, st: &mut State, e: &Error, desc: &str) -> Option<Error> {
        let inner = &*self.inner;
        if matches!(e, Error::Aborted(None)) {
            // `abort()` is local, as NCCL's is (`revoke()` is the one that travels).
            return inner.health.fault();
        }
        // What the peers are told: errors that name the culprit travel as they are; anything
        // else this rank ran into names this rank.
        let me = &inner.peers[inner.rank];
        let shared = match e {
            Error::PeerFailed { .. }
            | Error::Timeout { .. }
            | Error::Mismatch(_)
            | Error::Aborted(_) => e.clone(),
            other => Error::PeerFailed {
                rank: inner.rank,
                host: me.host.hostname.clone(),
                pid: me.pid,
                reason: format!("it failed {desc}: {other}"),
            },
        };
        let e = &shared;
        if !inner.health.record_fault(e) {
            return inner.health.fault();
        }
        self.write_trace();
        let blamed = executor::blamed(e);
        tracing::error!(rank = inner.rank, op = desc, blamed = %blamed, "{e}");
        let frame = ControlFrame::Poison { error: e.clone() };
        for c in st.conns.iter_mut().flatten() {
            c.send_control(&frame);
        }
        None
    }
}

/// Whether a call's own error is reported before the fault recorded `earlier`: a mismatch
/// the call read in a peer's header is a cause, where a peer's failure is often its echo
/// (the peer that found the mismatch too has exited).
fn outranks(own: &Error, earlier: &Error) -> bool {
    matches!(own, Error::Mismatch(_)) && !matches!(earlier, Error::Mismatch(_))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mismatch_the_call_read_outranks_a_peer_failure_recorded_first() {
        let mismatch = Error::Mismatch("rank 1 sent int32, this rank float".into());
        let exited = Error::PeerFailed {
            rank: 1,
            host: "h".into(),
            pid: 7,
            reason: "its listener did not take the watchdog link".into(),
        };
        assert!(outranks(&mismatch, &exited));
        assert!(outranks(&mismatch, &Error::Aborted(None)));
        // Between two mismatches, and for any other error, the first recorded stands.
        assert!(!outranks(&mismatch, &mismatch.clone()));
        assert!(!outranks(&exited, &mismatch));
        assert!(!outranks(&Error::Aborted(None), &exited));
    }
}
