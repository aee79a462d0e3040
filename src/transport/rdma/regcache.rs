//! The registration cache: registering memory with a NIC pins it and costs tens of
//! microseconds, so a region is registered once and found again by address range.
//! Registrations are reference-counted; a range that is freed must be invalidated
//! ([`invalidate`]), which drops every cached registration overlapping it.

use super::Region;
use std::collections::BTreeMap;
use std::io;
use std::sync::{Arc, Mutex, OnceLock, Weak};

/// One cached registration.
struct Entry<H> {
    region: Region,
    handle: H,
    users: usize,
}

/// A cache of registrations of one provider and protection domain; `H` is the provider's
/// handle (an `ibv_mr`, a `fid_mr`), released by `release`.
pub(crate) struct RegCache<H: Send> {
    entries: Mutex<BTreeMap<u64, Entry<H>>>,
    release: Box<dyn Fn(H) + Send + Sync>,
}

/// Every cache of the process, so that freeing memory reaches all of them.
fn all() -> &'static Mutex<Vec<Weak<dyn Invalidate>>> {
    static ALL: OnceLock<Mutex<Vec<Weak<dyn Invalidate>>>> = OnceLock::new();
    ALL.get_or_init(Default::default)
}

trait Invalidate: Send + Sync {
    fn invalidate(&self, start: u64, len: usize);
}

/// Drops every cached registration overlapping `[ptr, ptr + len)` in every cache: call it
/// before that memory is freed.
pub fn invalidate(ptr: *const u8, len: usize) {
    let Ok(mut list) = all().lock() else {
        return;
    };
    list.retain(|w| w.strong_count() > 0);
    for c in list.iter().filter_map(Weak::upgrade) {
        c.invalidate(ptr as u64, len);
    }
}

impl<H: Send + 'static> RegCache<H> {
    /// A cache whose registrations `release` undoes.
    pub fn new(release: impl Fn(H) + Send + Sync + 'static) -> Arc<Self> {
        // Device memory strata frees drops its registrations first.
        static HOOKED: std::sync::Once = std::sync::Once::new();
        HOOKED.call_once(|| crate::gpu::on_device_free(invalidate));
        let c = Arc::new(Self {
            entries: Mutex::new(BTreeMap::new()),
            release: Box::new(release),
        });
        let weak: Weak<dyn Invalidate> = Arc::downgrade(&(c.clone() as Arc<dyn Invalidate>));
        if let Ok(mut list) = all().lock() {
            list.push(weak);
        }
        c
    }

    /// The registration covering `[ptr, ptr + len)`, made by `register` if none is cached.
    pub fn get(
        &self,
        ptr: *mut u8,
        len: usize,
        register: impl FnOnce() -> io::Result<(Region, H)>,
    ) -> io::Result<Region> {
        let (start, end) = (ptr as u64, ptr as u64 + len as u64);
        let mut map = self
            .entries
            .lock()
            .map_err(|_| io::Error::other("registration cache lock poisoned"))?;
        if let Some((_, e)) = map.range_mut(..=start).next_back()
            && e.region.addr + e.region.len as u64 >= end
        {
            e.users += 1;
            return Ok(e.region);
        }
        let (region, handle) = register()?;
        map.insert(
            start,
            Entry {
                region,
                handle,
                users: 1,
            },
        );
        Ok(region)
    }

    /// Gives back one use of `region`; the last use deregisters it.
    pub fn put(&self, region: &Region) {
        let Ok(mut map) = self.entries.lock() else {
            return;
        };
        let last = match map.get_mut(&region.addr) {
            Some(e) => {
                e.users -= 1;
                e.users == 0
            }
            None => false,
        };
        if last && let Some(e) = map.remove(&region.addr) {
            (self.release)(e.handle);
        }
    }

    /// Registrations cached now.
    #[cfg(test)]
    pub fn len(&self) -> usize {
        self.entries.lock().map(|m| m.len()).unwrap_or(0)
    }
}

impl<H: Send + 'static> Invalidate for RegCache<H> {
    fn invalidate(&self, start: u64, len: usize) {
        let end = start + len as u64;
        let Ok(mut map) = self.entries.lock() else {
            return;
        };
        let doomed: Vec<u64> = map
            .iter()
            .filter(|(_, e)| e.region.addr < end && start < e.region.addr + e.region.len as u64)
            .map(|(&k, _)| k)
            .collect();
        for k in doomed {
            if let Some(e) = map.remove(&k) {
                (self.release)(e.handle);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::atomic::{AtomicUsize, Ordering};

    fn region(addr: u64, len: usize) -> Region {
        Region {
            addr,
            len,
            local: addr,
            rkey: addr,
            remote_base: addr,
        }
    }

    #[test]
    fn hits_inside_a_registration_and_invalidates_on_free() {
        static RELEASED: AtomicUsize = AtomicUsize::new(0);
        static MADE: AtomicUsize = AtomicUsize::new(0);
        let cache = RegCache::new(|_: u64| {
            RELEASED.fetch_add(1, Ordering::SeqCst);
        });
        let buf = vec![0u8; 1 << 16];
        let base = buf.as_ptr() as *mut u8;
        let reg = |a: *mut u8, n: usize| {
            move || {
                MADE.fetch_add(1, Ordering::SeqCst);
                Ok((region(a as u64, n), a as u64))
            }
        };
        let whole = cache.get(base, 1 << 16, reg(base, 1 << 16)).unwrap();
        // A range inside is a hit: no second registration.
        // SAFETY: inside buf.
        let inner = unsafe { base.add(4096) };
        let hit = cache.get(inner, 4096, reg(inner, 4096)).unwrap();
        assert_eq!(MADE.load(Ordering::SeqCst), 1);
        assert_eq!(hit.rkey, whole.rkey);
        // Two users: one put keeps it.
        cache.put(&whole);
        assert_eq!(cache.len(), 1);
        assert_eq!(RELEASED.load(Ordering::SeqCst), 0);
        // Freeing the memory drops it from every cache.
        invalidate(inner, 1);
        assert_eq!(cache.len(), 0);
        assert_eq!(RELEASED.load(Ordering::SeqCst), 1);
        // After the free, the same range registers anew.
        cache.get(base, 1 << 16, reg(base, 1 << 16)).unwrap();
        assert_eq!(MADE.load(Ordering::SeqCst), 2);
    }
}
