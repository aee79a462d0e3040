//! Waiting inside a call: spin, then yield, then sleep on the transports' futexes and
//! descriptors, checking the abort flag, the deadline and the peers' control streams between
//! sleeps.

use super::OpRun;
use crate::connection::{Connection, ControlFrame};
use crate::error::{Error, Result};
use crate::transport::{Direction, Wait, futex};
use crate::wire::PeerInfo;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

const MAX_SLEEP: Duration = Duration::from_millis(50);
/// How long a call keeps polling a peer that has said goodbye before it gives up on it.
const GOODBYE_GRACE: Duration = Duration::from_secs(2);
/// Idle polls before the spin loop starts pausing between polls.
const PAUSE_AFTER: u32 = 64;

/// How long an idle wait spins and yields before it sleeps.
#[derive(Clone, Copy, Debug)]
pub(crate) struct SpinPolicy {
    pub spins: u32,
    pub yields: u32,
}

impl SpinPolicy {
    /// Spin generously when this rank has a core to itself; barely at all when it shares
    /// one, because a spinning rank would take the core of the rank it waits for. Whether it
    /// shares is `shares_core` where every rank of the host is bound to one CPU, else whether
    /// its `local_ranks` outnumber the host's cores ([`host_cores`]). `STRATA_SPIN`
    /// overrides the spin count.
    pub fn for_rank(local_ranks: usize, shares_core: Option<bool>) -> Self {
        let oversubscribed = shares_core.unwrap_or_else(|| local_ranks > host_cores());
        let default = if oversubscribed { 20 } else { 2000 };
        let spins = std::env::var("STRATA_SPIN")
            .ok()
            .and_then(|v| v.trim().parse().ok())
            .unwrap_or(default);
        Self {
            spins,
            yields: if oversubscribed { 2 } else { 50 },
        }
    }
}

/// The cores the ranks of this host share: this process's own CPUs, or more where a
/// launcher has bound it to fewer than the host gives the job (one core per rank): then the
/// CPUs of its cgroup, else every online CPU, at most the cgroup's CPU quota. Binding must
/// not make two ranks on two cores look like two ranks on one.
pub(crate) fn host_cores() -> usize {
    let own = std::thread::available_parallelism().map_or(1, |n| n.get());
    let cgroup = |file: &str| std::fs::read_to_string(format!("/sys/fs/cgroup/{file}")).ok();
    let cpus = cgroup("cpuset.cpus.effective")
        .and_then(|list| count_cpu_list(&list))
        .or_else(|| {
            // SAFETY: sysconf has no preconditions.
            let online = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) };
            usize::try_from(online).ok().filter(|&n| n > 0)
        })
        .unwrap_or(own);
    let quota = cgroup("cpu.max").and_then(|max| cpu_quota(&max));
    own.max(quota.map_or(cpus, |q| cpus.min(q)))
}

/// CPUs in a cgroup CPU list such as `0-3,8,10-11`.
fn count_cpu_list(list: &str) -> Option<usize> {
    let list = list.trim();
    if list.is_empty() {
        return None;
    }
    let mut n = 0;
    for part in list.split(',') {
        n += match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) = (a.trim().parse().ok()?, b.trim().parse().ok()?);
                b.checked_sub(a)? + 1
            }
            None => {
                part.trim().parse::<usize>().ok()?;
                1
            }
        };
    }
    Some(n)
}

/// Whole CPUs of a cgroup v2 `cpu.max` (`quota period`, rounded up); `None` for `max`.
fn cpu_quota(max: &str) -> Option<usize> {
    let mut it = max.split_whitespace();
    let quota: u64 = it.next()?.parse().ok()?;
    let period: u64 = it.next()?.parse().ok().filter(|&p| p > 0)?;
    Some(quota.div_ceil(period).max(1) as usize)
}

