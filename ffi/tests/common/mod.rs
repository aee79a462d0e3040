//! Helpers shared by the integration tests of the C ABI and of the PyTorch backend.

#![allow(dead_code)] // each test binary uses its own subset

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// A line on stderr that `cargo test` does not capture. Under `STRATA_TESTS_ALL=1` (set by
/// `scripts/test-all.sh`, which installs everything the suite needs) a skip is a failure.
pub fn skip(test: &str, why: &str) {
    if std::env::var_os("STRATA_TESTS_ALL").is_some() {
        panic!("{test} would be skipped ({why}), but STRATA_TESTS_ALL=1 runs every test");
    }
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

/// `target/<profile>`, from this test binary's path (`target/<profile>/deps/<test>-…`).
pub fn profile_dir() -> PathBuf {
    let exe = std::env::current_exe().expect("test binary path");
    exe.parent()
        .and_then(Path::parent)
        .expect("target/<profile>/deps")
        .to_path_buf()
}

/// The cdylib this `cargo test` built (`libstrata_ffi.so`, SONAME `libnccl.so.2`).
pub fn built_cdylib() -> PathBuf {
    // `cargo test` leaves the cdylib in deps/; `cargo build` also copies it up a level.
    [profile_dir().join("deps"), profile_dir()]
        .into_iter()
        .map(|d| d.join("libstrata_ffi.so"))
        .find(|p| p.exists())
        .unwrap_or_else(|| panic!("libstrata_ffi.so is not in {}", profile_dir().display()))
}

/// Runs `cmd` with its output captured; kills it after `limit`. Returns (success, output).
pub fn run_bounded(cmd: &mut Command, limit: Duration) -> (bool, String) {
    let out_path = profile_dir().join(format!(
        "test-output-{}-{}",
        std::process::id(),
        rand_suffix()
    ));
    let file = std::fs::File::create(&out_path).expect("output file");
    let mut child = cmd
        .stdout(file.try_clone().expect("dup"))
        .stderr(file)
        .stdin(Stdio::null())
        .spawn()
        .unwrap_or_else(|e| panic!("cannot run {cmd:?}: {e}"));
    let deadline = Instant::now() + limit;
    let mut killed = false;
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            killed = true;
            break child.wait().expect("wait after kill");
        }
        std::thread::sleep(Duration::from_millis(50));
    };
    let mut text = std::fs::read_to_string(&out_path).unwrap_or_default();
    let _ = std::fs::remove_file(&out_path);
    if killed {
        text.push_str(&format!("\n(killed after {} s)", limit.as_secs()));
    }
    (status.success() && !killed, text)
}

/// A number that differs between calls (file names of concurrent tests).
pub fn rand_suffix() -> u64 {
    use std::hash::{BuildHasher, RandomState};
    RandomState::new().hash_one(Instant::now())
}
