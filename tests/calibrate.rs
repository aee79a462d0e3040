//! `collbench calibrate` on two spawned ranks: it writes a profile whose figures predict the
//! times it measured at least as well as the figures it started from, the tuner prices with
//! that profile when `STRATA_COST_PROFILE` names it (collbench's `predicted` column is the
//! calibrated prediction), and a bad profile is refused with its file and figure named, never
//! overwritten.

use std::path::Path;
use std::process::{Command, Output};

fn collbench(args: &[&str], env: &[(&str, &std::ffi::OsStr)]) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_collbench"));
    c.args(args)
        .env("STRATA_SOCKET_IFNAME", "=lo")
        .env_remove("STRATA_COST_PROFILE")
        .args(["--timeout", "120"]);
    for (k, v) in env {
        c.env(k, v);
    }
    c.output().unwrap()
}

fn text(o: &Output) -> String {
    format!(
        "{}\n{}",
        String::from_utf8_lossy(&o.stdout),
        String::from_utf8_lossy(&o.stderr)
    )
}

/// A calibration of 2 ranks up to 64 B in one round, writing `profile`.
fn quick_calibration(profile: &str, more: &[&str]) -> Output {
    let mut args = vec![
        "calibrate",
        "--np",
        "2",
        "-e",
        "64",
        "--rounds",
        "1",
        "--profile",
        profile,
    ];
    args.extend_from_slice(more);
    collbench(&args, &[])
}

/// A directory of this test's own, removed when it ends.
struct TempDir(std::path::PathBuf);

impl TempDir {
    fn new(name: &str) -> Self {
        let d = std::env::temp_dir().join(format!("strata-{name}-{}", std::process::id()));
        std::fs::create_dir_all(&d).unwrap();
        Self(d)
    }

    fn path(&self) -> &Path {
        &self.0
    }
}

impl Drop for TempDir {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// The calibrate JSON's points.
fn points(path: &Path) -> Vec<serde_json::Value> {
    serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap()
}

fn squared_error(points: &[serde_json::Value], key: &str) -> f64 {
    points
        .iter()
        .filter_map(|p| Some((p[key].as_f64()? / p["measured_us"].as_f64()? - 1.0).powi(2)))
        .sum()
}

#[test]
fn calibrate_writes_a_profile_the_tuner_then_prices_with() {
    let dir = TempDir::new("calibrate");
    let profile = dir.path().join("profile.toml");
    let json = dir.path().join("points.json");
    let p = profile.to_str().unwrap();
    let j = json.to_str().unwrap();
    let out = collbench(
        &[
            "calibrate",
            "--np",
            "2",
            "-e",
            "256K",
            "--rounds",
            "3",
            "--profile",
            p,
            "--json",
            j,
        ],
        &[],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(t.contains("within ±25% of the measured time"), "{t}");
    assert!(t.contains("tiers.host: α"), "{t}");
    let pts = points(&json);
    // 15 all-reduce, 5 all-gather and 5 reduce-scatter algorithms run on 2 ranks, at 8 B, 64 B,
    // 512 B, 4 KiB, 32 KiB and 256 KiB.
    assert_eq!(pts.len(), 25 * 6, "{t}");
    assert!(pts.iter().all(|x| x["measured_us"].as_f64().unwrap() > 0.0));
    // The fit only takes steps that lower the error, from the figures the job priced with.
    let (before, after) = (
        squared_error(&pts, "before_us"),
        squared_error(&pts, "after_us"),
    );
    assert!(after <= before, "after {after} > before {before}");

    let prof = strata::topology::profile::load_profile(&profile).unwrap();
    let (patch, measured) = if t.contains("wrote its tiers part") {
        (prof.tiers, prof.measured.clone().unwrap())
    } else {
        // A one-core machine: two ranks share it.
        let s = prof.shared_core.clone().expect("a shared_core part");
        (s.tiers, s.measured)
    };
    assert!(patch.host.is_some() && patch.call_us.is_some() && patch.copy_gbps.is_some());
    assert_eq!(measured.points, pts.len());
    assert_eq!(measured.ranks, 2);

    // With the profile, collbench's predicted column is calibrate's "after" figure.
    let bench_json = dir.path().join("bench.json");
    let out = collbench(
        &[
            "--np",
            "2",
            "-b",
            "32K",
            "-e",
            "32K",
            "--algo",
            "ring",
            "-n",
            "2",
            "-w",
            "1",
            "-J",
            bench_json.to_str().unwrap(),
        ],
        &[("STRATA_COST_PROFILE", profile.as_os_str())],
    );
    assert!(out.status.success(), "{}", text(&out));
    let report: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&bench_json).unwrap()).unwrap();
    let predicted = report["rows"][0]["predicted_us"].as_f64().unwrap();
    let calibrated = pts
        .iter()
        .find(|x| {
            x["collective"] == "all_reduce" && x["algorithm"] == "ring" && x["size_bytes"] == 32768
        })
        .unwrap()["after_us"]
        .as_f64()
        .unwrap();
    assert!(
        (predicted / calibrated - 1.0).abs() < 1e-9,
        "collbench predicted {predicted} us, calibrate's fit {calibrated} us"
    );

