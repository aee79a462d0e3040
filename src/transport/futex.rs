//! Futex waits on words in (possibly shared) memory, including waits on several words at once
//! (`futex_waitv`, Linux 5.16+, with a fallback to a short wait on the first word).

use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::time::Duration;

/// Wakes every waiter on `word`.
pub(crate) fn wake(word: &AtomicU32) {
    // SAFETY: FUTEX_WAKE only reads the address; `word` is a valid, aligned u32.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAKE,
            i32::MAX,
            std::ptr::null::<libc::timespec>(),
        );
    }
}

fn timespec(d: Duration) -> libc::timespec {
    libc::timespec {
        tv_sec: d.as_secs() as libc::time_t,
        tv_nsec: d.subsec_nanos() as libc::c_long,
    }
}

/// Sleeps while `*word == expected`, at most `timeout`. Spurious returns are allowed.
pub(crate) fn wait(word: &AtomicU32, expected: u32, timeout: Duration) {
    let ts = timespec(timeout);
    // SAFETY: `word` is a valid, aligned u32 for the duration of the call; `ts` outlives it.
    unsafe {
        libc::syscall(
            libc::SYS_futex,
            word.as_ptr(),
            libc::FUTEX_WAIT,
            expected,
            &ts as *const libc::timespec,
        );
    }
}

#[repr(C)]
struct FutexWaitv {
    val: u64,
    uaddr: u64,
    flags: u32,
    reserved: u32,
}

const SYS_FUTEX_WAITV: libc::c_long = 449;
const FUTEX2_SIZE_U32: u32 = 2;
static WAITV_UNSUPPORTED: AtomicBool = AtomicBool::new(false);

/// Sleeps until any `(word, expected)` pair differs or `timeout` passes.
pub(crate) fn wait_any(words: &[(&AtomicU32, u32)], timeout: Duration) {
    match words {
        [] => std::thread::sleep(timeout),
        [(w, v)] => wait(w, *v, timeout),
        _ if cfg!(target_arch = "x86_64") && !WAITV_UNSUPPORTED.load(Ordering::Relaxed) => {
            let list: Vec<FutexWaitv> = words
                .iter()
                .take(128)
                .map(|(w, v)| FutexWaitv {
                    val: *v as u64,
                    uaddr: w.as_ptr() as u64,
                    flags: FUTEX2_SIZE_U32,
                    reserved: 0,
                })
                .collect();
            let mut now = libc::timespec {
                tv_sec: 0,
                tv_nsec: 0,
            };
            // SAFETY: `now` is a valid out pointer.
            unsafe { libc::clock_gettime(libc::CLOCK_MONOTONIC, &mut now) };
            let deadline = Duration::new(now.tv_sec as u64, now.tv_nsec as u32) + timeout;
            let ts = timespec(deadline);
            // SAFETY: `list` holds valid aligned u32 addresses that live across the call; `ts` too.
            let rc = unsafe {
                libc::syscall(
                    SYS_FUTEX_WAITV,
                    list.as_ptr(),
                    list.len() as u32,
                    0u32,
                    &ts as *const libc::timespec,
                    libc::CLOCK_MONOTONIC,
                )
            };
            if rc < 0 && std::io::Error::last_os_error().raw_os_error() == Some(libc::ENOSYS) {
                WAITV_UNSUPPORTED.store(true, Ordering::Relaxed);
            }
        }
        _ => wait(
            words[0].0,
            words[0].1,
            timeout.min(Duration::from_micros(500)),
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;
    use std::time::Instant;

    #[test]
    fn wait_any_wakes_on_the_second_word() {
        let words = Arc::new([AtomicU32::new(0), AtomicU32::new(0)]);
        let w2 = words.clone();
        let t = std::thread::spawn(move || {
            std::thread::sleep(Duration::from_millis(50));
            w2[1].store(1, Ordering::SeqCst);
            wake(&w2[1]);
        });
        let start = Instant::now();
        while words[1].load(Ordering::SeqCst) == 0 {
            wait_any(&[(&words[0], 0), (&words[1], 0)], Duration::from_secs(5));
        }
        assert!(start.elapsed() < Duration::from_secs(4));
        t.join().unwrap();
    }
}
