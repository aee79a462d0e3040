"""Faults on the strata backend become Python exceptions that name the rank, host and call.

    python check_errors.py            launches every scenario below on 2 local processes

Each scenario starts its own processes (env:// rendezvous on a free loopback port) and checks
what every rank saw:

* mismatch: rank 0 all-reduces 10 floats while rank 1 all-reduces 11; both must raise a
  DistBackendError describing the two calls.
* dead: rank 1 exits without a word after init; rank 0's all_reduce must raise, naming rank 1
  and its host, well within the group's timeout.
* hung: rank 1 stops calling (sleeps 8 s); with the group's timeout at 3 s, rank 0's all_reduce
  must raise within seconds and name rank 1 (the group's timeout is honoured).

Exit status 0 means every scenario behaved so.
"""

import os
import socket
import subprocess
import sys
import time
from datetime import timedelta

WORLD = 2
SCENARIOS = ("mismatch", "dead", "hung")


def rank_main(scenario):
    import torch
    import torch.distributed as dist

    import strata_torch  # noqa: F401

    rank = int(os.environ["RANK"])
    timeout = timedelta(seconds=3 if scenario == "hung" else 60)
    dist.init_process_group("strata", timeout=timeout)
    x = torch.ones(10)
    dist.all_reduce(x)  # a healthy call first
    if scenario == "dead" and rank == 1:
        os._exit(7)
    if scenario == "hung" and rank == 1:
        time.sleep(8)
        os._exit(0)
    n = 11 if (scenario == "mismatch" and rank == 1) else 10
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(n))
    except dist.DistBackendError as e:
        print(f"RAISED after {time.monotonic() - t0:.2f} s: {e}", flush=True)
        os._exit(0)  # the communicator is faulted; leave without a teardown handshake
    print("NO ERROR", flush=True)
    os._exit(1)


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def launch(scenario):
    env = dict(os.environ, MASTER_ADDR="127.0.0.1", MASTER_PORT=str(free_port()), WORLD_SIZE=str(WORLD))
    env.setdefault("STRATA_SOCKET_IFNAME", "=lo")
    procs = [
        subprocess.Popen(
            [sys.executable, __file__, "--rank", scenario],
            env=dict(env, RANK=str(r), LOCAL_RANK=str(r)),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(WORLD)
    ]
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=90)
        except subprocess.TimeoutExpired:
            p.kill()
            out = p.communicate()[0] + "\n(killed after 90 s)"
        outs.append((p.returncode, out))
    return outs


def raised(out):
    lines = [line for line in out.splitlines() if line.startswith("RAISED")]
    return lines[0] if lines else None


def main():
    host = socket.gethostname()
    failures = []
    for scenario in SCENARIOS:
        outs = launch(scenario)
        print(f"== {scenario}")
        for r, (code, out) in enumerate(outs):
            print(f"rank {r} exit {code}: {raised(out) or out.strip()[-600:]}")
        first = raised(outs[0][1])
        if scenario == "mismatch":
            for r, (code, out) in enumerate(outs):
                line = raised(out)
                if code != 0 or not line or "11" not in line or "10" not in line:
                    failures.append(f"mismatch: rank {r} did not raise an error naming both counts")
        else:
            want_code = 7 if scenario == "dead" else 0
            limit = 30.0 if scenario == "dead" else 15.0
            if outs[1][0] != want_code:
                failures.append(f"{scenario}: rank 1 exited {outs[1][0]}, not {want_code}")
            if not first or "rank 1" not in first or (scenario == "dead" and host not in first):
                failures.append(f"{scenario}: rank 0's error does not name rank 1 (and its host {host})")
            elif float(first.split()[2]) > limit:
                failures.append(f"{scenario}: rank 0 raised only after {first.split()[2]} s (limit {limit} s)")
    for f in failures:
        print("FAILED", f)
    print(f"{len(SCENARIOS) - len({f.split(':')[0] for f in failures})} passed, {len({f.split(':')[0] for f in failures})} failed")
    return 1 if failures else 0


if __name__ == "__main__":
    if len(sys.argv) == 3 and sys.argv[1] == "--rank":
        rank_main(sys.argv[2])
    else:
        sys.exit(main())
