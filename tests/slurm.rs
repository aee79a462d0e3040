//! collbench under a real Slurm (Debian's `slurmctld`, `slurmd` and `srun`, 22.05), started by
//! the test on this machine in a folder of its own: `srun`, `salloc` + `srun` and an `sbatch`
//! script run collbench with no rendezvous variable set (the root is the step's first node,
//! the port one the job and step ids imply) and get 0 wrong; a task killed mid-step ends the
//! step with its name. Needs root (slurmd runs the tasks) and the Slurm packages
//! (`scripts/test-deps.sh` installs them); prints SKIPPED otherwise.

mod common;

use std::path::{Path, PathBuf};
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

/// A one-node Slurm cluster: slurmctld and slurmd in the foreground, killed on drop.
struct Cluster {
    _one_at_a_time: std::sync::MutexGuard<'static, ()>,
    dir: PathBuf,
    conf: PathBuf,
    daemons: Vec<Child>,
}

/// A TCP port nobody listens on now.
fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

impl Cluster {
    /// Starts the daemons and waits (up to 30 s) until the node is idle; the reason when this
    /// machine cannot.
    fn start() -> Result<Self, String> {
        // SAFETY: a plain query.
        if unsafe { libc::geteuid() } != 0 {
            return Err("needs root (slurmd starts the tasks)".into());
        }
        for tool in ["slurmctld", "slurmd", "srun", "sinfo"] {
            if Command::new(tool).arg("-V").output().is_err() {
                return Err(format!(
                    "{tool} is not installed (Debian's slurmctld, slurmd and slurm-client; \
                     scripts/test-deps.sh installs them)"
                ));
            }
        }
        let host = String::from_utf8(Command::new("hostname").output().unwrap().stdout)
            .unwrap()
            .trim()
            .to_string();
        static ONE: std::sync::Mutex<()> = std::sync::Mutex::new(());
        let one = ONE.lock().unwrap_or_else(|e| e.into_inner());
        let dir = std::env::temp_dir().join(format!("strata-slurm-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        for sub in ["state", "spool"] {
            std::fs::create_dir_all(dir.join(sub)).unwrap();
        }
        let d = dir.display();
        let cpus = std::thread::available_parallelism().map_or(1, |n| n.get());
        let conf = dir.join("slurm.conf");
        std::fs::write(
            &conf,
            format!(
                "ClusterName=strata\nSlurmctldHost={host}(127.0.0.1)\n\
                 AuthType=auth/none\nCredType=cred/none\nSlurmUser=root\nSlurmdUser=root\n\
                 SlurmctldPort={}\nSlurmdPort={}\nStateSaveLocation={d}/state\n\
                 SlurmdSpoolDir={d}/spool\nSlurmctldPidFile={d}/ctld.pid\nSlurmdPidFile={d}/d.pid\n\
                 SlurmctldLogFile={d}/ctld.log\nSlurmdLogFile={d}/d.log\n\
                 ProctrackType=proctrack/linuxproc\nTaskPlugin=task/none\n\
                 SchedulerType=sched/builtin\nSelectType=select/cons_tres\n\
                 SelectTypeParameters=CR_Core\nReturnToService=2\nMpiDefault=none\n\
                 JobCompType=jobcomp/none\nAccountingStorageType=accounting_storage/none\n\
                 PlugStackConfig=/dev/null\n\
                 NodeName={host} NodeAddr=127.0.0.1 CPUs={cpus} State=UNKNOWN\n\
                 PartitionName=debug Nodes=ALL Default=YES MaxTime=INFINITE State=UP \
                 OverSubscribe=YES\n",
                free_port(),
                free_port()
            ),
        )
        .unwrap();
        let mut cluster = Cluster {
            _one_at_a_time: one,
            dir,
            conf,
            daemons: Vec::new(),
        };
        for daemon in [
            &["slurmctld", "-D", "-i", "-f"][..],
            &["slurmd", "-D", "-f"],
        ] {
            let child = Command::new(daemon[0])
                .args(&daemon[1..])
                .arg(&cluster.conf)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .spawn()
                .map_err(|e| format!("{}: {e}", daemon[0]))?;
            cluster.daemons.push(child);
        }
        let t = Instant::now();
        loop {
            let out = cluster.run(Command::new("sinfo").args(["-h", "-o", "%T"]));
            if String::from_utf8_lossy(&out.stdout).trim() == "idle" {
                return Ok(cluster);
            }
            if t.elapsed() > Duration::from_secs(30) {
                let log = std::fs::read_to_string(cluster.dir.join("ctld.log")).unwrap_or_default();
                panic!("the Slurm node never became idle:\n{log}");
            }
            std::thread::sleep(Duration::from_millis(200));
        }
    }

    /// Runs `cmd` against this cluster with no rendezvous variable set, bounded by 120 s.
    fn run(&self, cmd: &mut Command) -> Output {
        for var in [
            "STRATA_ROOT",
            "MASTER_ADDR",
            "MASTER_PORT",
            "STRATA_PORT",
            "RANK",
        ] {
            cmd.env_remove(var);
        }
        let child = cmd
            .env("SLURM_CONF", &self.conf)
            .env("STRATA_SOCKET_IFNAME", "=lo")
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let pid = child.id() as libc::pid_t;
        let (done, wait) = std::sync::mpsc::channel();
        let waiter = std::thread::spawn(move || {
            let out = child.wait_with_output().unwrap();
            let _ = done.send(());
            out
        });
        if wait.recv_timeout(Duration::from_secs(120)).is_err() {
            // SAFETY: the child this call started.
            unsafe { libc::kill(pid, libc::SIGKILL) };
        }
        waiter.join().unwrap()
    }
}

impl Drop for Cluster {
    fn drop(&mut self) {
        let _ = Command::new("scancel")
            .env("SLURM_CONF", &self.conf)
            .arg("--full")
            .arg("--user=root")
            .output();
        for d in &mut self.daemons {
            let _ = d.kill();
            let _ = d.wait();
        }
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn text(out: &Output) -> String {
    format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    )
}

fn collbench() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_collbench"))
}

/// A sweep's report says every value was right, once (only rank 0 prints the table).
fn assert_all_right(what: &str, out: &Output) {
    let text = text(out);
    assert!(out.status.success(), "{what}:\n{text}");
    assert_eq!(
        text.matches("Out of bounds values : 0 OK").count(),
        1,
        "{what}:\n{text}"
    );
}

#[test]
fn collbench_status_asks_a_running_step_from_a_step_of_its_own() {
    let name = "collbench_status_asks_a_running_step_from_a_step_of_its_own";
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) => return common::skip(name, &why),
    };
    // Step 0 runs a long sweep; step 1 (overlapping) asks it, with no variable set by hand.
    // Slurm numbers steps as they register, so the asking step starts once step 0 is listed:
    // started at once, it took number 0 itself in about a third of the runs.
    let script = cluster.dir.join("status.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\nsrun -n 2 {bin} -b 8 -e 8 -n 100000000 -w 1 \
             >step0.out 2>&1 &\npid=$!\n\
             for i in $(seq 1 100); do\n\
             squeue --steps --noheader --format=%i | grep -q '\\.0$' && break\n\
             sleep 0.1\ndone\n\
             for i in $(seq 1 100); do\n\
             srun --overlap -n 1 {bin} status --json --within 3 --step 0 > status.json 2>status.err && break\n\
             sleep 0.2\ndone\nkill $pid\nwait\ncat status.json status.err step0.out\n",
            bin = collbench().display()
        ),
    )
    .unwrap();
    let out = cluster.run(
        Command::new("salloc")
            .args(["-n", "2", "-O", "sh"])
            .arg(&script)
            .current_dir(&cluster.dir),
    );
    let text = text(&out);
    let json = text.find('{').map(|i| &text[i..]).unwrap_or_default();
    let view: serde_json::Value = serde_json::Deserializer::from_str(json)
        .into_iter()
        .next()
        .and_then(Result::ok)
        .unwrap_or_else(|| panic!("no view:\n{text}"));
    assert_eq!(view["nranks"], 2, "{text}");
    assert_eq!(view["ranks"].as_array().unwrap().len(), 2, "{text}");
    assert!(view["job"].as_str().unwrap().ends_with(".0"), "{text}");
}

