"""Model and training cells under the step-level controller (a `governor` setting): their names
and config, and their jobs on the CPU reading a fake NVML (tests/fake_nvml.py), in real
time: the static front and a budget run of a model cell, judged against each other by the
model table; a training run under a budget, its curve against tokens, seconds and joules
and its 1 s windows judged against the budget; and the figures drawn from them.

On a GPU the same jobs run with real NVML: tests/gpu/test_control_step_gpu.py."""
from __future__ import annotations

import copy

import pytest
import torch

import flashwatt.job_frame as job_frame
import flashwatt.models.governed_job as governed_job
from fake_nvml import FakeGpu, FakeNvml, uuid_for
from flashwatt.config import ConfigError, load_config, validate_config
from flashwatt.control.governor_setting import GovernorSetting
from flashwatt.figure_base import write_figure
from flashwatt.models.cell import ModelCell
from flashwatt.models.figures import MODEL_FIGURES
from flashwatt.models.presets import model_spec
from flashwatt.models.suite import model_runs
from flashwatt.records import write_record, write_trace
from flashwatt.telemetry import open_telemetry
from flashwatt.training.cell import TrainCell
from flashwatt.training.data import prepare_data
from flashwatt.training.figures import TRAINING_FIGURES
from flashwatt.training.job import run_train_cell
from flashwatt.training.suite import training_runs, training_section
from flashwatt.training.summary import run_table
from support import synthetic_corpus


@pytest.fixture(autouse=True)
def one_thread():
    """One CPU thread: on a shared machine several threads per op make a 0.1 s step take seconds."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture
def fake_board(monkeypatch):
    """Every job's telemetry is a fake NVML board of 100 W idle (CPU jobs get NVML readings)."""
    gpu = FakeGpu(uuid_for(0), power_w=100.0, update_period_s=0.02)
    nvml = FakeNvml([gpu])
    monkeypatch.setattr(job_frame, "open_cell_telemetry", lambda device, settings=None: open_telemetry(None, nvml=nvml))
    monkeypatch.setattr(governed_job, "REST_BEFORE_IDLE_S", 0.0)
    return gpu, nvml


# ---- names and config ---------------------------------------------------------------------
@pytest.mark.parametrize("token", ["front", "energy", "budget450w", "budget600w-400w_at20s-limit83c"])
def test_a_governor_names_model_and_training_cells_and_reads_back(token):
    model = ModelCell("s", "llama_3_2_1b", "sdpa_default", "bf16", "train", 4096, 2, governor=token)
    assert model.name.endswith(f"-gov-{token}") and ModelCell.from_path(model.path) == model
    assert GovernorSetting.parse(token).token == token
    if token != "front":
        run = TrainCell("s", "llama_tiny", "sdpa_default", "bf16", "adamw", "cosine", 1e-3, 0.0, 0.1, 4, 64, 6144, 3,
                        token)
        assert run.name.endswith(f"-gov-{token}-s3") and TrainCell.from_path(run.path) == run
        assert run.setting.endswith(f"-gov-{token}")  # the seed is left out, the budget is not


def test_governors_expand_into_cells_and_only_they_carry_the_governor_settings():
    grid = {"models": ["llama_tiny"], "backends": ["sdpa_default"], "precisions": ["fp32"], "phases": ["train"],
            "seq_lens": [64], "batches": [2], "governors": [{"mode": "front"}, {"mode": "budget", "budgets_w": [300, 450]},
                                                            {"mode": "budget", "schedule": [[0, 600], [5, 400]],
                                                             "temp_limit_c": 80}],
            "governor": {"seconds": 8, "knobs": {"micro_batches": [1, 2]}}}
    plain = dict(grid, governors=None, governor=None)
    plain = {k: v for k, v in plain.items() if v is not None}
    config = validate_config({"suites": {"m": {"models": {"grids": [grid, plain]}}}})
    cells = model_runs(config, "m")
    assert sorted(c.governor for c in cells) == ["", "budget300w", "budget450w", "budget600w-400w_at5s-limit80c",
                                                 "front"]
    for cell, spec in cells.items():
        assert ("governor" in spec) == bool(cell.governor)
    governed = next(spec for cell, spec in cells.items() if cell.governor == "front")["governor"]
    assert governed["seconds"] == 8 and governed["knobs"] == {"micro_batches": [1, 2]}
    assert governed["front"]["duties"] == [1.0, 0.8, 0.6, 0.45, 0.3]  # the defaults under what the grid gave


