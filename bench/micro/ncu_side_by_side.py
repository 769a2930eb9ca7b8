#!/usr/bin/env python3
"""Nsight Compute's details page (`ncu --import R --page details --csv`) as one table: a row per
metric, a column per profiled kernel (the longest N by duration), for reading two kernels'
profiles side by side (bench/micro/dsa_bwd_profile.py profiles ours and cuDNN-FE's).

    python3 bench/micro/ncu_side_by_side.py details.csv [--top 2] [--sections S1,S2]
"""
import argparse
import csv
import sys
from collections import OrderedDict

ap = argparse.ArgumentParser()
ap.add_argument("csv")
ap.add_argument("--top", type=int, default=2, help="the N longest kernels")
ap.add_argument("--sections", default="", help="comma list of section names to keep")
args = ap.parse_args()

rows = list(csv.DictReader(l for l in open(args.csv) if l.startswith('"')))
kernels = OrderedDict()
for r in rows:
    kid = r["ID"]
    k = kernels.setdefault(kid, {"name": r["Kernel Name"], "m": OrderedDict()})
    k["m"][(r["Section Name"], r["Metric Name"], r["Metric Unit"])] = r["Metric Value"]


def duration_us(k):
    for (sec, name, unit), v in k["m"].items():
        if name == "Duration":
            x = float(v.replace(",", ""))
            scale = {"nsecond": 1e-3, "ns": 1e-3, "msecond": 1e3, "ms": 1e3, "second": 1e6,
                     "s": 1e6}
            return x * scale.get(unit, 1.0)
    return 0.0


top = sorted(kernels.items(), key=lambda kv: -duration_us(kv[1]))[:args.top]
keep = set(s.strip() for s in args.sections.split(",") if s.strip())
print("kernels:")
for kid, k in top:
    print(f"  [{kid}] {duration_us(k):.1f} us  {k['name'][:110]}")
keys = OrderedDict()
for _, k in top:
    for key in k["m"]:
        keys[key] = None
w = sys.stdout.write
last = None
for sec, name, unit in keys:
    if keep and sec not in keep:
        continue
    if sec != last:
        w(f"\n## {sec}\n")
        last = sec
    vals = [k["m"].get((sec, name, unit), "") for _, k in top]
    w(f"{name[:48]:48s} {unit[:12]:12s} " + " ".join(f"{v:>16s}" for v in vals) + "\n")