#[test]
fn collbench_joins_under_srun_salloc_and_sbatch_with_no_rendezvous_variable() {
    let name = "collbench_joins_under_srun_salloc_and_sbatch_with_no_rendezvous_variable";
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) => return common::skip(name, &why),
    };
    let sweep = ["-b", "8", "-e", "1M", "-f", "8", "-n", "5", "-w", "1"];
    let srun = cluster.run(
        Command::new("srun")
            .args(["-n", "4", "-O"])
            .arg(collbench())
            .args(sweep),
    );
    assert_all_right("srun -n 4 -O", &srun);
    let salloc = cluster.run(
        Command::new("salloc")
            .args(["-n", "3", "-O", "srun"])
            .arg(collbench())
            .args(sweep),
    );
    assert_all_right("salloc -n 3 -O srun", &salloc);
    let script = cluster.dir.join("job.sh");
    std::fs::write(
        &script,
        format!(
            "#!/bin/sh\n#SBATCH -n 2\nsrun {} {}\n",
            collbench().display(),
            sweep.join(" ")
        ),
    )
    .unwrap();
    let log = cluster.dir.join("job.out");
    let sbatch = cluster.run(
        Command::new("sbatch")
            .arg("--wait")
            .arg("-o")
            .arg(&log)
            .arg(&script),
    );
    assert!(sbatch.status.success(), "sbatch:\n{}", text(&sbatch));
    let job = std::fs::read_to_string(&log).unwrap();
    assert_eq!(
        job.matches("Out of bounds values : 0 OK").count(),
        1,
        "sbatch:\n{job}"
    );
}

