"""Distributed cells in the pipeline: names and paths, the suite's `distributed` section,
the table the records become and its figures. (The job itself: tests/distributed; a whole
run on CPU processes: tests/workflow/test_user_paths.py.)"""
from __future__ import annotations

import copy

import pandas as pd
import pytest

from flashwatt.config import ConfigError, load_config, validate_config
from flashwatt.kinds import every_cell
from flashwatt.settings import measure_settings
from flashwatt.distributed.cell import DistributedCell
from flashwatt.distributed.cell_run import outcome_of
from flashwatt.kinds import envelope_of
from flashwatt.distributed.figures import DISTRIBUTED_FIGURES
from flashwatt.distributed.suite import distributed_runs
from flashwatt.distributed.summary import distributed_table
from flashwatt.records import write_record

CELLS = [
    DistributedCell("s", "zigzag", "flash", "bf16", 4, 131072, 1, 32, 8, 128, True, "fwd_bwd"),
    DistributedCell("s", "ulysses", "math", "fp64", 2, 16, 1, 2, 2, 8),
    DistributedCell("s", "hybrid", "custom", "fp16", 8, 8192, 2, 16, 16, 64, False, "fwd"),
]


@pytest.mark.parametrize("cell", CELLS, ids=lambda c: c.method)
def test_a_distributed_cell_is_found_again_from_its_path(cell):
    assert DistributedCell.from_path(cell.path) == cell
    assert DistributedCell.from_path("/elsewhere/" + cell.path) == cell
    assert cell.path.startswith(f"results/cells/s/distributed/{cell.method}/{cell.precision}/G{cell.gpus}-")


def test_the_spec_is_what_the_job_reads():
    from flashwatt.distributed.job import REQUIRED

    spec = CELLS[0].spec(repeats=5)
    assert set(REQUIRED) <= set(spec) and spec["repeats"] == 5 and spec["pass"] == "fwd_bwd"
    assert (spec["gpus"], spec["seq_len"], spec["kv_heads"]) == (4, 131072, 8)


