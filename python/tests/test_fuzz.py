"""The fuzz suite (issue #37): no input crashes the library or gets a silently wrong answer.

Hypothesis draws calls (fuzz_cases.py: shapes, dtypes, strides, metadata values, scalar options,
at most one deliberate fault) and checks each against an independent fp64 implementation of SPEC
(fuzz_oracle.py) or against the named error it must raise:
  * api: the Python API, forward and backward, on CPU tensors (the fp64 reference), or on CUDA
    tensors with SA_FUZZ_DEVICE=cuda (scripts/gpu_suite.sh's fuzz step);
  * abi: the C ABI through ctypes, with adversarial raw struct fields;
  * cli: random huge, negative and garbage values for the flags of `sparse-attention demo`.
Cases run in batches, each batch in its own process (fuzz_worker.py): a crash fails its batch and
names the case that was running (replayed alone to confirm), never the test run.

Environment: SA_FUZZ_CASES (api + abi cases, default 2000), SA_FUZZ_SEED (default: a new seed per
run, printed on failure), SA_FUZZ_JOBS (batches at once, default min(2, CPUs)), SA_FUZZ_BATCH
(cases per batch, default 250), SA_FUZZ_CLI_CASES (default 40), SA_FUZZ_DEVICE (cpu or cuda),
SA_CLI (the sparse-attention binary; default build/sparse-attention).
"""

import json
import os
import random
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch
from conftest import cli_binary, needs_cli

pytest.importorskip("hypothesis")
from hypothesis import HealthCheck, Phase, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

HERE = Path(__file__).resolve().parent
DEVICE = os.environ.get("SA_FUZZ_DEVICE", "cpu")
TOTAL = int(os.environ.get("SA_FUZZ_CASES", "2000"))
JOBS = int(os.environ.get("SA_FUZZ_JOBS", str(min(2, os.cpu_count() or 1))))
BATCH = int(os.environ.get("SA_FUZZ_BATCH", "250"))
SEED = int(os.environ.get("SA_FUZZ_SEED", random.SystemRandom().randrange(2**31)))
CLI_CASES = int(os.environ.get("SA_FUZZ_CLI_CASES", "40"))
BATCH_TIMEOUT = 900

needs_device = pytest.mark.skipif(DEVICE == "cuda" and not torch.cuda.is_available(),
                                  reason="SA_FUZZ_DEVICE=cuda needs a CUDA device")


def _worker(kind, seed, cases, log, replay=None):
    cmd = [sys.executable, str(HERE / "fuzz_worker.py"), "--kind", kind, "--device", DEVICE]
    if replay is not None:
        cmd += ["--replay", replay]
    else:
        cmd += ["--seed", str(seed), "--cases", str(cases), "--log", log]
    return cmd


def _tail(text, n=60):
    """The last n lines, after the lines that name the failure (a long shrunk case would push
    them out of the tail)."""
    lines = text.splitlines()
    named = [l for l in lines[:-n] if "CaseFailure" in l or l.lstrip().startswith("case: ")]
    return "\n".join(named + lines[-n:])


def run_batches(kind, total):
    """Runs `total` cases of `kind` in batches, JOBS at a time. Returns (cases run, outcome
    counts, failure reports)."""
    plan = []
    left, i = total, 0
    while left > 0:
        n = min(BATCH, left)
        plan.append((SEED * 1000 + i, n))
        left, i = left - n, i + 1
    tmp = tempfile.mkdtemp(prefix="sa_fuzz_")
    running, done = [], []
    while plan or running:
        while plan and len(running) < JOBS:
            seed, n = plan.pop(0)
            log = os.path.join(tmp, "case_%d.json" % seed)
            out = open(os.path.join(tmp, "out_%d.txt" % seed), "w+")
            proc = subprocess.Popen(_worker(kind, seed, n, log), stdout=out,
                                    stderr=subprocess.STDOUT, cwd=HERE)
            running.append((proc, seed, n, log, out, time.time()))
        time.sleep(0.05)
        for r in list(running):
            proc, seed, n, log, out, start = r
            if proc.poll() is None and time.time() - start < BATCH_TIMEOUT:
                continue
            if proc.poll() is None:
                proc.kill()
                proc.wait()
            running.remove(r)
            out.seek(0)
            done.append((proc.returncode, seed, n, log, out.read()))
            out.close()
    cases, outcomes, failures = 0, {}, []
    for rc, seed, n, log, text in done:
        if rc == 0:
            summary = json.loads(text.strip().splitlines()[-1])
            cases += summary["cases"]
            for k, v in summary["outcomes"].items():
                outcomes[k] = outcomes.get(k, 0) + v
            continue
        report = "batch seed %d (%s, %d cases, SA_FUZZ_SEED=%d): exit status %d\n%s" % (
            seed, kind, n, SEED, rc, _tail(text))
        if rc < 0 or rc > 1:  # a signal or an abort: name the case that was running
            case = open(log).read() if os.path.exists(log) else "(no case logged)"
            replay = subprocess.run(_worker(kind, 0, 0, "", replay=case), capture_output=True,
                                    text=True, cwd=HERE, timeout=BATCH_TIMEOUT)
            report += "\ncrashed while running: %s\nreplayed alone: exit status %d\n%s" % (
                case, replay.returncode, _tail(replay.stdout + replay.stderr, 20))
        failures.append(report)
    return cases, outcomes, failures


