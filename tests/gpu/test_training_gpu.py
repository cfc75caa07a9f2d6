"""Training cells on a real GPU: short runs of the small Llama with the SDPA default and our
kernel start from the same loss, learn, and read the NVML energy counter at every
evaluation (monotone, positive, the power it implies plausible for the device)."""
from __future__ import annotations

import copy
import math

import pytest

from flashwatt.config import load_config
from flashwatt.models.presets import model_spec
from flashwatt.training.cell import TrainCell
from flashwatt.training.data import prepare_data
from flashwatt.training.job import run_train_cell
from flashwatt.training.suite import training_runs, training_section
from flashwatt.training.summary import STEP0_TOLERANCE
from support import synthetic_corpus

pytestmark = pytest.mark.gpu


@pytest.fixture(scope="module")
def spec(tmp_path_factory):
    root = tmp_path_factory.mktemp("training")
    config = load_config()
    config["suites"]["training_smoke"]["training"]["data"]["corpus"] = str(synthetic_corpus(root / "corpus"))
    section = training_section(config, "training_smoke")
    section["cache"] = str(root / "cache")
    manifest = root / "data.json"
    prepare_data(section, "training_smoke", manifest)
    base = copy.deepcopy(next(iter(training_runs(config, "training_smoke").values())))
    # a small corpus: 64-token windows, four of them to validate on
    return {**base, "data": str(manifest), "cache": section["cache"], "model": model_spec("llama_small"),
            "evaluation": {"evals": 4, "validation_windows": 4}, "measure": {"energy": True}}


def test_backends_start_alike_learn_and_measure_energy(spec):
    records = {}
    for backend in ("sdpa_default", "custom"):
        cell = TrainCell("training_smoke", "llama_small", backend, "bf16", "adamw", "cosine", 2e-3, 0.0, 0.1, 16, 64,
                         16 * 64 * 200, 0)
        record = run_train_cell(cell, spec).record
        assert record["status"] == "ok", record.get("traceback") or record.get("reason")
        records[backend] = record
        curve = record["curve"]
        assert curve[-1]["val_loss"] < curve[0]["val_loss"] - 1.0
        energies = [row["energy_j"] for row in curve]
        assert all(e is not None for e in energies) and energies == sorted(energies) and energies[-1] > 0
        watts = record["energy"]["mean_power_w"]
        assert 30 < watts < 1.2 * 1000, watts  # between an idle GPU and above any board's limit
        assert record["check"]["passed"]
    start = [r["final"]["initial_val_loss"] for r in records.values()]
    assert abs(start[0] - start[1]) <= STEP0_TOLERANCE["bf16"], start
    assert all(math.isfinite(s) for s in start)