@pytest.mark.parametrize("changes, message", [
    ({"backends": ["control_450w"]}, "the step-level controller and the attention-level one"),
    ({"governors": [{"mode": "budget"}]}, r"governors\[0\]: mode budget needs budgets_w or schedule"),
    ({"governors": [{"mode": "energy", "budgets_w": [300]}]}, r"governors\[0\]: mode energy takes no budgets_w"),
    ({"governors": [{"mode": "energy", "temp_limit_c": 80}]}, "a whole degC limit held alongside a budget"),
])
def test_a_governor_that_cannot_be_is_refused_with_its_key(changes, message):
    grid = {"models": ["llama_tiny"], "backends": ["sdpa_default"], "precisions": ["fp32"], "phases": ["train"],
            "seq_lens": [64], "batches": [2], "governors": [{"mode": "energy"}], **changes}
    with pytest.raises(ConfigError, match=message):
        model_runs(validate_config({"suites": {"m": {"models": {"grids": [grid]}}}}), "m")


def test_a_mix_of_two_duties_is_a_one_gpu_governor_setting():
    """`governor.pace_mix` reaches a one-GPU grid's governed cells; a grid on several GPUs is
    refused by its key (each rank would read the mix's periods from its own clock)."""
    grid = {"models": ["llama_tiny"], "backends": ["sdpa_default"], "precisions": ["fp32"], "phases": ["train"],
            "seq_lens": [64], "batches": [2], "governors": [{"mode": "budget", "budgets_w": [300]}],
            "governor": {"pace_mix": {"low": 0.3, "period_s": 0.5}}}
    cells = model_runs(validate_config({"suites": {"m": {"models": {"grids": [grid]}}}}), "m")
    assert [spec["governor"]["pace_mix"] for spec in cells.values()] == [{"low": 0.3, "period_s": 0.5}]
    several = dict(grid, gpus=[2], strategies=["fsdp"])
    with pytest.raises(ConfigError, match=r"grids\[0\]\.governor\.pace_mix: runs on one GPU"):
        model_runs(validate_config({"suites": {"m": {"models": {"grids": [several]}}}}), "m")
    with pytest.raises(ConfigError, match="pace_mix"):
        validate_config({"suites": {"m": {"models": {"grids": [dict(grid, governor={"pace_mix": {"low": 1.5,
                                                                                                 "period_s": 0.5}})]}}}})


def test_a_training_run_cannot_be_a_front():
    with pytest.raises(ValueError, match="governor front: a training run is judged against a model cell's"):
        TrainCell("s", "llama_tiny", "sdpa_default", "fp32", "adamw", "cosine", 1e-3, 0.0, 0.1, 4, 64, 6144, 0,
                  "front")


# ---- a model cell's front and budget run ----------------------------------------------------
def model_spec_of(cell: ModelCell, front_duties=(1.0, 0.5), seconds=2.0) -> dict:
    config = validate_config({"suites": {"m": {"models": {"grids": [{
        "models": ["llama_tiny"], "backends": ["sdpa_default"], "precisions": ["fp32"], "phases": ["train"],
        "seq_lens": [32], "batches": [2], "governors": [{"mode": "front"}],
        "governor": {"seconds": seconds, "knobs": {"micro_batches": [1, 2]},
                     "front": {"backends": ["sdpa_default"], "micro_batches": [1, 2], "duties": list(front_duties),
                               "seconds": 0.8}},
        "steps": {"warmup_steps": 1}}]}}}})
    spec = next(iter(model_runs(config, "m").values()))
    return copy.deepcopy(spec)


def test_a_model_cells_front_and_budget_run_are_judged_against_each_other(fake_board, tmp_path):
    from flashwatt.models.job import run_model_cell
    from flashwatt.models.summary import governed_traces, model_table

    paths = []
    for token in ("front", "budget450w"):
        cell = ModelCell("m", "llama_tiny", "sdpa_default", "fp32", "train", 32, 2, governor=token)
        outcome = run_model_cell(cell, model_spec_of(cell))
        record = outcome.record
        assert record["status"] == "ok", record.get("traceback") or record.get("reason")
        write_record(tmp_path / cell.path, record)
        write_trace(tmp_path / cell.trace_path, outcome.trace)
        paths.append(tmp_path / cell.path)
        if token == "front":
            front = {(r["config"], r["duty"]): r for r in record["front"]}
            assert set(front) == {(c, d) for c in ("sdpa_default", "sdpa_default x2") for d in (1.0, 0.5)}
            ran = [r for r in front.values() if r.get("tokens_per_s")]
            assert ran and all(r["avg_power_w"] > 0 for r in ran)
            # pacing at duty 0.5 idles the board about half of the point's time (its throughput
            # against the full-duty point's also moves with the host's load between the two)
            full, half = front[("sdpa_default", 1.0)], front[("sdpa_default", 0.5)]
            assert full["idle_share"] < 0.05 and 0.4 < half["idle_share"] < 0.6, (full, half)
        else:
            control = record["control"]
            assert control["schedule"] == [[0, 450]] and control["merit"]["windows"] >= 1
            assert control["merit"]["windows_within_pct"] == 100.0  # the fake board draws 100 W
            # judged by the meter of the board's counter (the fake NVML updates it every 20 ms)
            assert control["merit"]["meter_updates"] >= 5 and 15 <= control["merit"]["meter_gap_ms"] <= 25
            assert {row["board_energy_mj"] is not None for row in outcome.trace} == {True}
            assert record["check"]["passed"] and set(record["check"]["configurations"]) == {"sdpa_default"}
            assert {row["source"] for row in outcome.trace} == {"controller"}
    table = model_table(paths).set_index("governor")
    run = table.loc["budget450w"]
    assert run["control_budget_w"] == 450 and run["front_points"] == 4
    assert not run["front_same_device"]  # a CPU has no UUID: not known to be the front's GPU
    assert run["vs_best_static"] > 0 and run["best_static"].startswith("sdpa_default")
    traces = governed_traces(paths)
    assert set(traces["governor"]) == {"budget450w"} and traces["power_w"].notna().all()
    out = tmp_path / "model_governed_power.png"
    table_path, traces_path = tmp_path / "models.parquet", tmp_path / "traces.parquet"
    model_table(paths).to_parquet(table_path)
    traces.to_parquet(traces_path)
    write_figure(MODEL_FIGURES["model_governed_power"], {"table": table_path, "governed_traces": traces_path}, out)
    assert out.stat().st_size > 10_000