@needs_device
def test_fuzz_python_api(record_property):
    total = TOTAL if DEVICE == "cuda" else (TOTAL * 7 + 9) // 10
    start = time.time()
    cases, outcomes, failures = run_batches("api", total)
    record_property("fuzz_api", "%d cases in %.1f s: %s" % (cases, time.time() - start, outcomes))
    print("\nfuzz api on %s: %d cases in %.1f s, SA_FUZZ_SEED=%d: %s"
          % (DEVICE, cases, time.time() - start, SEED, outcomes))
    assert not failures, "\n\n".join(failures)
    assert cases >= total
    if DEVICE == "cuda":  # most drawn calls must reach a GPU implementation
        assert outcomes.get("unsupported", 0) < cases // 2, outcomes


@pytest.mark.skipif(DEVICE != "cpu", reason="the C ABI fuzz runs on CPU tensors")
def test_fuzz_c_abi(record_property):
    total = TOTAL - (TOTAL * 7 + 9) // 10
    start = time.time()
    cases, outcomes, failures = run_batches("abi", total)
    record_property("fuzz_abi", "%d cases in %.1f s: %s" % (cases, time.time() - start, outcomes))
    print("\nfuzz abi: %d cases in %.1f s, SA_FUZZ_SEED=%d: %s"
          % (cases, time.time() - start, SEED, outcomes))
    assert not failures, "\n\n".join(failures)
    assert cases >= total


def test_fuzz_harness_names_a_crashing_case(monkeypatch):
    """A worker killed by a signal fails its batch, and the report names the running case."""
    monkeypatch.setenv("SA_FUZZ_SELFTEST_CRASH", "2")
    cases, _, failures = run_batches("api", 4)
    assert len(failures) == 1 and cases == 0
    assert "exit status -11" in failures[0] and "crashed while running: {" in failures[0]
    assert '"op": ' in failures[0] and "replayed alone: exit status 0" in failures[0]


# ---- the command-line tool ----------------------------------------------------------------------
# Flag values: valid small ones per flag, and adversarial ones for any flag.
_SMALL = {
    "--op": ["bsa_fwd", "bsa_bwd", "dsa_fwd", "dsa_bwd", "bsa_fwd,dsa_bwd"],
    "--device": ["cpu"],
    "--dtype": ["bf16", "fp16"],
    "--seed": ["0", "1", "18446744073709551615", "12345678901234"],
    "--repeats": ["1", "3", "2147483647"],
    "--batch": ["1", "2"],
    "--heads": ["1", "2", "3", "4"],
    "--kv-heads": ["1", "2"],
    "--seq": ["1", "7", "64", "65", "130"],
    "--dim": ["1", "8", "16", "64"],
    "--block": ["64", "128", "96", "1", "2147483647"],
    "--density": ["0.1", "0.5", "1", "1e-300", ".5"],
    "--layout": ["bhsd", "bshd"],
    "--dsa-heads": ["1", "2", "16"],
    "--dsa-dqk": ["512", "576", "8", "600"],
    "--dsa-seq": ["1", "8", "64", "300"],
    "--dsa-queries": ["1", "3", "16"],
    "--topk": ["1", "4", "64", "2147483647"],
    "--topk-length": ["on", "off"],
    "--sink": ["on", "off"],
}
_ADVERSARIAL = ["", "-1", "0", "abc", "1e3", "0x10", "9223372036854775807", "9223372036854775808",
                "18446744073709551617", "-9223372036854775808", "2147483648", "4294967296",
                "4294967360", "1152921504606846977", "4611686018427387905", "1099511627776",
                "nan", "inf", "-inf", "1.5", " ", "--op", "on", "all,bsa_fwd", "\u0663"]
