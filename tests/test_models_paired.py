"""Paired rounds: a model cell's backend timed beside the SDPA default in one process
(flashwatt.models.paired), which cells of a suite take them, and the table's columns for
them and for comparisons made across GPUs."""
from __future__ import annotations

import statistics

import pytest
import torch

from flashwatt.config import ConfigError, validate_config
from flashwatt.models.attention import use_backend
from flashwatt.models.cell import ModelCell
from flashwatt.models.job import run_model_cell
from flashwatt.models.paired import REFERENCE, paired_rounds, round_order
from flashwatt.models.presets import model_spec
from flashwatt.models.step import build_model, make_step
from flashwatt.models.suite import model_runs
from flashwatt.models.summary import model_table
from flashwatt.records import write_record
from flashwatt.settings import MeasureSettings
from support import model_cell_spec

CPU = torch.device("cpu")




def test_rounds_alternate_abba():
    orders = [round_order("custom", r) for r in range(8)]
    assert orders[:4] == [("custom", REFERENCE), (REFERENCE, "custom"), (REFERENCE, "custom"), ("custom", REFERENCE)]
    assert orders[4:] == orders[:4]


def test_a_paired_cell_times_its_backend_beside_the_default_on_the_same_model():
    cell = ModelCell("t", "llama_tiny", "eager", "fp32", "prefill", 64, 2)
    record = run_model_cell(cell, model_cell_spec(paired_rounds=3)).record
    assert record["status"] == "ok", record.get("traceback")
    paired = record["paired"]
    assert [r["order"] for r in paired["rounds"]] == [list(round_order("eager", r)) for r in range(3)]
    for r in paired["rounds"]:
        # transformers ran what each timing is labelled with: the switch happened
        assert r["implementation"] == {"eager": "eager", REFERENCE: "sdpa"}
        assert r["step_ms"]["eager"] > 0 and r["step_ms"][REFERENCE] > 0
    speeds = [r["step_ms"][REFERENCE] / r["step_ms"]["eager"] for r in paired["rounds"]]
    assert paired["speed"] == pytest.approx(statistics.median(speeds))
    assert paired["speed_range"] == [min(speeds), max(speeds)]
    assert paired["energy"] is None and paired["energy_reason"]  # no NVML on a CPU
    assert paired["steps_per_round"] == 2


def test_the_reference_itself_is_not_paired():
    cell = ModelCell("t", "llama_tiny", REFERENCE, "fp32", "prefill", 64, 2)
    record = run_model_cell(cell, model_cell_spec(paired_rounds=2)).record
    assert record["status"] == "ok" and "the cell is the reference" in record["paired"]["reason"]


@pytest.fixture(scope="module")
def tiny_step():
    model = build_model(model_spec("llama_tiny"), "fp32", CPU, 0)
    cell = ModelCell("t", "llama_tiny", "eager", "fp32", "prefill", 32, 1)
    use_backend(model, "eager", "fp32", False)
    return cell, model, make_step(model, cell, CPU, 0)


def _rounds(tiny_step, switch, rounds=2):
    cell, model, step = tiny_step
    return paired_rounds(cell, step, CPU, None, MeasureSettings(), rounds, 1, switch=switch,
                         implementation=lambda: model.config._attn_implementation)


def test_the_rounds_leave_the_model_on_the_cells_backend(tiny_step):
    cell, model, _ = tiny_step
    _rounds(tiny_step, lambda name: use_backend(model, name, "fp32", False))
    assert model.config._attn_implementation == "eager"


def test_running_out_of_memory_in_a_round_ends_the_rounds_and_keeps_the_ones_measured(tiny_step):
    cell, model, _ = tiny_step
    switches = []

    def switch(name):
        switches.append(name)
        if len(switches) == 4:  # round 1's second backend
            raise torch.OutOfMemoryError("CUDA out of memory. Tried to allocate 2.00 GiB")
        use_backend(model, name, "fp32", False)

    paired = _rounds(tiny_step, switch, rounds=3)
    assert len(paired["rounds"]) == 1 and paired["reason"].startswith("out of memory in round 1")
    assert paired["speed"] is not None and switches[-1] == "eager"
    assert model.config._attn_implementation == "eager"


def test_any_other_error_in_a_round_is_not_swallowed(tiny_step):
    def switch(name):
        raise RuntimeError("a bug")

    with pytest.raises(RuntimeError, match="a bug"):
        _rounds(tiny_step, switch)


# ---- which cells of a suite pair ----------------------------------------------------------
def grid(**over):
    return {"models": ["llama_3_2_1b"], "backends": ["sdpa_default", "custom", "control_energy"],
            "precisions": ["bf16"], "phases": ["prefill"], "seq_lens": [4096], "batches": [1], **over}


