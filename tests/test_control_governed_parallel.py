"""A governed model cell on several GPUs, on CPU: the cell's rank supervisor starts two gloo
ranks that run a tiny Llama's FSDP2 training step as the multi-GPU job does
(flashwatt.models.governed_parallel), each rank reading a fake NVML board of its own (tests/control_cell_worker.py): its uniform static front,
then a budget run whose ranks share one budget. What it proves: the job's glue (the ranks
agree on every step, the front and the run land in rank 0's record, every GPU's power and the
total in its trace, no NVML setter asked for); how well the budget is held on simulated GPUs
is tests/test_control_job_power.py's."""
from __future__ import annotations

import copy
import json
import os
import statistics
from pathlib import Path

import pytest

from flashwatt.config import validate_config
from flashwatt.models.cell import ModelCell
from flashwatt.models.suite import model_runs

TESTS = Path(__file__).resolve().parent


def specs() -> dict[ModelCell, dict]:
    config = validate_config({"suites": {"m": {"models": {"grids": [{
        "models": ["llama_tiny"], "backends": ["sdpa_default"], "precisions": ["fp32"], "phases": ["train"],
        "seq_lens": [32], "batches": [1], "gpus": [2], "strategies": ["fsdp"],
        "governors": [{"mode": "front"}, {"mode": "budget", "budgets_w": [400]}],
        "governor": {"seconds": 2.0, "front": {"duties": [1.0, 0.5], "seconds": 0.8}},
        "steps": {"warmup_steps": 1}}]}}}})
    return {cell: copy.deepcopy(spec) for cell, spec in model_runs(config, "m").items()}


# Heavy: two gloo ranks training through four governed runs; `make test` keeps a governed
# model cell's front and budget on one rank (tests/test_control_governed_cells.py) and ranks
# sharing one budget (tests/test_control_job_power.py).
@pytest.mark.heavy
def test_a_governed_two_rank_cell_runs_its_front_and_a_shared_budget(tmp_path, monkeypatch):
    from flashwatt.models.parallel_job import run_parallel_cell

    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(TESTS.parent / "src"), str(TESTS),
                                                      os.environ.get("PYTHONPATH", "")]))
    monkeypatch.setenv("OMP_NUM_THREADS", "1")
    cells = specs()
    for cell in sorted(cells, key=lambda c: c.governor != "front"):  # the front first, as a suite would
        # the cell's rank supervisor starts its two ranks, as the multi-GPU job does on a node
        outcome = run_parallel_cell(cell, {**cells[cell], "fake_board": {"out": str(tmp_path)}},
                                    rank_job="control_cell_worker:measure_on_fake_board")
        name = Path(cell.path).stem
        (tmp_path / f"{name}.json").write_text(json.dumps(outcome.record, default=str))
        (tmp_path / f"{name}.trace.json").write_text(json.dumps(outcome.trace, default=str))
    setters = sorted(tmp_path.glob("setters-*-rank*.json"))
    assert len(setters) == 4 and all(json.loads(f.read_text()) == [] for f in setters), setters
    front = json.loads((tmp_path / "train-L32-B1-G2-fsdp-gov-front.json").read_text())
    assert front["status"] == "ok", front.get("traceback") or front.get("reason")
    assert [(r["config"], r["duty"]) for r in front["front"]] == [("unchanged", 1.0), ("unchanged", 0.5)]
    assert all(r.get("tokens_per_s") for r in front["front"])
    # Paced at half duty: every rank idled for about as long as it worked in each step. (Not
    # the two points' rates compared: each is measured in its own second, and on a shared
    # machine the load of one second is not the next one's.)
    for rank in (0, 1):
        full, half = json.loads((tmp_path / f"runs-front-rank{rank}.json").read_text())
        assert full["slept_s"] == 0 and half["steps"] >= 1, (rank, full, half)
        assert 0.3 < half["slept_s"] / half["wall_s"] < 0.7, (rank, half)
    run = json.loads((tmp_path / "train-L32-B1-G2-fsdp-gov-budget400w.json").read_text())
    assert run["status"] == "ok", run.get("traceback") or run.get("reason")
    control = run["control"]
    assert control["nvml_answering"] == [True, True] and control["fault"] is None
    assert control["merit"]["windows"] >= 1 and control["merit"]["idle_w"] > 200  # both boards' idle, summed
    assert control["warm_start"]["shapes"] == 1  # where rank 0's knowledge came from (no cache off CUDA)
    trace = json.loads((tmp_path / "train-L32-B1-G2-fsdp-gov-budget400w.trace.json").read_text())
    assert trace and all(row["source"] == "controller" for row in trace)
    late = trace[-1]
    assert late["power_w_rank0"] < late["power_w_rank1"]  # each board's own reading (100 W and 120 W)
    # and the job's total: the boards' readings summed, or, where a step's pacing cycle outlasts
    # a tick (a loaded machine), the summed energy counters' average over the cycle, the same
    # watts on these steady boards but for the counters' timing: each rank reads its counter at
    # its own moment, and on a loaded machine one tick's average was 4% off (229 W for 220 W).
    # The median over the run's second half holds the same watts.
    rows = [r for r in trace[len(trace) // 2:]
            if None not in (r.get("power_w"), r.get("power_w_rank0"), r.get("power_w_rank1"))]
    assert len(rows) >= 5, len(trace)
    ratio = statistics.median(r["power_w"] / (r["power_w_rank0"] + r["power_w_rank1"]) for r in rows)
    assert abs(ratio - 1.0) < 0.02, [(r["power_w"], r["power_w_rank0"] + r["power_w_rank1"]) for r in rows]