_INT_MAX = {"--repeats": 2**31 - 1, "--block": 2**31 - 1, "--dsa-seq": 2**31 - 1,
            "--topk": 2**31 - 1}
_INT_FLAGS = {"--repeats", "--batch", "--heads", "--kv-heads", "--seq", "--dim", "--block",
              "--dsa-heads", "--dsa-dqk", "--dsa-seq", "--dsa-queries", "--topk"}
_CHOICES = {"--device": {"auto", "cpu", "cuda"}, "--dtype": {"bf16", "fp16"},
            "--layout": {"bhsd", "bshd"}, "--topk-length": {"on", "off"},
            "--sink": {"on", "off"}}
_OPS = {"bsa_fwd", "bsa_bwd", "dsa_fwd", "dsa_bwd"}
_C_INT = re.compile(r"^[ \t\n\v\f\r]*[+-]?[0-9]+$")


def _valid(flag, value):
    """Whether the tool's parser takes the value (its rules, written out independently)."""
    if flag in _INT_FLAGS:
        if not _C_INT.match(value):
            return False
        x = int(value.strip())
        return 1 <= x <= _INT_MAX.get(flag, 2**63 - 1)
    if flag == "--seed":
        return bool(_C_INT.match(value)) and not value.startswith("-") and \
            abs(int(value.strip())) < 2**64
    if flag == "--density":
        if value != value.rstrip() or not value.strip():
            return False
        try:
            x = float(value)
        except ValueError:
            return False
        return "_" not in value and 0.0 < x <= 1.0
    if flag == "--op":
        if value == "all":
            return True
        parts = value.split(",")
        if parts and parts[-1] == "":
            parts = parts[:-1]
        return bool(parts) and all(p in _OPS for p in parts)
    return value in _CHOICES[flag]


@st.composite
def cli_case(draw):
    import random as _random

    rng = _random.Random(draw(st.integers(0, 2**62)))
    args, verdict = [], "valid"
    for _ in range(draw(st.integers(0, 5))):
        flag = rng.choice(sorted(_SMALL))
        value = rng.choice(_SMALL[flag]) if rng.random() < 0.6 else rng.choice(_ADVERSARIAL)
        if not _valid(flag, value):
            verdict = "invalid"
        args += [flag + "=" + value] if rng.random() < 0.3 else [flag, value]
    if not any(a.startswith("--op") for a in args):
        args = ["--op", rng.choice(sorted(_OPS))] + args
    if not any(a.startswith("--device") for a in args):
        args = ["--device", "cpu"] + args
    extra = rng.random()
    if extra < 0.05:
        args.append("--bogus")
        verdict = "invalid"
    elif extra < 0.1:
        args.append(rng.choice(sorted(_SMALL)))  # a flag without its value
        verdict = "invalid"
    return {"args": args, "verdict": verdict}


@needs_cli
@pytest.mark.skipif(DEVICE != "cpu", reason="the CLI fuzz runs the CPU demo")
def test_fuzz_cli_flags():
    """Every run of `sparse-attention demo` ends with exit status 0, 1 or 2, never by a signal:
    a value the parser must refuse gives 2 with `error: ...`; small valid values give 0 (every
    check passed) or 2 (a call the library refuses: an unsupported block size, D_qk < d_v)."""
    binary = cli_binary()
    seen = []

    @settings(max_examples=CLI_CASES, deadline=None, database=None,
              phases=(Phase.generate,), suppress_health_check=list(HealthCheck))
    @given(case=cli_case())
    def one(case):
        seen.append(case)
        r = subprocess.run([binary, "demo"] + case["args"], capture_output=True, text=True,
                           timeout=300, errors="replace")
        where = "sparse-attention demo %s" % " ".join(repr(a) for a in case["args"])
        assert r.returncode >= 0, "%s: killed by signal %d\n%s" % (where, -r.returncode,
                                                                   r.stderr[-2000:])
        assert r.returncode in (0, 1, 2), "%s: exit %d" % (where, r.returncode)
        if case["verdict"] == "invalid":
            assert r.returncode == 2 and "error:" in r.stderr, (
                "%s: a bad value must exit 2 with a message, got %d\n%s"
                % (where, r.returncode, r.stderr[-2000:]))
        else:
            assert r.returncode in (0, 2), "%s: a check failed (exit %d)\n%s%s" % (
                where, r.returncode, r.stdout[-3000:], r.stderr[-2000:])
            if r.returncode == 2:
                assert "error:" in r.stderr, where

    one()
    assert len(seen) >= CLI_CASES
