//! `collbench status`: the live view of a running job, asked from outside it.

use std::process::ExitCode;
use std::time::Duration;
use strata::Communicator;

/// `collbench status`'s flags.
#[derive(clap::Args, Debug, Clone)]
pub(super) struct StatusArgs {
    /// The job's bootstrap root, host:port (default: as the ranks find it, from STRATA_ROOT,
    /// MASTER_ADDR with STRATA_PORT or MASTER_PORT + 1, or the Slurm step). The job's secret
    /// is STRATA_SECRET, else derived from the launcher's job ids and the root, as the ranks
    /// derive it.
    #[arg(long)]
    root: Option<String>,
    /// Under Slurm, from a step of its own (`srun --overlap --jobid J collbench status`): the
    /// id of the job's step to ask, whose root and secret derive from it (its first node is
    /// taken as the job's first node).
    #[arg(long)]
    step: Option<String>,
    /// How long the job's ranks have to answer, seconds; those that do not are named silent.
    #[arg(long, default_value_t = 1.0)]
    within: f64,
    /// Print the view as JSON.
    #[arg(long)]
    json: bool,
    /// Ask again every this many seconds until interrupted (or --count views).
    #[arg(long)]
    watch: Option<f64>,
    /// With --watch: stop after this many views.
    #[arg(long)]
    count: Option<usize>,
}

/// Asks the job once (or every `--watch` seconds): exits 0 when nobody holds the job up, 3
/// when a rank is silent or others wait on it, 1 when the job cannot be asked.
pub(super) fn status_main(a: &StatusArgs) -> ExitCode {
    if !(a.within > 0.0 && a.within.is_finite()) {
        eprintln!("collbench status: --within must be a positive number of seconds");
        return ExitCode::FAILURE;
    }
    if let Some(step) = &a.step {
        let Ok(nodes) = std::env::var("SLURM_JOB_NODELIST") else {
            eprintln!("collbench status: --step is for a Slurm job (SLURM_JOB_NODELIST is unset)");
            return ExitCode::FAILURE;
        };
        // SAFETY: single-threaded at this point; only this process reads them.
        unsafe {
            std::env::set_var("SLURM_STEP_ID", step);
            std::env::set_var("SLURM_STEP_NODELIST", nodes);
            std::env::remove_var("SLURM_STEP_RESV_PORTS");
        }
    }
    let mut views = 0usize;
    loop {
        let code =
            match Communicator::job_status(a.root.as_deref(), Duration::from_secs_f64(a.within)) {
                Ok(s) => {
                    if a.json {
                        match serde_json::to_string_pretty(&s) {
                            Ok(j) => println!("{j}"),
                            Err(e) => eprintln!("collbench status: {e}"),
                        }
                    } else {
                        print!("{}", s.render_text());
                    }
                    if s.holding_up.is_empty() && s.silent.is_empty() {
                        ExitCode::SUCCESS
                    } else {
                        ExitCode::from(3)
                    }
                }
                Err(e) => {
                    eprintln!("collbench status: {e}");
                    ExitCode::FAILURE
                }
            };
        views += 1;
        let Some(every) = a.watch.filter(|w| *w > 0.0) else {
            return code;
        };
        if a.count.is_some_and(|c| views >= c) {
            return code;
        }
        std::thread::sleep(Duration::from_secs_f64(every));
    }
}
