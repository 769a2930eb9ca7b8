"""bench/cp_overlap.py --smoke (issue 36's one-GPU overlap benchmark) on the CPU: gloo at world
size 1, tiny shapes, every op and mode; each mode's outputs and gradients equal the
single-device call's (the script exits non-zero otherwise) and the records are complete."""

import json
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

SCRIPT = Path(__file__).resolve().parents[2] / "bench" / "cp_overlap.py"

pytestmark = pytest.mark.skipif(not dist.is_available() or not dist.is_gloo_available(),
                                reason="torch.distributed with gloo is not available")


def test_cp_overlap_smoke(tmp_path):
    proc = subprocess.run([sys.executable, str(SCRIPT), "--smoke", "--rounds", "1",
                           "--out", str(tmp_path)], capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    records = json.loads((tmp_path / "cp_overlap.json").read_text())
    got = {(r["op"], r["mode"]) for r in records}
    ops = ("dsa", "indexer_topk", "indexer_loss", "bsa")
    modes = ("single", "cp", "cp_sizes", "cp_issued", "cp_prefetch")
    assert got == {(o, m) for o in ops for m in modes} | {("collectives", "exchange"),
                                                           ("collectives", "gather_issued")}
    for r in records:
        assert r["ms"] > 0 and r["backend"] == "gloo"
        if r["op"] != "collectives":
            assert r["max_rel_l2_vs_single"] == 0.0
            want_one = r["mode"] == "single"
            assert r["ratio_vs_single"] == 1.0 if want_one else r["ratio_vs_single"] > 0