@pytest.mark.parametrize("kwargs, message", [
    ({"strategy": "zigzag", "gpus": 4, "seq_len": 100}, "seq_len=100 is not divisible by 2 x world size (8) for strategy zigzag"),
    ({"strategy": "ulysses", "gpus": 4, "heads": 6, "kv_heads": 6}, "strategy ulysses needs heads (6)"),
    ({"strategy": "ring", "heads": 6, "kv_heads": 4}, "heads=6 is not a multiple of kv_heads=4"),
    ({"strategy": "stripe"}, "strategy='stripe'"),
    ({"strategy": "ring", "block": "triton"}, "block='triton'"),
])
def test_a_cell_a_strategy_cannot_run_is_refused_naming_why(kwargs, message):
    base = dict(suite="s", strategy="ring", block="math", precision="fp64", gpus=2, seq_len=64, batch=1, heads=4,
                kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DistributedCell(**{**base, **kwargs})


def test_a_cell_over_several_nodes_is_named_planned_and_placed_one_task_per_node():
    from flashwatt.kinds import kind_named

    cell = DistributedCell("s", "hybrid", "flash", "bf16", 16, 131072, 1, 32, 8, 128, True, "fwd_bwd", nodes=2)
    assert cell.name == "G16-N2-L131072-B1-H32-K8-D128-causal-fwd_bwd"
    assert DistributedCell.from_path(cell.path) == cell and cell.as_row()["nodes"] == 2
    assert cell.spec()["nodes"] == 2 and "nodes" not in CELLS[0].spec()  # one-node specs (and paths) unchanged
    assert kind_named("distributed").resources(cell) == {"gpus": 8, "tasks": 1, "nodes": 2, "runtime": 60}
    assert kind_named("distributed").resources(CELLS[0]) == {"gpus": 4, "tasks": 1, "nodes": 1, "runtime": 60}
    config = validate_config({"suites": {"d": {"distributed": {"grids": [
        grid(strategies=["hybrid", "zigzag"], gpus=[4, 8], heads=[4], seq_lens=[32], nodes=[1, 2])]}}}})
    assert sorted((c.strategy, c.gpus, c.nodes) for c in distributed_runs(config, "d")) == [
        (s, g, n) for s in ("hybrid", "zigzag") for g in (4, 8) for n in (1, 2)]


@pytest.mark.parametrize("kwargs, message", [
    ({"gpus": 6, "nodes": 4, "seq_len": 48}, "gpus=6 cannot be split evenly over nodes=4"),
    ({"strategy": "hybrid", "gpus": 8, "nodes": 2, "heads": 6, "kv_heads": 2, "seq_len": 64},
     "its Ulysses all-to-all inside a node (4 GPUs) needs heads (6) divisible by it"),
    ({"nodes": 0}, "nodes=0: must be a positive integer"),
])
def test_a_cell_over_nodes_it_cannot_split_is_refused(kwargs, message):
    base = dict(suite="s", strategy="ring", block="math", precision="fp64", gpus=2, seq_len=64, batch=1, heads=4,
                kv_heads=2, head_dim=8)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        DistributedCell(**{**base, **kwargs})


def test_the_local_executor_records_a_cell_over_several_nodes_skipped(tmp_path, monkeypatch):
    from types import SimpleNamespace

    from flashwatt.cell_job import submit_and_record
    from flashwatt.kinds import kind_named
    from flashwatt.records import read_record

    monkeypatch.setenv("FLASHWATT_SLOT_DIR", str(tmp_path / "slots"))
    cell = DistributedCell("s", "hybrid", "math", "fp64", 4, 16, 1, 4, 2, 8, True, "fwd_bwd", nodes=2)
    kind = kind_named("distributed")
    rule = SimpleNamespace(log=[str(tmp_path / "cell.log")], params=SimpleNamespace(submitit_folder=str(tmp_path)),
                           config={"executor": "local"}, resources=kind.resources(cell),
                           output=SimpleNamespace(record=str(tmp_path / cell.path),
                                                  trace=str(tmp_path / cell.trace_path)))
    submit_and_record(kind, cell, cell.spec(), rule)
    record = read_record(tmp_path / cell.path)
    assert record["status"] == "skipped" and "spans 2 nodes (run it with executor: slurm)" in record["reason"]
    assert not (tmp_path / "submitit").exists()


def grid(**over):
    g = {"strategies": ["ring"], "gpus": [2], "blocks": ["math"], "precisions": ["fp64"], "seq_lens": [16],
         "batches": [1], "heads": [2], "kv_heads": [2], "head_dims": [8]}
    return {**g, **over}


def test_the_distributed_section_expands_to_cells_with_their_specs():
    config = validate_config({"suites": {"d": {"distributed": {"repeats": 4, "grids": [
        grid(strategies=["ring", "ulysses"], gpus=[1, 2], passes=["fwd", "fwd_bwd"])]}}}})
    runs = distributed_runs(config, "d")
    assert len(runs) == 2 * 2 * 2
    assert all(spec["repeats"] == 4 and spec["warmup"] == 3 for spec in runs.values())
    assert all(spec["measure"] == measure_settings(config, "d") for spec in runs.values())
    assert every_cell(config, "d") == list(runs)


@pytest.mark.parametrize("section, message", [
    ({"grids": [grid(seq_lens=[18], gpus=[4])]}, r"suites.d.distributed.grids\[0\]: distributed cell seq_len=18"),
    ({"grids": [grid(strategies=["stripe"])]}, r"grids\[0\].strategies\[0\]: 'stripe' is not allowed"),
    ({"grids": [grid(gpus=[0])]}, r"grids\[0\].gpus\[0\]"),
    ({"grids": [{k: v for k, v in grid().items() if k != "kv_heads"}]}, "kv_heads"),
])
def test_a_bad_distributed_section_names_its_key(section, message):
    with pytest.raises(ConfigError, match=message):
        validate_config({"suites": {"d": {"distributed": section}}})


def test_the_shipped_distributed_suite_covers_the_seed_and_llama_shapes():
    cells = list(distributed_runs(load_config("config/config.yaml"), "distributed"))
    assert {c.gpus for c in cells} == {1, 2, 4, 8}
    seed = [c for c in cells if c.heads == 1]
    assert {c.precision for c in seed} == {"fp32"} and {c.head_dim for c in seed} == {64, 128}
    assert max(c.seq_len for c in seed) == 65536
    llama = [c for c in cells if c.heads == 32]
    assert {(c.kv_heads, c.head_dim, c.precision, c.causal, c.pass_) for c in llama} == {(8, 128, "bf16", True, "fwd_bwd")}
    assert {c.strategy for c in llama} == {"ring", "zigzag", "ulysses"}


# ---- the table and its figures ----------------------------------------------------
def result(gpus: int, total_ms: float, one_ms: float, error: float, passed: bool = True) -> dict:
    return {"status": "ok", "device": "NVIDIA H100 80GB HBM3", "world_size": gpus, "nodes": 1,
            "time": {"forward_ms": total_ms / 3, "backward_ms": 2 * total_ms / 3, "total_ms": total_ms,
                     "method": "cuda_events"},
            "communication": {"forward": {"exposed_ms": 0.1, "hidden_fraction": 0.8},
                              "backward": {"exposed_ms": 0.2, "hidden_fraction": 0.7}},
            "tflops": {"total": 100.0 * gpus, "per_gpu": 100.0},
            "single_gpu": {"total_ms": one_ms, "energy": {"energy_per_call_j": 5.0}},
            "energy": {"energy_per_call_j": 5.0 * (1 + 0.05 * gpus), "j_per_token": 5.0 * (1 + 0.05 * gpus) / 8192,
                       "avg_power_w": 600.0 * gpus, "n_gpus": gpus, "flags": []},
            "energy_ratio_to_one_gpu": 1 + 0.05 * gpus,
            "speedup": one_ms / total_ms, "efficiency": one_ms / total_ms / gpus,
            "memory": {"peak_bytes_per_gpu": [2**30 // gpus, 2**30 // gpus + 5], "ratio_to_one_gpu": 1 / gpus},
            "check": {"passed": passed, "error": {"out": error, "dq": 2 * error, "dk": error, "dv": error},
                      "tolerance": {"out": 1e-2, "dq": 1e-2, "dk": 1e-2, "dv": 1e-2},
                      "single_gpu_error": {"out": error, "dq": error}}}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


@pytest.fixture
def table(tmp_path):
    paths = []
    for gpus, total in ((1, 10.0), (2, 5.5), (4, 3.0)):
        cell = DistributedCell("s", "zigzag", "flash", "bf16", gpus, 8192, 1, 32, 8, 128, True, "fwd_bwd")
        res = result(gpus, total, 10.0, 1e-3 * gpus)
        record = envelope_of(cell, cell.spec())
        record["status"], record["reason"] = outcome_of(res)
        record["result"] = {k: v for k, v in res.items() if k != "status"}
        write_record(tmp_path / cell.path, record)
        paths.append(tmp_path / cell.path)
    skipped = DistributedCell("s", "zigzag", "flash", "bf16", 8, 8192, 1, 32, 8, 128, True, "fwd_bwd")
    record = envelope_of(skipped, skipped.spec())
    record.update(status="skipped", reason="cell asks for 8 GPUs; this machine has 4")
    write_record(tmp_path / skipped.path, record)
    paths.append(tmp_path / skipped.path)
    return distributed_table(paths)


def test_the_table_has_a_row_per_cell_with_scaling_memory_and_errors(table):
    assert list(table["gpus"]) == [1, 2, 4, 8]
    assert list(table["status"]) == ["ok", "ok", "ok", "skipped"]
    two = table.set_index("gpus").loc[2]
    assert two["speedup"] == pytest.approx(10.0 / 5.5) and two["efficiency"] == pytest.approx(10.0 / 5.5 / 2)
    assert two["peak_bytes_per_gpu"] == 2**30 // 2 + 5  # the largest rank's
    assert two["error_dq"] == pytest.approx(4e-3) and bool(two["check_passed"])
    assert two["energy_per_call_j"] == pytest.approx(5.5) and two["single_gpu_energy_per_call_j"] == 5.0
    assert two["energy_ratio_to_one_gpu"] == pytest.approx(1.1) and two["energy_gpus"] == 2
    assert two["avg_power_w"] == 1200.0 and pd.isna(two["energy_flags"])
    assert "this machine has 4" in table.set_index("gpus").loc[8, "reason"]


def test_a_failed_check_makes_the_cell_incorrect_naming_the_tensor():
    status, reason = outcome_of(result(2, 5.0, 10.0, 2e-2, passed=False))
    assert status == "incorrect" and "dq 0.04 (tol 0.01)" in reason and "out 0.02" in reason
    assert outcome_of({"status": "failed", "reason": "OutOfMemoryError: CUDA out of memory"})[0] == "oom"
    assert outcome_of({"status": "failed", "reason": "RuntimeError: NCCL timeout"})[0] == "error"


def test_scaling_figure_draws_speedup_and_efficiency_per_strategy(table):
    fig = DISTRIBUTED_FIGURES["distributed_scaling"].render(table)
    lines = [line for ax in fig.axes for line in ax.lines if line.get_label() not in ("ideal",) and len(line.get_xdata())]
    ys = sorted(tuple(round(float(y), 4) for y in line.get_ydata()) for line in lines if len(line.get_xdata()) == 3)
    assert (1.0, round(10 / 5.5, 4), round(10 / 3.0, 4)) in ys  # speedup at 1, 2, 4 GPUs
    assert "3 of 4 cells ok" in fig._suptitle.get_text()


def test_energy_figure_draws_joules_per_token_and_the_ratio_to_one_gpu(table):
    fig = DISTRIBUTED_FIGURES["distributed_energy"].render(table)
    ys = sorted(tuple(round(float(y), 4) for y in line.get_ydata()) for ax in fig.axes for line in ax.lines
                if line.get_label() != "one GPU" and len(line.get_xdata()) == 3)
    assert (1.05, 1.1, 1.2) in ys  # energy against one GPU at 1, 2 and 4 GPUs
    assert tuple(round(5.0 * (1 + 0.05 * g) / 8192 * 1e3, 4) for g in (1, 2, 4)) in ys  # mJ per token


def test_every_distributed_figure_says_why_when_nothing_ran(table):
    nothing = table.assign(status="skipped", reason="no CUDA device for a bf16 cell (CPU runs take precision fp64)")
    for name, figure in DISTRIBUTED_FIGURES.items():
        text = " ".join(t.get_text() for ax in figure.render(nothing).axes for t in ax.texts)
        assert text.startswith("Nothing to draw.") and "no CUDA device" in text, (name, text)
    for name, figure in DISTRIBUTED_FIGURES.items():
        figure.render(table)  # and each draws the ok cells


def test_a_suite_may_hold_every_kind_of_cell():
    config = copy.deepcopy(load_config("config/config.yaml"))
    config["suites"]["smoke"]["distributed"] = {"grids": [grid()]}
    config["suites"]["smoke"]["control"] = {"runs": [{"mode": "energy"}]}
    kinds = {type(c).__name__ for c in every_cell(validate_config(config), "smoke")}
    assert kinds == {"Cell", "ControlCell", "DistributedCell"}
