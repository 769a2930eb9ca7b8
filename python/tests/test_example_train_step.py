"""python/examples/dsa_train_step.py runs: the KL loss falls in the dense warm-up and in the
sparse stage, and every parameter's gradient matches the eager PyTorch implementation of the same
layer (CPU, the library's reference)."""

import importlib.util
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "dsa_train_step.py"


def _load():
    if not EXAMPLE.is_file():
        pytest.skip("python/examples/dsa_train_step.py not found (an installed copy of the tests?)")
    spec = importlib.util.spec_from_file_location("dsa_train_step", EXAMPLE)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_training_step_kl_falls_and_gradients_match_eager():
    h = _load().train(steps=8, check=True, log=lambda *a: None)
    for stage in ("dense", "sparse"):
        kl = h[stage + "_kl"]
        assert kl[-1] < 0.7 * kl[0], (stage, kl)
        errors = h["grad_error"][stage]
        assert len(errors) == 9  # every parameter of the layer
        assert max(errors.values()) < 1e-4, (stage, errors)
    assert h["task"][-1] < h["task"][0]


def test_main_reports_ok(capsys):
    assert _load().main(["--steps", "4"]) == 0
    assert capsys.readouterr().out.strip().endswith("OK")