    // A second calibration updates the same file rather than replacing what it does not
    // measure.
    let out = quick_calibration(p, &["--ops", "all_gather"]);
    assert!(out.status.success(), "{}", text(&out));
    let again = strata::topology::profile::load_profile(&profile).unwrap();
    assert_eq!(again.shared_core, prof.shared_core);
}

/// `--refit FILE` fits an earlier run's measured times without timing anything: the same
/// measured column, a fit no worse than its start; a file without a point asked for is named
/// with the point, and every rank fails with its own error.
#[test]
fn refit_fits_an_earlier_runs_times() {
    let dir = TempDir::new("refit");
    let profile = dir.path().join("profile.toml");
    let (first, second) = (
        dir.path().join("first.json"),
        dir.path().join("second.json"),
    );
    let p = profile.to_str().unwrap();
    let out = quick_calibration(p, &["--no-write", "--json", first.to_str().unwrap()]);
    assert!(out.status.success(), "{}", text(&out));
    let out = quick_calibration(
        p,
        &[
            "--no-write",
            "--refit",
            first.to_str().unwrap(),
            "--json",
            second.to_str().unwrap(),
        ],
    );
    let t = text(&out);
    assert!(out.status.success(), "{t}");
    assert!(!profile.exists(), "--no-write wrote {p}");
    let (a, b) = (points(&first), points(&second));
    assert_eq!(a.len(), b.len(), "{t}");
    for (x, y) in a.iter().zip(&b) {
        let (mx, my) = (
            x["measured_us"].as_f64().unwrap(),
            y["measured_us"].as_f64().unwrap(),
        );
        assert!((mx / my - 1.0).abs() < 1e-9, "{x} against {y}");
    }
    assert!(squared_error(&b, "after_us") <= squared_error(&b, "before_us"));
    // Sizes it never timed.
    let out = collbench(
        &[
            "calibrate",
            "--np",
            "2",
            "-e",
            "512",
            "--rounds",
            "1",
            "--no-write",
            "--refit",
            first.to_str().unwrap(),
        ],
        &[],
    );
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("has no measured time of") && t.contains("512 B"),
        "{t}"
    );
    // Rank 1 is told, rather than left to see rank 0's exit as a failure.
    assert!(t.contains("rank 0 could not refit"), "{t}");
}

#[test]
fn a_bad_profile_is_named_and_never_overwritten() {
    let dir = TempDir::new("bad-profile");
    let bad = dir.path().join("bad.toml");
    let content = "[tiers]\nreduce_gbps = -1.0\n";
    std::fs::write(&bad, content).unwrap();
    let out = collbench(
        &["--np", "2", "-b", "8", "-e", "8", "-n", "1"],
        &[("STRATA_COST_PROFILE", bad.as_os_str())],
    );
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("STRATA_COST_PROFILE") && t.contains("reduce_gbps") && t.contains("bad.toml"),
        "{t}"
    );
    // explain loads the profile the way init does, so it fails the same way.
    let explain = |profile: &std::ffi::OsStr| {
        Command::new(env!("CARGO_BIN_EXE_collbench"))
            .args(["explain", "--np", "2", "--size", "8"])
            .env("STRATA_COST_PROFILE", profile)
            .output()
            .unwrap()
    };
    let out = explain(bad.as_os_str());
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("STRATA_COST_PROFILE") && t.contains("reduce_gbps") && t.contains("bad.toml"),
        "{t}"
    );
    // A blank variable is an unset one, for explain as for init.
    let out = explain(" ".as_ref());
    assert!(out.status.success(), "{}", text(&out));
    let out = quick_calibration(bad.to_str().unwrap(), &[]);
    let t = text(&out);
    assert!(!out.status.success(), "{t}");
    assert!(
        t.contains("cannot update it") && t.contains("reduce_gbps"),
        "{t}"
    );
    assert_eq!(std::fs::read_to_string(&bad).unwrap(), content);
}
