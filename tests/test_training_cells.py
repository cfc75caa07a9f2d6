"""Training cells on the CPU: the cell and its suite, the loop (the loss falls, divergence is
recorded at its step, the step-0 loss is the same for every backend), resuming a killed
run, and the tables and figures."""
from __future__ import annotations

import copy
import json
import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest

from flashwatt.config import ConfigError, load_config, validate_config
from flashwatt.models.presets import model_spec
from flashwatt.records import read_record, write_record
from flashwatt.training import OPTIMIZERS, SCHEDULES
from flashwatt.training.cell import TRAIN_OPTIMIZERS, TRAIN_SCHEDULES, WILDCARD_CONSTRAINTS, TrainCell
from flashwatt.training.data import prepare_data
from flashwatt.figure_base import write_figure
from flashwatt.training.figures import TRAINING_FIGURES, setting_labels
from flashwatt.training.job import run_train_cell, target_reached
from flashwatt.training.loop import eval_points
from flashwatt.training.suite import training_runs, training_section
from flashwatt.training.summary import run_table, setting_table
from support import synthetic_corpus

REPO = Path(__file__).resolve().parents[1]


# ---- the cell -------------------------------------------------------------------------
def cell(**changes) -> TrainCell:
    fields = dict(suite="s", model="llama_tiny", backend="sdpa_default", precision="fp32", optimizer="adamw",
                  schedule="cosine", lr=3e-4, dropout=0.0, weight_decay=0.1, batch=4, context=64, tokens=6144,
                  seed=0)
    return TrainCell(**{**fields, **changes})


@pytest.mark.parametrize("changes", [{}, {"lr": 1e-5, "dropout": 0.1, "optimizer": "lion", "schedule": "wsd"},
                                     {"lr": 0.0012345, "weight_decay": 0.0, "seed": 12}])
def test_path_names_the_cell_and_reads_back(changes):
    c = cell(**changes)
    assert TrainCell.from_path(c.path) == c
    assert TrainCell.from_path("/abs/where/" + c.path) == c
    assert re.fullmatch(WILDCARD_CONSTRAINTS["tname"], c.name)
    assert c.path == f"results/cells/s/train/llama_tiny/sdpa_default/fp32/{c.name}.json"
    assert c.steps == 6144 // (4 * 64)
    assert c.setting == c.id.rsplit("-s", 1)[0] and f"-s{c.seed}" not in c.setting


@pytest.mark.parametrize("path", [
    "results/cells/s/model/llama_tiny/sdpa_default/fp32/train-L64-B2.json",  # another kind's folder
    "results/cells/s/train/llama_tiny/sdpa_default/fp32",                    # no record name
    "results/cells/s/train/llama_tiny/sdpa_default/fp32/x.trace.parquet",    # the trace, not the record
    "elsewhere/s/train/llama_tiny/sdpa_default/fp32/adamw-cosine-lr0.0003-do0-wd0.1-B4-L64-T6144-s0.json",
])
def test_a_path_that_is_not_a_training_record_is_refused(path):
    with pytest.raises(ValueError, match="is not a TrainCell record"):
        TrainCell.from_path(path)


def test_the_cells_names_are_the_optimizers_and_schedules():
    assert TRAIN_OPTIMIZERS == tuple(OPTIMIZERS) and TRAIN_SCHEDULES == tuple(SCHEDULES)


