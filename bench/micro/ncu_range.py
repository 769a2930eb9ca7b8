"""The part every bench/micro/*_profile.py script shares: load this library from --lib, and run
each subject's one profiled call inside its own cudaProfilerStart / Stop range, for

    ncu --profile-from-start off --set full -o OUT python3 bench/micro/<op>_profile.py --lib L

Each subject runs three warm-up calls first (cuDNN-FE compiles on its first)."""
from __future__ import annotations

import os
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def load_library(lib: str):
    """torch.ops.sparse_attention from the library file `lib`."""
    os.environ["SPARSE_ATTENTION_LIBRARY"] = str(Path(lib).resolve())
    sys.path.insert(0, str(ROOT / "python"))
    import torch  # noqa: PLC0415

    import sparse_attention  # noqa: PLC0415,F401
    return torch.ops.sparse_attention


def profile(subjects):
    """subjects: (name, callable) pairs; one profiled call each, after three warm-up calls."""
    import torch  # noqa: PLC0415
    for name, fn in subjects:
        for _ in range(3):
            fn()
        torch.cuda.synchronize()
        print(f"profiling {name}", flush=True)
        torch.cuda.profiler.start()
        fn()
        torch.cuda.synchronize()
        torch.cuda.profiler.stop()