def test_a_model_cells_budget_run_takes_its_mix_to_the_controller_and_the_record(fake_board, monkeypatch):
    from flashwatt.models.job import run_model_cell

    given = []
    make = governed_job._controller

    def spy(*args, **options):
        given.append(options.get("pace_mix"))
        return make(*args, **options)
    monkeypatch.setattr(governed_job, "_controller", spy)
    cell = ModelCell("m", "llama_tiny", "sdpa_default", "fp32", "train", 32, 2, governor="budget450w")
    spec = model_spec_of(cell)
    spec["governor"]["pace_mix"] = {"low": 0.3, "period_s": 0.5}
    record = run_model_cell(cell, spec).record
    assert record["status"] == "ok", record.get("traceback") or record.get("reason")
    assert given == [(0.3, 0.5)] and record["control"]["pace_mix"] == [0.3, 0.5]


# ---- a training run under a budget -------------------------------------------------------------
def test_a_training_run_under_a_budget_records_its_curve_and_its_windows(fake_board, tmp_path):
    config = load_config()
    config["suites"]["t"] = copy.deepcopy(config["suites"]["training_smoke"])
    config["suites"]["t"]["training"]["data"]["corpus"] = str(synthetic_corpus(tmp_path / "corpus"))
    config["suites"]["t"]["training"]["cache"] = str(tmp_path / "cache")
    manifest = tmp_path / "training-data.json"
    prepare_data(training_section(config, "t"), "t", manifest)
    base = copy.deepcopy(next(iter(training_runs(config, "t").values())))
    base["data"] = str(manifest)
    paths = []
    for governor in ("", "budget300w"):
        cell = TrainCell("t", "llama_tiny", "sdpa_default", "fp32", "adamw", "cosine", 3e-3, 0.0, 0.1, 4, 64, 6144, 0,
                         governor)
        spec = dict(base, model=model_spec("llama_tiny"))
        if governor:
            spec["governor"] = {"knobs": {"micro_batches": [1, 2]}, "on_peer_loss": "end"}
        outcome = run_train_cell(cell, spec)
        record = outcome.record
        assert record["status"] == "ok", record.get("traceback") or record.get("reason")
        write_record(tmp_path / cell.path, record)
        paths.append(tmp_path / cell.path)
        assert record["energy"]["energy_j"] > 0 and record["curve"][-1]["energy_j"] > 0  # joules on the fake board
        if governor:
            control = record["control"]
            assert control["setting"] == "budget300w" and control["merit"]["windows"] >= 1
            assert control["merit"]["meter_updates"] >= 5  # judged by a meter of the board's counter
            assert control["knobs"] == {"backend": ["unchanged"], "micro_batches": [1, 2]}
            ticks = [row for row in outcome.trace if row.get("source") == "controller"]
            steps = [row for row in outcome.trace if "loss" in row and row.get("source") != "controller"]
            assert ticks and len(steps) == cell.steps
            assert any("evaluation" in shape for shape in control["choices"])  # evaluations paced too
    runs, curves = run_table(paths)
    governed = runs.set_index("governor").loc["budget300w"]
    assert governed["control_budget_w"] == 300 and governed["control_windows_within_pct"] == 100.0
    assert runs["final_val_loss"].notna().all()
    assert set(curves["governor"]) == {"", "budget300w"}
    curves_path = tmp_path / "curves.parquet"
    curves.to_parquet(curves_path)
    out = tmp_path / "training_budgets.pdf"
    write_figure(TRAINING_FIGURES["training_budgets"], {"curves": curves_path}, out)
    assert out.stat().st_size > 5_000