impl OpRun<'_> {
    /// Ends one round of a progress loop: a round that moved bytes is counted and the next
    /// starts at once; an idle one waits ([`OpRun::idle_wait`]) on `waits`.
    pub(super) fn end_round(
        &mut self,
        progressed: bool,
        idle: &mut u32,
        waits: &[(usize, Direction)],
    ) -> Result<()> {
        if progressed {
            *idle = 0;
            self.progress_events += 1;
            self.reuse.stalls.moved();
            return Ok(());
        }
        *idle += 1;
        self.idle_wait(*idle, waits)
    }

    /// Waits for progress: spin, then yield, then sleep on what the blocked transfers wait for.
    fn idle_wait(&mut self, idle: u32, waits: &[(usize, Direction)]) -> Result<()> {
        if self.abort.load(Ordering::Acquire) {
            // A peer that found a mismatch may exit at once, and the watchdog's fault for its
            // exit can beat the mismatching header it had already delivered: one more round
            // reads what has arrived before the call gives up.
            if self.abort_seen {
                return Err(Error::Aborted(None));
            }
            self.abort_seen = true;
            return Ok(());
        }
        if idle < self.spin.spins {
            // The first polls go back at once: data usually arrives within a few hundred
            // nanoseconds, and a pause instruction would only add to that.
            if idle > PAUSE_AFTER {
                std::hint::spin_loop();
            }
            return Ok(());
        }
        if idle < self.spin.spins + self.spin.yields {
            std::thread::yield_now();
            return Ok(());
        }
        let now = Instant::now();
        self.reuse.stalls.sleeping(now, waits);
        let timeout = self.timeout;
        let (started, deadline) = *self.clock.get_or_insert((now, now + timeout));
        if now >= deadline {
            let mut waiting_on: Vec<usize> = waits.iter().map(|w| w.0).collect();
            waiting_on.sort_unstable();
            waiting_on.dedup();
            return Err(Error::Timeout {
                op: self.desc(),
                seq: self.local.call_seq(),
                waiting_on,
                after_s: (now - started).as_secs_f64(),
                diagnosis: None,
            });
        }
        self.check_control(waits)?;
        let mut sleep = MAX_SLEEP
            .min(deadline - now)
            .min(self.reuse.stalls.longest_sleep());
        let mut futexes: Vec<(*const AtomicU32, u32, *const AtomicU32)> = Vec::new();
        let mut fds: Vec<libc::pollfd> = Vec::new();
        let mut sleep_on = Vec::with_capacity(waits.len());
        for &(peer, dir) in waits {
            sleep_on.push(self.conn(peer)?.data.wait_for(dir));
        }
        // A connection this call does not wait on can still fail under it (an RDMA completion
        // error, or a credit it owes a peer that waits): let it progress, and wake for it.
        for peer in 0..self.conns.len() {
            if waits.iter().any(|w| w.0 == peer) {
                continue;
            }
            // A peer that said goodbye may fail its side of the connection; that is no fault.
            let Some(c) = self.conns[peer].as_mut().filter(|c| !c.gone) else {
                continue;
            };
            match c.data.background() {
                Ok(Some(w)) => sleep_on.push(w),
                Ok(None) => {}
                Err(e) => return Err(self.io_err(peer, e)),
            }
        }
        for w in sleep_on {
            match w {
                Wait::Within(d) => sleep = sleep.min(d),
                Wait::Futex {
                    word,
                    expected,
                    flag,
                } => futexes.push((word, expected, flag)),
                Wait::Fd { fd, events } => fds.push(libc::pollfd {
                    fd,
                    events,
                    revents: 0,
                }),
            }
        }
        for c in self.conns.iter().flatten() {
            fds.push(libc::pollfd {
                fd: std::os::fd::AsRawFd::as_raw_fd(&c.control),
                events: libc::POLLIN,
                revents: 0,
            });
        }
        let only_control = fds.len() - self.conns.iter().flatten().count() == 0;
        if !futexes.is_empty() {
            // SAFETY: the words and flags live in ring memory owned by connections that outlive
            // this call.
            let words: Vec<(&AtomicU32, u32)> = futexes
                .iter()
                .map(|(w, v, _)| (unsafe { &**w }, *v))
                .collect();
            for (_, _, f) in &futexes {
                // SAFETY: as above.
                unsafe { &**f }.store(1, Ordering::SeqCst);
            }
            let t = if only_control {
                sleep
            } else {
                sleep.min(Duration::from_millis(1))
            };
            self.reuse.stalls.polled(now, t);
            futex::wait_any(&words, t);
            for (_, _, f) in &futexes {
                // SAFETY: as above.
                unsafe { &**f }.store(0, Ordering::SeqCst);
            }
            if !only_control {
                // SAFETY: valid pollfd array.
                unsafe { libc::poll(fds.as_mut_ptr(), fds.len() as libc::nfds_t, 0) };
            }
        } else {
            self.reuse.stalls.polled(now, sleep);
            let ts = libc::timespec {
                tv_sec: sleep.as_secs() as libc::time_t,
                tv_nsec: sleep.subsec_nanos() as libc::c_long,
            };
            // SAFETY: valid pollfd array and timeout.
            unsafe {
                libc::ppoll(
                    fds.as_mut_ptr(),
                    fds.len() as libc::nfds_t,
                    &ts,
                    std::ptr::null(),
                )
            };
        }
        Ok(())
    }

    /// Reads every control stream; a peer that said goodbye while this call still waits on it
    /// fails the call once nothing has moved for [`GOODBYE_GRACE`] (its last messages may
    /// still be on their way on other streams).
    fn check_control(&mut self, waits: &[(usize, Direction)]) -> Result<()> {
        check_control(self.conns, self.peers)?;
        let gone = waits.iter().map(|w| w.0).find(|&q| {
            self.conns
                .get(q)
                .and_then(Option::as_ref)
                .is_some_and(|c| c.gone)
        });
        let Some(peer) = gone else {
            self.goodbye_seen = None;
            return Ok(());
        };
        match self.goodbye_seen {
            Some((at, since)) if at == self.progress_events => {
                if since.elapsed() >= GOODBYE_GRACE {
                    return Err(self.peer_failed(
                        peer,
                        format!(
                            "it destroyed its communicator while this rank waits on it in {}",
                            self.desc()
                        ),
                    ));
                }
            }
            _ => self.goodbye_seen = Some((self.progress_events, Instant::now())),
        }
        Ok(())
    }
}