def test_a_grids_paired_rounds_reach_only_the_cells_that_pair():
    config = validate_config({"suites": {"m": {"models": {"grids": [
        grid(steps={"paired_rounds": 4}),
        grid(backends=["sdpa_default", "custom"], phases=["train"], compiled=[False, True],
             steps={"paired_rounds": 4}),
        grid(backends=["custom"], seq_lens=[8192]),
    ]}}}})
    steps = {(c.backend, c.phase, c.seq_len, c.compiled): spec["steps"] for c, spec in model_runs(config, "m").items()}
    assert steps[("custom", "prefill", 4096, False)]["paired_rounds"] == 4
    assert steps[("custom", "train", 4096, False)]["paired_rounds"] == 4
    unpaired = [("sdpa_default", "prefill", 4096, False), ("control_energy", "prefill", 4096, False),
                ("custom", "train", 4096, True), ("sdpa_default", "train", 4096, True),
                ("custom", "prefill", 8192, False)]
    for key in unpaired:
        assert "paired_rounds" not in steps[key], key
    # a grid's steps override the section's for its own cells only
    assert steps[("control_energy", "prefill", 4096, False)]["control_settle_s"] > 0


def test_a_suite_without_paired_rounds_keeps_the_specs_it_had():
    plain = validate_config({"suites": {"m": {"models": {"grids": [grid()]}}}})
    zero = validate_config({"suites": {"m": {"models": {"grids": [grid(steps={"paired_rounds": 0})]}}}})
    assert model_runs(plain, "m") == model_runs(zero, "m")


def test_an_unknown_step_in_a_grid_is_refused_naming_its_key():
    with pytest.raises(ConfigError, match=r"suites.m.models.grids\[0\].steps: unknown key\(s\) 'paired'"):
        validate_config({"suites": {"m": {"models": {"grids": [grid(steps={"paired": 3})]}}}})


# ---- the table ---------------------------------------------------------------------------
def test_the_table_carries_the_paired_ratio_and_says_when_the_default_ran_on_another_gpu(tmp_path):
    paths = []
    for backend in ("sdpa_default", "eager"):
        cell = ModelCell("t", "gpt2_tiny", backend, "fp32", "prefill", 64, 2)
        record = run_model_cell(cell, model_cell_spec("gpt2_tiny", paired_rounds=2)).record
        paths.append(tmp_path / cell.path)
        write_record(paths[-1], record)
    rows = model_table(paths).set_index("backend")
    eager = rows.loc["eager"]
    assert eager["paired_rounds"] == 2 and eager["paired_speed"] > 0
    assert eager["paired_speed_min"] <= eager["paired_speed"] <= eager["paired_speed_max"]
    assert rows.loc[REFERENCE, "paired_reason"].startswith("the cell is the reference")
    assert rows["baseline_same_gpu"].isna().all()  # CPU cells name no GPU
    from flashwatt.models.figures import MODEL_FIGURES

    figure = MODEL_FIGURES["model_paired"].render(model_table(paths))
    labels = [t.get_text() for ax in figure.axes for t in ax.get_yticklabels()]
    assert len(labels) == 1 and labels[0].startswith("eager, prefill")  # the reference has no pairing of its own
    assert figure.axes[0].lines  # the point and its range

    from flashwatt.records import read_record

    record = read_record(paths[1])  # joules per token come with NVML, which a CPU cell has not
    record["paired"].update(energy=1.01, energy_range=[0.99, 1.03])
    write_record(paths[1], record)
    eager = model_table(paths).set_index("backend").loc["eager"]
    assert (eager["paired_energy_min"], eager["paired_energy"], eager["paired_energy_max"]) == (0.99, 1.01, 1.03)
    figure = MODEL_FIGURES["model_paired"].render(model_table(paths))
    assert len(figure.axes) == 2 and figure.axes[1].lines

    for path, uuid in zip(paths, ("GPU-a", "GPU-b")):
        record = read_record(path)
        record["device"]["uuid"] = uuid
        write_record(path, record)
    rows = model_table(paths).set_index("backend")
    assert rows.loc["eager", "baseline_same_gpu"] == False  # noqa: E712 - a nullable boolean
    assert rows.loc[REFERENCE, "baseline_same_gpu"] == True  # noqa: E712


def test_the_paired_prefill_overlay_pairs_our_kernel_on_every_llama_prefill_and_leaves_the_default_as_it_was():
    from flashwatt.config import load_config

    plain = model_runs(load_config("config/config.yaml"), "models")
    paired = model_runs(load_config("config/config.yaml", configfiles=["config/overlays/models-paired-prefill.yaml"]),
                        "models")
    ours = {c: s for c, s in paired.items() if c.backend == "custom"}
    assert {(c.model, c.seq_len) for c in ours} == {
        (m, 4096) for m in ("llama_3_2_1b", "llama_3_2_3b", "llama_2_7b", "llama_3_8b")} | {
        (m, 8192) for m in ("llama_3_2_1b", "llama_3_2_3b", "llama_3_8b")}
    assert all(s["steps"]["paired_rounds"] == 5 for s in ours.values())
    for cell, spec in paired.items():
        if cell.backend == REFERENCE:  # the suite's own default records stay current
            assert spec == plain[cell], cell