@pytest.mark.parametrize("changes, message", [
    ({"optimizer": "sgd"}, "optimizer='sgd'"),
    ({"schedule": "linear"}, "schedule='linear'"),
    ({"lr": 0.0}, "lr=0.0: must be > 0"),
    ({"lr": 3.14159265e-4}, "at most 6 significant digits"),
    ({"dropout": 1.0}, "dropout=1.0"),
    ({"tokens": 100}, "tokens=100: the budget is smaller than one batch (4 x 64 = 256 tokens)"),
    ({"batch": 0}, "batch=0"),
    ({"backend": "flash"}, "backend='flash'"),
])
def test_bad_cells_are_refused(changes, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        cell(**changes)


def test_eval_points_start_at_zero_and_end_at_the_last_step():
    assert eval_points(24, 3) == [0, 8, 16, 24]
    assert eval_points(5, 16) == [0, 1, 2, 3, 4, 5]
    assert eval_points(100, 1) == [0, 100]


def test_target_is_the_first_evaluation_at_or_below_it():
    curve = [{"step": s, "tokens": s * 10, "val_loss": v, "wall_s": s / 10, "train_s": s / 20, "energy_j": s * 2.0}
             for s, v in [(0, 9.0), (5, 6.0), (10, 5.0), (15, 4.9)]]
    assert target_reached(curve, 5.0) == {"loss": 5.0, "reached": True, "step": 10, "tokens": 100, "wall_s": 1.0,
                                          "train_s": 0.5, "energy_j": 20.0}
    assert target_reached(curve, 4.0) == {"loss": 4.0, "reached": False, "best_val_loss": 4.9}
    assert target_reached(curve, None)["reached"] is None


# ---- the suite ------------------------------------------------------------------------
def training_config(corpus: Path | str = "README.md", **section_changes) -> dict:
    config = load_config()
    config["suites"]["t"] = copy.deepcopy(config["suites"]["training_smoke"])
    config["suites"]["t"]["training"]["data"]["corpus"] = str(corpus)
    config["suites"]["t"]["training"].update(section_changes)
    return config


def test_every_suite_of_the_config_plans():
    config = load_config()
    plans = {name: training_runs(config, name) for name in ("training", "training_backends", "training_full",
                                                             "training_smoke")}
    assert len(plans["training"]) == 4 * 3  # (adamw, lion) x (cosine, wsd) x 3 seeds
    assert {c.backend for c in plans["training_backends"]} == {"eager", "sdpa_default", "sdpa_flash", "sdpa_cudnn",
                                                               "custom"}
    lion = [c for c in plans["training"] if c.optimizer == "lion"]
    adamw = [c for c in plans["training"] if c.optimizer == "adamw"]
    assert {c.lr for c in lion} == {6e-4} and {c.lr for c in adamw} == {2e-3}  # Lion: 3.3x smaller
    assert {c.seed for c in lion} == {0, 1, 2}
    assert len(plans["training_full"]) == 2 * 3 * 2 * 2 * 3
    spec = plans["training_smoke"][next(iter(plans["training_smoke"]))]
    assert spec["data"] == "results/training_smoke/training-data.json" and spec["model"]["name"] == "llama_tiny"


@pytest.mark.parametrize("grid_changes, message", [
    ({"models": ["llama_huge"]}, "config key suites.t.training.grids[0].models[0]: unknown model 'llama_huge'"),
    ({"lrs": {"adamw": [0.001]}}, "config key suites.t.training.grids[0].lrs: nothing for optimizer 'lion'"),
    ({"contexts": [4096]}, "config key suites.t.training.grids[0].contexts: 4096 is longer than model llama_tiny's "
                           "2048 positions"),
    ({"dropouts": [0.1]}, "config key suites.t.training.grids[0].dropouts: 0.1 for model llama_tiny, a llama model "
                          "without residual dropout"),
    ({"token_budgets": [100]}, "config key suites.t.training.grids[0]: training cell tokens=100: the budget is "
                               "smaller than one batch"),
    ({"schedules": ["wsd"], "token_budgets": [256 * 40]}, "config key suites.t.training.grids[0]: "
     "adamw-wsd-lr0.003-do0-wd0.1-B4-L64-T10240-s0: wsd: warm-up (36 steps) and decay"),
    ({"optimizers": ["sgd"]}, "nothing for optimizer 'sgd'"),
])
def test_bad_grids_are_refused_with_their_key(grid_changes, message):
    config = training_config(warmup_fraction=0.9)
    config["suites"]["t"]["training"]["grids"][0].update(grid_changes)
    with pytest.raises(ConfigError, match=re.escape(message)):
        validate_config(config)


def test_unknown_optimizer_with_one_lr_list_is_refused_with_its_key():
    config = training_config()
    config["suites"]["t"]["training"]["grids"][0].update(optimizers=["sgd"], lrs=[0.1], weight_decays=[0.1])
    with pytest.raises(ConfigError, match=re.escape("config key suites.t.training.grids[0]: training cell "
                                                    "optimizer='sgd': allowed adamw, lion")):
        validate_config(config)


def test_unknown_training_key_is_refused():
    config = training_config(evaluaton={"evals": 3})
    with pytest.raises(ConfigError, match="evaluaton"):
        validate_config(config)


@pytest.mark.parametrize("corpus, message", [
    ("/no/such/corpus", "config key suites.t.training.data.corpus: '/no/such/corpus' does not exist"),
])
def test_missing_corpus_is_refused_by_the_data_rule(corpus, message, tmp_path):
    config = training_config(corpus)
    with pytest.raises(ConfigError, match=re.escape(message)):
        prepare_data(training_section(config, "t"), "t", tmp_path / "m.json")


def test_empty_corpus_is_refused_by_the_data_rule(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    (empty / "a.txt").write_text("\n\n")
    with pytest.raises(ConfigError, match=re.escape("config key suites.t.training.data.corpus")):
        prepare_data(training_section(training_config(empty), "t"), "t", tmp_path / "m.json")


# ---- runs on the CPU ------------------------------------------------------------------
@pytest.fixture(scope="module")
def data(tmp_path_factory):
    """The smoke suite's data, prepared once: (config, folder the runs work in)."""
    root = tmp_path_factory.mktemp("training")
    config = training_config(synthetic_corpus(root / "corpus"), cache=str(root / "cache"))
    manifest = root / "training-data.json"
    prepare_data(training_section(config, "t"), "t", manifest)
    return config, manifest


def spec_of(data, cell_: TrainCell, **changes) -> dict:
    config, manifest = data
    runs = training_runs(config, "t")
    spec = copy.deepcopy(next(iter(runs.values())))
    spec["data"] = str(manifest)
    spec["model"] = model_spec(cell_.model)
    spec.update(changes)
    return spec


def smoke_cell(**changes) -> TrainCell:
    return cell(**{"suite": "t", "lr": 3e-3, **changes})


@pytest.mark.slow  # training runs on the CPU
def test_a_run_learns_and_records_its_curve(data):
    c = smoke_cell()
    outcome = run_train_cell(c, spec_of(data, c, target_loss=3.0))
    record = outcome.record
    assert record["status"] == "ok", record.get("traceback") or record.get("reason")
    curve = record["curve"]
    assert [row["step"] for row in curve] == eval_points(c.steps, 3) == record["run"]["eval_steps"]
    assert curve[0]["train_loss"] is None and curve[0]["tokens"] == 0
    # Random weights start near ln(vocabulary); training must bring it down.
    assert abs(curve[0]["val_loss"] - math.log(record["model"]["vocab_size"])) < 0.5
    assert curve[-1]["val_loss"] < curve[0]["val_loss"] - 0.5
    assert [r["step"] for r in outcome.trace] == list(range(c.steps))
    assert all(math.isfinite(r["loss"]) for r in outcome.trace)
    assert outcome.trace[0]["lr"] == pytest.approx(3e-3 / record["run"]["warmup_steps"])  # warm-up's first step
    assert record["check"]["passed"] and record["check"]["reference"].endswith("fp64")
    assert record["timing"]["tokens_trained"] == c.steps * c.tokens_per_step
    assert record["timing"]["steady_tokens_per_s"] > 0
    assert record["final"]["perplexity"] == pytest.approx(math.exp(curve[-1]["val_loss"]))
    first = next(row for row in curve if row["val_loss"] <= 3.0)
    assert record["target"]["reached"] is True and first["step"] > 0
    assert record["target"]["step"] == first["step"] and record["target"]["wall_s"] == first["wall_s"]
    assert record["energy"]["energy_j"] is None and "energy" in record["energy"]["reason"]
    assert record["resumes"] == []
    assert set(record["stages_s"]) >= {"startup", "build", "check", "setup", "training steps", "evaluation", "summary"}
    # the run's checkpoints are gone once it finished
    assert not (Path(spec_of(data, c)["cache"]) / "checkpoints" / c.id).exists()
    json.dumps(record, allow_nan=False, default=str)


@pytest.mark.slow  # training runs on the CPU
def test_the_step_zero_loss_is_the_same_for_every_backend(data, tmp_path):
    records = []
    for backend in ("sdpa_default", "sdpa_math", "eager"):
        c = smoke_cell(backend=backend, tokens=256 * 2)
        outcome = run_train_cell(c, spec_of(data, c))
        assert outcome.record["status"] == "ok", outcome.record.get("traceback")
        write_record(tmp_path / c.path, outcome.record)
        records.append(tmp_path / c.path)
    runs, curves = run_table(records)
    assert runs["initial_val_loss"].max() - runs["initial_val_loss"].min() < 1e-5
    assert runs["initial_loss_agrees"].tolist() == [True, True, True]
    # the summary flags a backend whose first loss is off
    runs.loc[0, "initial_val_loss"] += 0.01
    from flashwatt.training.summary import _initial_loss_agrees

    assert _initial_loss_agrees(runs).tolist() == [False, True, True]


def test_a_diverging_run_is_recorded_at_its_step(data):
    # Lion moves every weight by lr each step: at lr 1e6 activations overflow within steps.
    c = smoke_cell(optimizer="lion", schedule="constant", lr=1e6)
    outcome = run_train_cell(c, spec_of(data, c, grad_clip=0.0))
    record = outcome.record
    assert record["status"] == "diverged", record.get("traceback") or record.get("reason")
    step = record["diverged"]["step"]
    assert f"at step {step}" in record["reason"]
    assert outcome.trace[-1]["step"] == step and not math.isfinite(outcome.trace[-1]["loss"])
    assert all(math.isfinite(r["loss"]) for r in outcome.trace[:-1])
    assert step < c.steps - 1  # it stopped there, it did not train on


def test_a_backend_that_fails_the_check_is_not_trained(data, monkeypatch):
    from flashwatt.models.attention import RegistryAttention

    original = RegistryAttention.__call__

    def without_causal_mask(self, module, query, key, value, attention_mask, **kwargs):
        return original(self, module, query, key, value, attention_mask, **{**kwargs, "is_causal": False})

    monkeypatch.setattr(RegistryAttention, "__call__", without_causal_mask)
    c = smoke_cell(backend="sdpa_math")
    record = run_train_cell(c, spec_of(data, c)).record
    assert record["status"] == "incorrect" and "causal" in record["reason"] and "curve" not in record


# ---- resume ---------------------------------------------------------------------------
_WORKER = """
import json, sys
from flashwatt.training.cell import TrainCell
from flashwatt.training.job import run_train_cell
from flashwatt.records import write_record
cell = TrainCell.from_path(sys.argv[1])
spec = json.loads(open(sys.argv[2]).read())
write_record(sys.argv[3], run_train_cell(cell, spec).record)
"""


@pytest.mark.slow  # training runs on the CPU
def test_a_killed_run_resumes_and_matches_an_unbroken_one(data, tmp_path):
    c = smoke_cell(tokens=96 * 256)  # 96 steps, evaluated (and checkpointed) every 8
    evaluation = {"evals": 12, "validation_windows": 4}
    unbroken = run_train_cell(c, spec_of(data, c, evaluation=evaluation, checkpoint_every_s=0.0))
    assert unbroken.record["status"] == "ok"

    spec = spec_of(data, c, evaluation=evaluation, checkpoint_every_s=0.0, cache=str(tmp_path / "cache"))
    spec_file = tmp_path / "spec.json"
    spec_file.write_text(json.dumps(spec))
    worker = subprocess.Popen([sys.executable, "-c", _WORKER, c.path, str(spec_file), str(tmp_path / "x.json")],
                              env={**os.environ, "PYTHONPATH": str(REPO / "src")})
    progress = Path(spec["cache"]) / "checkpoints" / c.id / "progress.json"
    # Until step 40, however slow the machine: the run is the bound (it ends by itself at 96).
    while worker.poll() is None:
        if progress.is_file() and json.loads(progress.read_text())["step"] >= 40:
            break
        time.sleep(0.02)
    assert worker.poll() is None, "the run ended before it could be killed"
    worker.send_signal(signal.SIGKILL)  # as a node failure or a preemption without warning would
    worker.wait()
    killed = json.loads(progress.read_text())
    killed_at = killed["step"]
    assert not (tmp_path / "x.json").exists()

    resumed = run_train_cell(c, spec)
    record = resumed.record
    assert record["status"] == "ok", record.get("traceback")
    [resume] = record["resumes"]
    assert 0 < resume["at_step"] <= killed_at < c.steps
    assert resume.get("lost_steps", 0) == killed_at - resume["at_step"]
    # the same curve as the unbroken run: every evaluation once, the same losses
    assert [r["step"] for r in record["curve"]] == [r["step"] for r in unbroken.record["curve"]]
    for a, b in zip(record["curve"], unbroken.record["curve"]):
        assert a["val_loss"] == pytest.approx(b["val_loss"], rel=1e-6, abs=1e-6)
    assert [r["step"] for r in resumed.trace] == list(range(c.steps))
    assert [r["loss"] for r in resumed.trace] == pytest.approx([r["loss"] for r in unbroken.trace], rel=1e-6)
    # the clocks continue from the checkpoint, nothing counted twice: what the curve holds at
    # the resume point is what the killed job had done by then, and what was added after it
    # fits in the resumed job's own duration
    walls = [r["wall_s"] for r in record["curve"]]
    assert walls == sorted(walls)
    at = next(r for r in record["curve"] if r["step"] == resume["at_step"])
    assert at["train_s"] <= killed["train_s"] and at["wall_s"] <= killed["wall_s"]
    assert record["timing"]["wall_s"] - at["wall_s"] <= record["duration_s"]


# ---- tables and figures -----------------------------------------------------------------
def fake_record(c: TrainCell, final: float, reach_s: float | None, status: str = "ok") -> dict:
    curve = [{"step": 0, "tokens": 0, "val_loss": 6.3, "train_loss": None, "current_lr": c.lr, "train_s": 0.0,
              "eval_s": 0.1, "checkpoint_s": 0.0, "wall_s": 0.1, "energy_j": 10.0},
             {"step": c.steps, "tokens": c.steps * c.tokens_per_step, "val_loss": final, "train_loss": final + 0.1,
              "current_lr": c.lr / 10, "train_s": 2.0, "eval_s": 0.2, "checkpoint_s": 0.0, "wall_s": 2.2, "energy_j": 500.0}]
    target = ({"loss": 5.0, "reached": True, "step": c.steps, "tokens": curve[1]["tokens"], "wall_s": reach_s,
               "train_s": reach_s, "energy_j": 400.0 * reach_s} if reach_s else {"loss": 5.0, "reached": False})
    return {"kind": "train", "status": status, "reason": None, "device": {"name": "NVIDIA H100 80GB HBM3",
                                                                          "type": "cuda"},
            "model": {"parameters": 1000, "vocab_size": 512}, "check": {"passed": True, "loss": {"abs_error": 0.0}},
            "curve": curve if status == "ok" else curve[:1],
            "final": {"val_loss": final, "perplexity": math.exp(final), "initial_val_loss": 6.3},
            "timing": {"tokens_trained": curve[1]["tokens"], "tokens_per_s": curve[1]["tokens"] / 2.0,
                       "steady_tokens_per_s": curve[1]["tokens"] / 1.9,
                       "train_s": 2.0, "eval_s": 0.2, "checkpoint_s": 0.0, "wall_s": 2.2},
            "energy": {"energy_j": 500.0, "j_per_token": 500.0 / curve[1]["tokens"]}, "target": target,
            "resumes": [{"at_step": 8, "lost_steps": 3}] if c.seed == 1 else []}


@pytest.fixture
def tables(tmp_path):
    paths = []
    for optimizer, lr in (("adamw", 3e-3), ("lion", 5e-4)):
        for seed in (0, 1, 2):
            c = smoke_cell(optimizer=optimizer, lr=lr, seed=seed)
            status = "diverged" if (optimizer, seed) == ("lion", 2) else "ok"
            write_record(tmp_path / c.path, fake_record(c, 4.8 - seed * 0.01, 1.0 + seed, status))
            paths.append(tmp_path / c.path)
    runs, curves = run_table(paths)
    return runs, curves, tmp_path


def test_settings_hold_the_spread_over_seeds(tables):
    runs, curves, _ = tables
    settings = setting_table(runs).set_index("optimizer")
    assert settings.loc["adamw", "runs"] == 3 and settings.loc["adamw", "ok"] == 3
    assert settings.loc["lion", "ok"] == 2 and settings.loc["lion", "diverged"] == 1
    assert settings.loc["adamw", "wall_s_to_target_mean"] == pytest.approx(2.0)
    assert settings.loc["adamw", "wall_s_to_target_std"] == pytest.approx(1.0)
    assert settings.loc["lion", "wall_s_to_target_max"] == pytest.approx(2.0)  # the diverged seed is left out
    assert settings.loc["adamw", "setting"].endswith("-s0") is False
    assert runs.set_index("seed").loc[1, "lost_steps"].tolist() == [3, 3]
    assert len(curves) == 2 * 5 + 1 and set(curves["status"]) == {"ok", "diverged"}


def test_labels_name_what_varies():
    table = pd.DataFrame([smoke_cell(optimizer=o, lr=lr).as_row() for o, lr in (("adamw", 3e-3), ("lion", 5e-4))])
    assert setting_labels(table).tolist() == ["adamw lr 0.003", "lion lr 0.0005"]


@pytest.mark.parametrize("name", list(TRAINING_FIGURES))
def test_figures_draw(name, tables):
    runs, curves, tmp_path = tables
    runs.to_parquet(tmp_path / "runs.parquet")
    curves.to_parquet(tmp_path / "curves.parquet")
    out = tmp_path / f"{name}.pdf"
    write_figure(TRAINING_FIGURES[name], {"runs": tmp_path / "runs.parquet", "curves": tmp_path / "curves.parquet"},
                 out)
    assert out.stat().st_size > 5000


def test_figures_say_why_when_nothing_finished(tables):
    runs, curves, tmp_path = tables
    runs["status"] = "oom"
    runs["reason"] = "out of memory during training steps"
    curves["status"] = "oom"
    curves["reason"] = "out of memory during training steps"
    for name, figure in TRAINING_FIGURES.items():
        fig = figure.render(curves if figure.source.inputs == ("curves",) else runs)
        text = " ".join(t.get_text() for t in fig.findobj(lambda a: hasattr(a, "get_text")))
        assert "Nothing to draw" in text and "out of memory" in text


def test_registry_backends_take_autocast_inputs_in_one_dtype():
    """Under autocast, Llama's RoPE leaves q and k in float32 beside a bfloat16 v; a registry
    kernel gets all three in the autocast dtype, as SDPA would."""
    import torch

    from flashwatt.models.attention import use_backend
    from flashwatt.models.step import build_model

    model = build_model(model_spec("llama_tiny"), "fp32", torch.device("cpu"), 0)
    seen = []
    adapter = use_backend(model, "sdpa_math", "bf16", train=True)
    original = adapter.kernel.__class__.__call__

    def record_dtypes(self, q, k, v, cell):
        seen.append((q.dtype, k.dtype, v.dtype))
        return original(self, q, k, v, cell)

    original_supports = adapter.kernel.__class__.supports
    adapter.kernel.__class__.__call__ = record_dtypes
    # The declaration refuses bf16 for sdpa_math on a CPU (measured cells run it in fp32
    # there); what is tested here is the dtypes the kernel is handed, so it refuses nothing.
    adapter.kernel.__class__.supports = lambda self, call, device: None
    try:
        with torch.autocast("cpu", dtype=torch.bfloat16):
            loss = model(input_ids=torch.randint(0, 512, (2, 32)), labels=torch.randint(0, 512, (2, 32))).loss
        loss.backward()
    finally:
        adapter.kernel.__class__.__call__ = original
        adapter.kernel.__class__.supports = original_supports
    assert seen and set(seen) == {(torch.bfloat16,) * 3}


@pytest.mark.slow  # training runs on the CPU
def test_dropout_is_on_in_training_and_off_in_the_check(data):
    plain, dropped = (run_train_cell(c, spec_of(data, c)) for c in
                      (smoke_cell(model="gpt2_tiny", tokens=2048), smoke_cell(model="gpt2_tiny", tokens=2048,
                                                                              dropout=0.1)))
    for outcome in (plain, dropped):
        assert outcome.record["status"] == "ok", outcome.record.get("traceback") or outcome.record.get("reason")
        assert outcome.record["check"]["passed"]
    assert dropped.record["model"]["dropout"] == {"residual_and_embedding": 0.1, "attention": 0.0}
    # the same weights and batches: the first step's loss differs only through dropout
    assert plain.trace[0]["loss"] != dropped.trace[0]["loss"]
    # and evaluation runs without it: the step-0 validation loss is the same
    assert plain.record["curve"][0]["val_loss"] == pytest.approx(dropped.record["curve"][0]["val_loss"], abs=1e-6)


def test_running_out_of_memory_mid_run_is_recorded_naming_the_stage(data, monkeypatch):
    import torch

    from flashwatt.training.loop import Trainer

    original = Trainer.train_until

    def no_room_after_the_first_segment(self, stop):
        if self.step > 0:
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        return original(self, stop)

    monkeypatch.setattr(Trainer, "train_until", no_room_after_the_first_segment)
    c = smoke_cell(tokens=256 * 16)
    record = run_train_cell(c, spec_of(data, c)).record
    assert record["status"] == "oom" and record["oom_stage"] == "training steps"
    assert "out of memory during training steps" in record["reason"]
    assert record["check"]["passed"] and record["model"]["parameters"] > 0  # what was learnt before is kept
    assert record["stages_s"]["training steps"] > 0
    assert [row["step"] for row in record["curve"]] == eval_points(c.steps, 3)[:2]  # evaluations done are kept