/// Reads control frames from every connection: a failure notice, or a peer that vanished
/// without a goodbye, is an error.
pub(crate) fn check_control(conns: &mut [Option<Connection>], peers: &[PeerInfo]) -> Result<()> {
    for c in conns.iter_mut().flatten() {
        let info = &peers[c.peer];
        while let Some(frame) = c.poll_control(info)? {
            match frame {
                ControlFrame::Poison { error } => return Err(error),
                ControlFrame::Goodbye => {}
            }
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A rank that has its core to itself spins where the host has more ranks than cores;
    /// one that shares its core barely spins, even where the host has cores to spare.
    #[test]
    fn a_rank_spins_when_its_core_is_its_own() {
        if std::env::var_os("STRATA_SPIN").is_some() {
            println!("skipped: STRATA_SPIN is set, and it overrides the spin count");
            return;
        }
        let crowded = 4 * host_cores();
        let own = SpinPolicy::for_rank(crowded, Some(false));
        let shared = SpinPolicy::for_rank(1, Some(true));
        assert!(own.spins > 10 * shared.spins, "{own:?} vs {shared:?}");
        assert!(own.yields > shared.yields, "{own:?} vs {shared:?}");
        // Without bindings, the host's count decides.
        assert_eq!(SpinPolicy::for_rank(crowded, None).spins, shared.spins);
        assert_eq!(SpinPolicy::for_rank(1, None).spins, own.spins);
    }

    /// A wait that finds the call aborted lets the loop read once more (a peer's last
    /// header may have arrived with the fault) and ends the call at the next idle wait.
    #[test]
    fn an_abort_ends_the_call_after_one_more_round() {
        use strata_algorithms::{Algorithm, Collective};
        let abort = std::sync::atomic::AtomicBool::new(false);
        let mut reuse = super::super::ExecBuffers::default();
        let local = super::super::Header {
            collective: Collective::AllReduce,
            seq: 1,
            dtype: crate::dtype::DataType::Float32,
            count: 64,
            op: 0,
            param: 0,
            algorithm: Algorithm::RecursiveDoubling,
        };
        let mut run = OpRun {
            rank: 0,
            peers: &[],
            conns: &mut [],
            dtype: local.dtype,
            combine: crate::reduce::Combine::Sum,
            divide_by: None,
            hdr_out: &[],
            hdr_in: &[],
            wire_out: local,
            wire_in: local,
            per_peer: &[],
            local,
            timeout: Duration::from_secs(60),
            clock: None,
            abort: &abort,
            reuse: &mut reuse,
            progress_events: 0,
            goodbye_seen: None,
            abort_seen: false,
            spin: SpinPolicy {
                spins: 4,
                yields: 0,
            },
            sent_ahead: None,
        };
        assert!(run.idle_wait(1, &[]).is_ok());
        abort.store(true, Ordering::Release);
        assert!(run.idle_wait(2, &[]).is_ok(), "no round after the abort");
        assert!(
            matches!(run.idle_wait(3, &[]), Err(Error::Aborted(None))),
            "the call went on after its last round"
        );
    }

    #[test]
    fn cgroup_cpu_lists_and_quotas_parse() {
        assert_eq!(count_cpu_list("0-3,8,10-11\n"), Some(7));
        assert_eq!(count_cpu_list("5"), Some(1));
        assert_eq!(count_cpu_list(""), None);
        assert_eq!(count_cpu_list("3-1"), None);
        assert_eq!(cpu_quota("max 100000"), None);
        assert_eq!(cpu_quota("250000 100000\n"), Some(3));
        assert_eq!(cpu_quota("50000 100000"), Some(1));
    }

    /// A process bound to one core still counts the cores its host gives the job: two ranks
    /// bound to two cores are not two ranks on one.
    #[test]
    fn binding_to_one_core_does_not_shrink_the_host() {
        let before = host_cores();
        // SAFETY: a zeroed cpu_set_t is valid; CPU_SET and sched_{get,set}affinity take
        // pointers to it that live across the calls.
        unsafe {
            let mut saved: libc::cpu_set_t = std::mem::zeroed();
            libc::sched_getaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &mut saved);
            let first = (0..libc::CPU_SETSIZE as usize)
                .find(|&c| libc::CPU_ISSET(c, &saved))
                .unwrap();
            let mut one: libc::cpu_set_t = std::mem::zeroed();
            libc::CPU_SET(first, &mut one);
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &one);
            let bound = host_cores();
            libc::sched_setaffinity(0, std::mem::size_of::<libc::cpu_set_t>(), &saved);
            assert_eq!(bound, before);
        }
    }
}
