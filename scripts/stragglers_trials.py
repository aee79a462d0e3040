#!/usr/bin/env python3
"""Trials of straggler naming on this host: `collbench --np N` all-reducing one size, rank 2
stopped for STOP ms of every PERIOD ms (SIGSTOP/SIGCONT: half speed) from 1 s after its start;
a trial ends when the first rank names someone (a `warn` line, STRATA_LOG=warn) or after
--limit seconds. With --clean S, the same jobs run S seconds untouched and must name no one.

  scripts/stragglers_trials.py [--trials 10] [--ranks 3,4] [--cycles 25/50,50/100,100/200]
                               [--size 64K] [--limit 10] [--clean SECONDS]

Prints one line per layout and cycle: named in how many trials, the median and worst time
to the first name, and any rank named that is not rank 2. Exits non-zero when a trial misses.
"""
import argparse
import os
import re
import signal
import statistics
import subprocess
import sys
import threading
import time

VICTIM = 2
ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
NAMED = re.compile(r"rank (\d+) \(host .*\) is a straggler")


def rank_pid(launcher, rank, limit=20.0):
    """The pid of `rank`, a child of `launcher` (by its STRATA_COLLBENCH_RANK)."""
    want = f"STRATA_COLLBENCH_RANK={rank}".encode()
    end = time.monotonic() + limit
    while time.monotonic() < end:
        for d in filter(str.isdigit, os.listdir("/proc")):
            try:
                stat = open(f"/proc/{d}/stat").read()
                env = open(f"/proc/{d}/environ", "rb").read().split(b"\0")
            except OSError:
                continue
            if int(stat.rsplit(")", 1)[1].split()[1]) == launcher and want in env:
                return int(d)
        time.sleep(0.05)
    return None


def trial(exe, ranks, size, stop_ms, period_ms, limit):
    """One run: (seconds from the first stop to the first name or None, ranks named)."""
    env = dict(os.environ, STRATA_LOG="warn", STRATA_SOCKET_IFNAME="=lo")
    job = subprocess.Popen(
        [exe, "--np", str(ranks), "-b", size, "-e", size, "-n", "100000000", "-w", "1",
         "--timeout", str(limit + 60)],
        stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env, text=True)
    first, named = [None], set()

    def read():
        for line in job.stderr:
            m = NAMED.search(re.sub(r"\x1b\[[0-9;]*m", "", line))
            if m:
                named.add(int(m.group(1)))
                if first[0] is None:
                    first[0] = time.monotonic()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    victim = rank_pid(job.pid, VICTIM)
    try:
        if victim is None:
            raise RuntimeError(f"rank {VICTIM} never started")
        time.sleep(1.0)
        start = time.monotonic()
        while time.monotonic() - start < limit and first[0] is None:
            if stop_ms == 0:
                time.sleep(0.1)
                continue
            os.kill(victim, signal.SIGSTOP)
            time.sleep(stop_ms / 1000)
            os.kill(victim, signal.SIGCONT)
            time.sleep((period_ms - stop_ms) / 1000)
    finally:
        if victim is not None:
            try:
                os.kill(victim, signal.SIGCONT)
            except ProcessLookupError:
                pass
        job.terminate()  # the launcher ends its ranks
        try:
            job.wait(10)
        except subprocess.TimeoutExpired:
            job.kill()
            job.wait()
        reader.join(5)
    took = None if first[0] is None else first[0] - start
    return took, named


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--ranks", default="3,4")
    ap.add_argument("--cycles", default="25/50,50/100,100/200")
    ap.add_argument("--size", default="64K")
    ap.add_argument("--limit", type=float, default=10.0)
    ap.add_argument("--clean", type=float, default=0.0, help="seconds of each clean run")
    a = ap.parse_args()
    subprocess.run(["cargo", "build", "--release", "-q", "--bin", "collbench"], cwd=ROOT, check=True)
    exe = os.path.join(ROOT, "target/release/collbench")
    cycles = [(0, 0)] if a.clean else [tuple(map(int, c.split("/"))) for c in a.cycles.split(",")]
    limit = a.clean or a.limit
    ok = True
    for ranks in map(int, a.ranks.split(",")):
        for stop_ms, period_ms in cycles:
            times, wrong, missed = [], set(), 0
            for _ in range(a.trials):
                took, named = trial(exe, ranks, a.size, stop_ms, period_ms, limit)
                wrong |= named - ({VICTIM} if stop_ms else set())
                if stop_ms and took is None:
                    missed += 1
                elif took is not None:
                    times.append(took)
            if a.clean:
                good = a.trials - len(times)
                print(f"{ranks} ranks, {a.size}, clean {limit:.0f} s: no one named in {good} of "
                      f"{a.trials}" + (f"; named {sorted(wrong)}" if wrong else ""), flush=True)
                ok &= not times
            else:
                span = (f"median {statistics.median(times):.1f} s, worst {max(times):.1f} s"
                        if times else "")
                print(f"{ranks} ranks, {a.size}, rank {VICTIM} stopped {stop_ms}/{period_ms} ms: "
                      f"named within {limit:.0f} s in {len(times)} of {a.trials} ({span})"
                      + (f"; also named {sorted(wrong)}" if wrong else ""), flush=True)
                ok &= missed == 0 and not wrong
    sys.exit(0 if ok else 1)


if __name__ == "__main__":
    main()
