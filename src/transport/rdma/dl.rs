//! A library opened with `dlopen` and never closed, and typed symbol lookup.

use std::ffi::{CString, c_void};

/// An open library (the handle is deliberately never closed: its code may be running on
/// other threads until the process exits).
pub(crate) struct Library {
    handle: *mut c_void,
    name: String,
}

// SAFETY: a dlopen handle may be used from any thread.
unsafe impl Send for Library {}
// SAFETY: as above; dlsym is thread-safe.
unsafe impl Sync for Library {}

impl Library {
    /// Opens the first of `names` that loads; `Err` names them and says what `dlerror` said.
    pub fn open(names: &[&str]) -> Result<Self, String> {
        let mut last = String::new();
        for name in names {
            let c = CString::new(*name).map_err(|e| e.to_string())?;
            // SAFETY: dlopen of a library name.
            let handle = unsafe { libc::dlopen(c.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
            if !handle.is_null() {
                return Ok(Self {
                    handle,
                    name: name.to_string(),
                });
            }
            // SAFETY: dlerror returns a thread-local string or NULL.
            let e = unsafe { libc::dlerror() };
            if !e.is_null() {
                // SAFETY: a NUL-terminated string from dlerror.
                last = unsafe { std::ffi::CStr::from_ptr(e) }
                    .to_string_lossy()
                    .into_owned();
            }
        }
        Err(format!("cannot load {}: {last}", names.join(" or ")))
    }

    /// The symbol `name` as a function pointer of type `T`.
    ///
    /// # Safety
    /// `T` must be the symbol's true (function pointer) type.
    pub unsafe fn get<T: Copy>(&self, name: &str) -> Result<T, String> {
        assert_eq!(std::mem::size_of::<T>(), std::mem::size_of::<*mut c_void>());
        let c = CString::new(name).map_err(|e| e.to_string())?;
        // SAFETY: a valid handle and symbol name.
        let p = unsafe { libc::dlsym(self.handle, c.as_ptr()) };
        if p.is_null() {
            return Err(format!("{} has no {name}", self.name));
        }
        // SAFETY: the caller vouches for the type; sizes are equal.
        Ok(unsafe { std::mem::transmute_copy::<*mut c_void, T>(&p) })
    }

    /// The symbol `name` if the library has it.
    ///
    /// # Safety
    /// As [`Library::get`].
    pub unsafe fn get_optional<T: Copy>(&self, name: &str) -> Option<T> {
        // SAFETY: forwarded.
        unsafe { self.get(name) }.ok()
    }
}
