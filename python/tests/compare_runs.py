"""Compares two training runs written by ddp_train.py: parameters and step times.

    python compare_runs.py DIR strata gloo [--rtol 1e-5] [--loss-rtol 0.02]

Prints each run's median step time and loss side by side and the largest relative difference
between their final parameters (per tensor, |a - b| / max|b|); exits 1 if it exceeds --rtol,
or where --loss-rtol is given, if the final losses differ by more than that (relative to b's).
The parameters of two runs agree only where both sum each gradient in nearly the same order:
a ReLU network turns a last-bit difference into a flipped activation, and 300 steps of SGD
carry it on (3.9e-2 between strata and Gloo once strata's near-tie trials switched algorithms,
2.4e-7 with ring fixed). Where the order may differ, compare the losses instead.
"""

import argparse
import json
import pathlib
import sys

import torch


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("dir")
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--rtol", type=float, default=1e-5)
    ap.add_argument("--loss-rtol", type=float, default=None)
    args = ap.parse_args()
    d = pathlib.Path(args.dir)
    runs = {tag: json.loads((d / f"{tag}.json").read_text()) for tag in (args.a, args.b)}
    for tag, r in runs.items():
        print(f"{tag:>12}: {r['world']} processes, {r['steps']} steps, median step {r['median_step_s'] * 1e3:.2f} ms, loss {r['first_loss']:.4f} -> {r['last_loss']:.4f}")
    ta, tb = runs[args.a]["median_step_s"], runs[args.b]["median_step_s"]
    print(f"step time {args.b}/{args.a}: {tb / ta:.2f}")
    pa, pb = torch.load(d / f"{args.a}.pt"), torch.load(d / f"{args.b}.pt")
    if pa.keys() != pb.keys():
        print(f"the runs have different parameters: {sorted(pa)} vs {sorted(pb)}")
        return 1
    worst = max(((pa[k] - pb[k]).abs().max() / pb[k].abs().max().clamp_min(1e-30)).item() for k in pa)
    print(f"largest relative parameter difference: {worst:.3g} (limit {args.rtol:g})")
    if runs[args.a]["last_loss"] > 0.8 * runs[args.a]["first_loss"]:
        print("the model did not learn: the check would prove nothing")
        return 1
    if args.loss_rtol is not None:
        la, lb = runs[args.a]["last_loss"], runs[args.b]["last_loss"]
        apart = abs(la - lb) / lb
        print(f"final losses {la:.4f} and {lb:.4f}: {apart:.2g} apart (limit {args.loss_rtol:g})")
        return 0 if apart <= args.loss_rtol else 1
    return 0 if worst <= args.rtol else 1


if __name__ == "__main__":
    sys.exit(main())
