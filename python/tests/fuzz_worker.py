"""One batch of fuzz cases in its own process (test_fuzz.py starts it), so that a crash ends this
process and fails the batch instead of the whole test run.

    python fuzz_worker.py --kind api --device cpu --seed 123 --cases 250 --log /tmp/case.json
    python fuzz_worker.py --replay '<case json>' [--kind api] [--device cpu]

Hypothesis draws the cases (fuzz_cases.py) from --seed. Each case is written to --log before it
runs (so after a crash the log names the case that was running) and counted. On success the last
line of stdout is a JSON summary: {"cases": N, "outcomes": {"ok": .., "error": .., ...}}. A wrong
answer or a wrong error fails the batch with Hypothesis's shrunk example and exit status 1.
"""

import argparse
import json
import os
import signal
import sys
from collections import Counter

import fuzz_cases
import torch
from hypothesis import HealthCheck, Phase, given, seed, settings

# Tiny tensors: one thread is fastest, and batches run side by side.
torch.set_num_threads(1)


def run_batch(kind: str, device: str, batch_seed: int, cases: int, log: str) -> Counter:
    outcomes: Counter = Counter()
    run = fuzz_cases.RUNNERS[kind]
    crash_at = int(os.environ.get("SA_FUZZ_SELFTEST_CRASH", "-1"))  # test_fuzz's own check

    @seed(batch_seed)
    @settings(max_examples=cases, deadline=None, database=None, derandomize=False,
              phases=(Phase.generate, Phase.shrink), suppress_health_check=list(HealthCheck),
              print_blob=False)
    @given(case=fuzz_cases.STRATEGIES[kind](device))
    def one(case):
        if log:
            with open(log, "w") as f:
                json.dump(case, f)
        if sum(outcomes.values()) == crash_at:
            os.kill(os.getpid(), signal.SIGSEGV)
        outcomes[run(case, device)] += 1

    one()
    return outcomes


def main() -> int:
    p = argparse.ArgumentParser()
    p.add_argument("--kind", choices=sorted(fuzz_cases.RUNNERS), default="api")
    p.add_argument("--device", choices=["cpu", "cuda"], default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--cases", type=int, default=100)
    p.add_argument("--log", default="")
    p.add_argument("--replay", default="", help="one case (JSON) to run again")
    a = p.parse_args()
    if a.replay:
        case = json.loads(a.replay)
        print(json.dumps({"replayed": fuzz_cases.RUNNERS[a.kind](case, a.device)}))
        return 0
    outcomes = run_batch(a.kind, a.device, a.seed, a.cases, a.log)
    sys.stdout.flush()
    print(json.dumps({"cases": sum(outcomes.values()), "outcomes": dict(outcomes)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