/// The collbench processes of Slurm task `task` (by the task's SLURM_PROCID).
fn task_pids(task: usize) -> Vec<libc::pid_t> {
    let want = format!("SLURM_PROCID={task}");
    let exe = collbench().canonicalize().unwrap();
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .filter_map(|e| e.ok()?.file_name().to_str()?.parse::<libc::pid_t>().ok())
        .filter(|pid| {
            std::fs::read_link(format!("/proc/{pid}/exe")).is_ok_and(|p| p == exe)
                && std::fs::read(format!("/proc/{pid}/environ"))
                    .is_ok_and(|env| env.split(|&b| b == 0).any(|v| v == want.as_bytes()))
        })
        .collect()
}

#[test]
fn a_task_killed_mid_step_ends_the_step_with_its_name() {
    let name = "a_task_killed_mid_step_ends_the_step_with_its_name";
    let cluster = match Cluster::start() {
        Ok(c) => c,
        Err(why) => return common::skip(name, &why),
    };
    let killer = std::thread::spawn(|| {
        let t = Instant::now();
        while t.elapsed() < Duration::from_secs(60) {
            let pids = task_pids(2);
            if !pids.is_empty() {
                std::thread::sleep(Duration::from_secs(2)); // into the sweep
                for pid in pids {
                    // SAFETY: a collbench task this test's step started.
                    unsafe { libc::kill(pid, libc::SIGKILL) };
                }
                return true;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        false
    });
    let out = cluster.run(
        Command::new("srun")
            .args(["-n", "4", "-O"])
            .arg(collbench())
            .args(["-b", "16M", "-e", "16M", "-n", "100000", "-w", "1"]),
    );
    assert!(killer.join().unwrap(), "task 2 never started");
    let text = text(&out);
    assert!(!out.status.success(), "{text}");
    for survivor in [0, 1, 3] {
        let line = text
            .lines()
            .find(|l| l.starts_with(&format!("collbench: rank {survivor}: ")))
            .unwrap_or_else(|| panic!("rank {survivor} said nothing:\n{text}"));
        assert!(
            line.contains("rank 2 (host") && line.contains("exited or was killed"),
            "{line}\n{text}"
        );
    }
}
