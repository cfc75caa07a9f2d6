"""Model cells on several GPUs, on CPU processes over gloo: FSDP2 and context parallelism
(ring, zigzag, Ulysses, hybrid) against one process on the same weights and global batch,
the cell's name and suite keys, the reasons a cell is skipped, the communication
timeline's arithmetic, and a two-process cell run end to end through run_job.

The numerics (tests/models_parallel_worker.py): one spawned process group per world size
(2 and 4) runs every strategy on a tiny Llama (and GPT-2 at 2) in float64 and float32;
loss, gathered logits and every whole gradient must match to 1e-10 (float64) and 2e-6
(float32) relative. A zigzag run with each rank's positions counted from 0 must not.
"""
from __future__ import annotations

import json

import pytest
import torch.multiprocessing as mp

import models_parallel_worker
from flashwatt.config import ConfigError, load_config, validate_config
from flashwatt.models import cell as model_cell
from flashwatt.models.cell import ModelCell
from flashwatt.models.comm_timeline import kind_of, merge, overlap
from flashwatt.models.job import run_model_cell
from flashwatt.models.parallel_layout import STRATEGIES
from flashwatt.models.parallel_job import why_not_parallel
from flashwatt.models.presets import build_config, model_spec, shape_of
from flashwatt.models.recompute import recomputed_blocks
from flashwatt.models.suite import model_runs
from support import free_ports

TOLERANCE = {"float64": 1e-10, "float32": 2e-6}


# ---- the numerics, 2 and 4 processes ----------------------------------------------
# Four processes on the CPU are the heavy tier (`make test-heavy`): the only strategy they add
# is hybrid, whose attention tests/distributed/test_sequence_parallel_cpu.py checks on four
# ranks and whose 2 x 2 job tests/distributed/test_job_cpu.py runs; two processes check every
# other strategy in `make test`.
@pytest.fixture(scope="module", params=[2, pytest.param(4, marks=pytest.mark.heavy)])
def report(request, tmp_path_factory):
    world = request.param
    path = tmp_path_factory.mktemp(f"world{world}") / "report.json"
    mp.spawn(models_parallel_worker.main, args=(world, free_ports()[0], str(path)), nprocs=world, join=True)
    return world, json.loads(path.read_text())


@pytest.mark.slow  # the 2- and 4-process numerics (the report fixture)
def test_every_strategy_matches_one_process_on_loss_logits_and_every_gradient(report):
    world, result = report
    assert not result["failures"], "\n".join(f"{k}:\n{v}" for k, v in result["failures"].items())
    expected = {c[0] for c in models_parallel_worker.cases(world)}
    assert set(result["errors"]) == expected
    strategies = {c[2] for c in models_parallel_worker.cases(world)}
    assert strategies == (set(STRATEGIES) if world == 4 else set(STRATEGIES) - {"hybrid"})
    for name, errors in result["errors"].items():
        tolerance = TOLERANCE[name.rsplit("-", 1)[1]]
        bad = {k: errors[k] for k in ("loss", "logits", "grads") if not errors[k] <= tolerance}
        assert not bad, f"world {world}, {name}: relative error above {tolerance}: {bad} (worst {errors['worst_grad']})"


@pytest.mark.slow  # the 2- and 4-process numerics (the report fixture)
def test_context_parallel_sends_kv_heads_as_they_are_unless_the_all_to_all_cannot_split_them(report):
    world, result = report
    errors = result["errors"]
    assert all(errors[f"{s}-float64"]["block"] == "math" for s in ("ring", "zigzag", "ulysses"))
    assert not errors["ring-float64"]["kv_expanded"] and not errors["zigzag-float64"]["kv_expanded"]
    # llama_tiny has 2 K/V heads: Ulysses over 2 ranks splits them; over 4 each is sent twice.
    assert errors["ulysses-float64"]["kv_expanded"] == (world == 4)
    if world == 4:
        assert not errors["hybrid-float64"]["kv_expanded"]  # 2 Ulysses ranks of a 2 x 2 mesh


@pytest.mark.slow  # the 2- and 4-process numerics (the report fixture)
def test_recompute_of_a_share_reruns_exactly_its_blocks_and_keeps_every_gradient(report):
    """Half of llama_tiny's two blocks recomputed, under FSDP2 (set before fully_shard) and
    zigzag: block 1 checkpointed, its attention run twice in the step (the forward and the
    backward's rerun), block 0's once, and the loss, logits and every gradient those of one
    process without recompute."""
    world, result = report
    assert not result["failures"], "\n".join(f"{k}:\n{v}" for k, v in result["failures"].items())
    assert recomputed_blocks(2, models_parallel_worker.RECOMPUTE_SHARE) == [1]
    assert set(result["recompute"]) == set(models_parallel_worker.RECOMPUTE_STRATEGIES)
    for strategy, errors in result["recompute"].items():
        assert errors["checkpointed"] == [1] and errors["attention_calls"] == [1, 2], (strategy, errors)
        bad = {k: errors[k] for k in ("loss", "logits", "grads") if not errors[k] <= TOLERANCE["float64"]}
        assert not bad, f"world {world}, {strategy} with recompute: relative error above 1e-10: {bad}"


@pytest.mark.slow  # the 2- and 4-process numerics (the report fixture)
def test_positions_counted_from_zero_on_each_rank_are_caught(report):
    """What the comparison sees when the model is given each rank's local positions."""
    world, result = report
    wrong = result["local_positions"]
    assert wrong["logits"] > 1e3 * TOLERANCE["float64"] and wrong["grads"] > 1e-3, wrong


@pytest.mark.slow  # the 2- and 4-process numerics (the report fixture)
def test_a_failure_of_the_checks_one_process_run_reaches_every_rank(report):
    world, result = report
    first, *others = result["rank0_failure"]
    assert first == "RuntimeError: planted failure on rank 0"
    assert len(others) == world - 1 and all(
        m == "RuntimeError: the check's one-process run on rank 0 failed: RuntimeError: planted failure on rank 0"
        for m in others), others


# ---- names and the suite ----------------------------------------------------------
def test_the_cell_lists_the_parallel_modules_strategies():
    assert model_cell.MODEL_STRATEGIES == ("none", *STRATEGIES)
    assert model_cell.CONTEXT_PARALLEL == tuple(s for s in STRATEGIES if s != "fsdp")


@pytest.mark.parametrize("cell, name", [
    (ModelCell("s", "llama_3_8b", "custom", "bf16", "train", 8192, 1, gpus=4, strategy="zigzag"),
     "train-L8192-B1-G4-zigzag"),
    (ModelCell("s", "llama_3_2_1b", "sdpa_default", "bf16", "train", 4096, 2, True, gpus=8, strategy="fsdp"),
     "train-L4096-B2-recompute-G8-fsdp"),
    (ModelCell("s", "llama_3_2_1b", "sdpa_default", "bf16", "train", 4096, 2, True, True),
     "train-L4096-B2-recompute-compiled"),
])
def test_a_multi_gpu_cell_names_its_world_size_and_strategy_and_one_gpu_names_stay(cell, name):
    assert cell.name == name and ModelCell.from_path(cell.path) == cell
    assert ModelCell.from_path("/elsewhere/" + cell.path) == cell


def test_the_global_batch_and_tokens_count_every_gpu():
    fsdp = ModelCell("s", "m", "sdpa_default", "bf16", "train", 1024, 2, gpus=4, strategy="fsdp")
    ring = ModelCell("s", "m", "sdpa_default", "bf16", "train", 1024, 2, gpus=4, strategy="ring")
    assert (fsdp.global_batch, fsdp.tokens) == (8, 8192) and (ring.global_batch, ring.tokens) == (2, 2048)
    assert fsdp.as_row()["gpus"] == 4 and fsdp.as_row()["strategy"] == "fsdp"


@pytest.mark.parametrize("kwargs, message", [
    ({"gpus": 1, "strategy": "fsdp"}, "one GPU takes strategy none"),
    ({"gpus": 2}, "strategy='none' with gpus=2"),
    ({"gpus": 2, "strategy": "stripe"}, "strategy='stripe'"),
    ({"gpus": 4, "strategy": "zigzag", "seq_len": 100}, "seq_len=100 is not divisible by 2 x world size (8)"),
    ({"gpus": 2, "strategy": "hybrid"}, "even world size of at least 4"),
    ({"gpus": 2, "strategy": "fsdp", "compiled": True}, "torch.compile cells run on one GPU"),
    ({"gpus": 0, "strategy": "fsdp"}, "gpus=0"),
])
def test_a_cell_a_strategy_cannot_take_is_refused_naming_why(kwargs, message):
    base = dict(suite="s", model="llama_tiny", backend="sdpa_default", precision="bf16", phase="train", seq_len=64,
                batch=1)
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)")):
        ModelCell(**{**base, **kwargs})


def grid(**over):
    return {"models": ["llama_3_2_1b"], "backends": ["sdpa_default"], "precisions": ["bf16"], "phases": ["train"],
            "seq_lens": [4096], "batches": [1], **over}


def test_gpus_and_strategies_expand_to_one_gpu_and_multi_gpu_cells():
    config = validate_config({"suites": {"m": {"models": {"steps": {"comm_steps": 3}, "grids": [
        grid(gpus=[1, 2, 4], strategies=["fsdp", "zigzag", "hybrid"], compiled=[False, True])]}}}})
    cells = model_runs(config, "m")
    got = sorted((c.gpus, c.strategy, c.compiled) for c in cells)
    assert got == [(1, "none", False), (1, "none", True), (2, "fsdp", False), (2, "zigzag", False),
                   (4, "fsdp", False), (4, "hybrid", False), (4, "zigzag", False)]
    one = next(spec for c, spec in cells.items() if c.gpus == 1)
    many = next(spec for c, spec in cells.items() if c.gpus == 4)
    assert "comm_steps" not in one["steps"] and many["steps"]["comm_steps"] == 3  # one-GPU specs are unchanged


def test_a_grid_without_gpus_gives_the_one_gpu_cells_it_always_gave():
    config = validate_config({"suites": {"m": {"models": {"grids": [grid()]}}}})
    (cell,) = model_runs(config, "m")
    assert (cell.gpus, cell.strategy, cell.name) == (1, "none", "train-L4096-B1")


@pytest.mark.parametrize("over, message", [
    ({"gpus": [2]}, r"suites.m.models.grids\[0\].strategies: gpus 2 needs a strategy"),
    ({"gpus": [2], "strategies": ["stripe"]}, r"grids\[0\].strategies\[0\]: 'stripe' is not allowed"),
    ({"gpus": [4], "strategies": ["ring"], "seq_lens": [100]}, r"grids\[0\]: model cell seq_len=100"),
    ({"gpus": [0], "strategies": ["fsdp"]}, r"grids\[0\].gpus\[0\]"),
])
def test_a_bad_multi_gpu_grid_names_its_key(over, message):
    with pytest.raises(ConfigError, match=message):
        validate_config({"suites": {"m": {"models": {"grids": [grid(**over)]}}}})


def test_the_shipped_models_suites_have_multi_gpu_grids_beside_their_one_gpu_cells():
    config = load_config("config/config.yaml")
    cells = model_runs(config, "models")
    many = [c for c in cells if c.gpus > 1]
    assert {c.strategy for c in many} == set(STRATEGIES) and {c.gpus for c in many} >= {2, 4, 8}
    assert all(c.strategy == "none" and "-G" not in c.name for c in cells if c.gpus == 1)
    smoke = [c for c in model_runs(config, "models_smoke") if c.gpus > 1]  # CPU processes over gloo
    assert {(c.gpus, c.strategy, c.precision) for c in smoke} == {(2, "fsdp", "fp32"), (2, "zigzag", "fp32")}


# ---- why a cell is skipped ---------------------------------------------------------
LLAMA = shape_of(build_config(model_spec("llama_tiny")))  # 4 heads, 2 K/V heads


@pytest.mark.parametrize("cell, device, gpus_here, reason", [
    (ModelCell("t", "llama_tiny", "sdpa_default", "bf16", "train", 64, 1, gpus=4, strategy="fsdp"), "cuda", 1,
     "cell asks for 4 GPUs; this machine has 1"),
    (ModelCell("t", "llama_tiny", "sdpa_default", "bf16", "train", 64, 1, gpus=2, strategy="fsdp"), "cpu", 0,
     "on CPU the models run fp32 only"),
    (ModelCell("t", "llama_tiny", "eager", "fp32", "train", 64, 1, gpus=2, strategy="ring"), "cpu", 0,
     "eager has no context-parallel form"),
    (ModelCell("t", "llama_tiny", "sdpa_efficient", "fp32", "train", 64, 1, gpus=2, strategy="ring"), "cpu", 0,
     "needs a CUDA device"),
    (ModelCell("t", "llama_tiny", "sdpa_default", "bf16", "train", 64, 1, gpus=8, strategy="ulysses"), "cuda", 8,
     "needs the query heads (4) divisible by 8"),
    (ModelCell("t", "llama_tiny", "custom", "fp32", "prefill", 64, 1, gpus=2, strategy="zigzag"), "cpu", 0,
     "custom needs a CUDA device"),
])
def test_a_multi_gpu_cell_that_cannot_run_here_says_why(cell, device, gpus_here, reason):
    got = why_not_parallel(cell, LLAMA, device, gpus_here)
    assert got is not None and reason in got, got


def test_a_skipped_multi_gpu_cell_is_recorded_without_starting_a_process_group():
    cell = ModelCell("t", "llama_tiny", "eager", "fp32", "train", 64, 1, gpus=2, strategy="zigzag")
    record = run_model_cell(cell, {"model": model_spec("llama_tiny"), "measure": {"energy": False}}).record
    assert record["status"] == "skipped" and "no context-parallel form" in record["reason"]
    assert record["cell"]["gpus"] == 2 and record["cell"]["strategy"] == "zigzag"


# ---- the communication timeline ------------------------------------------------------
def test_the_timeline_arithmetic_splits_exposed_from_hidden():
    comm = merge([(0.0, 4.0), (3.0, 6.0), (10.0, 12.0)])
    compute = merge([(1.0, 2.0), (5.0, 11.0)])
    assert comm == [(0.0, 6.0), (10.0, 12.0)]
    assert overlap(comm, compute) == 1.0 + 1.0 + 1.0  # (1,2), (5,6), (10,11)
    assert kind_of("ncclDevKernel_AllGather_RING_LL(ncclDevKernelArgsStorage<4096ul>)") == "allgather"
    assert kind_of("ncclKernel_SendRecv_RING_SIMPLE_Sum_int8_t") == "sendrecv"
    assert kind_of("gloo:all_reduce") == "allreduce"


# ---- a whole cell through run_job ----------------------------------------------------
def _run(cell, tmp_path, monkeypatch):
    from flashwatt.submit.jobs import run_job

    monkeypatch.setenv("FLASHWATT_SLOT_DIR", str(tmp_path / "slots"))
    spec = {"model": model_spec("llama_tiny"), "seed": 0, "measure": {"energy": False},
            "steps": {"warmup_steps": 1, "timed_steps": 2, "attention_steps": 1, "comm_steps": 1}}
    outcome = run_job(run_model_cell, cell, spec, job_name=cell.job_name, folder=tmp_path / "submitit",
                      executor="local", resources={"gpus": cell.gpus, "tasks": 1},
                      log_path=tmp_path / "cell.log")
    return outcome.record


@pytest.mark.slow  # a two-process job through run_job
def test_a_two_process_context_parallel_cell_runs_end_to_end(tmp_path, monkeypatch):
    # recomputing half the blocks: the job hands the cell's share to prepare
    cell = ModelCell("t", "llama_tiny", "sdpa_default", "fp32", "train", 64, 2, recompute=50, gpus=2,
                     strategy="zigzag")
    record = _run(cell, tmp_path, monkeypatch)
    assert record["status"] == "ok", record.get("traceback", record.get("reason"))
    assert record["environment"] == {"NCCL_NVLS_ENABLE": "0", "TORCH_SYMM_MEM_DISABLE_MULTICAST": "1",
                                     "NVSHMEM_DISABLE_NVLS": "1"}
    check = record["check"]
    assert check["passed"] and check["through"] == "zigzag over 2 ranks" and check["causal"]["prefix_change"] == 0
    assert check["logits"]["error"] < 1e-5 and check["grad"]["error"] < 1e-5
    parallel = record["parallel"]
    assert (parallel["world_size"], parallel["global_batch"], parallel["tokens_per_step"]) == (2, 2, 128)
    assert parallel["block"] == "math" and not parallel["kv_expanded"]
    timing = record["timing"]
    for part in ("forward", "backward", "grad_sync", "optimizer", "step"):
        assert timing[f"{part}_ms"] > 0 and len(timing[f"per_rank_{part}_ms"]) == 2
        assert timing[f"{part}_ms"] == max(timing[f"per_rank_{part}_ms"])
    assert timing["tokens_per_s"] == pytest.approx(128 / (timing["step_ms"] / 1e3))
    comm = record["communication"]
    assert comm["method"].startswith("torch.profiler timeline") and len(comm["per_rank"]) == 2
    assert comm["exposed_method"] == "profiler_timeline_within_step_window"
    assert comm["communication_ms"] > 0 and comm["exposed_ms"] + comm["hidden_ms"] == pytest.approx(
        comm["communication_ms"])
    # Exposed communication is a part of the step it was measured in, on every rank.
    for rank in comm["per_rank"]:
        assert 0 <= rank["exposed_ms"] <= rank["communication_ms"] <= rank["step_ms"]
        assert 0 <= rank["exposed_share_of_step"] <= 1
    assert comm["profiled_over_timed_step"] > 0
    assert {"allreduce", "send", "recv"} <= set(comm["by_kind_ms"])  # gradient all-reduce, the ring's transfers
    assert record["energy"]["reason"].startswith("no CUDA device")
    assert [d["type"] for d in record["devices"]] == ["cpu", "cpu"]
    assert record["memory"]["recompute"] == 50 and record["memory"]["recomputed_blocks"] == [1]


@pytest.mark.slow  # a two-process job through run_job
# Heavy: the context-parallel cell above runs the same two-process job through run_job, and
# FSDP's numerics are the report fixture's.
@pytest.mark.heavy
def test_a_two_process_fsdp_cell_runs_end_to_end(tmp_path, monkeypatch):
    cell = ModelCell("t", "llama_tiny", "sdpa_default", "fp32", "train", 64, 1, gpus=2, strategy="fsdp")
    record = _run(cell, tmp_path, monkeypatch)
    assert record["status"] == "ok", record.get("traceback", record.get("reason"))
    assert record["check"]["passed"] and record["check"]["sequences"] == 2
    parallel = record["parallel"]
    assert (parallel["batch_per_gpu"], parallel["global_batch"], parallel["tokens_per_step"]) == (1, 2, 128)
    assert parallel["fsdp"]["units"] == 3 and parallel["fsdp"]["param_dtype"] == "float32"
    assert "grad_sync_ms" not in record["timing"] and record["timing"]["backward_ms"] > 0
    assert record["communication"]["communication_ms"] > 0
    assert record["flops"]["total"] == pytest.approx(record["flops"]["per_token"] * 128)  # the global batch


@pytest.mark.slow  # a two-process job through run_job
# Heavy: tests/distributed/test_rank_faults.py's `oom` case ends an attention cell the same
# way (the same failure policy and rank supervisor) in a third of the CPU.
@pytest.mark.heavy
def test_a_rank_out_of_memory_ends_the_cell_as_oom_naming_the_rank_and_stage(tmp_path, monkeypatch):
    """Rank 1 runs out of memory in its timed steps while rank 0 goes on to the collective
    after them: the cell ends within the failure policy's bound, recorded `oom` with the
    rank and the stage, and no process of it is left."""
    import os
    import time
    from pathlib import Path

    from cell_processes import assert_nothing_left, fault_time
    from flashwatt.models.parallel_job import run_parallel_cell
    from flashwatt.submit.failure_policy import ENV_FAILURE_TIMEOUT, ENV_STOP_GRACE
    from flashwatt.submit.jobs import run_job

    tests = Path(__file__).resolve().parent
    monkeypatch.setenv("FLASHWATT_SLOT_DIR", str(tmp_path / "slots"))
    monkeypatch.setenv("FLASHWATT_POLL_S", "0.2")
    monkeypatch.setenv(ENV_FAILURE_TIMEOUT, "18")
    monkeypatch.setenv(ENV_STOP_GRACE, "2")
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join([str(tests.parent / "src"), str(tests / "distributed"),
                                                      os.environ.get("PYTHONPATH", "")]))
    marks = tmp_path / "marks"
    marks.mkdir()
    cell = ModelCell("t", "llama_tiny", "sdpa_default", "fp32", "train", 64, 2, gpus=2, strategy="zigzag")
    spec = {"model": model_spec("llama_tiny"), "seed": 0, "measure": {"energy": False},
            "steps": {"warmup_steps": 1, "timed_steps": 2, "attention_steps": 1, "comm_steps": 1},
            "fault": {"rank": 1, "marks": str(marks)}}
    outcome = run_job(run_parallel_cell, cell, spec, rank_job="fault_worker:measure_with_fault",
                      job_name=cell.job_name, folder=tmp_path / "submitit", executor="local",
                      resources={"gpus": 2, "tasks": 1}, log_path=tmp_path / "cell.log")
    assert time.time() - fault_time(marks) <= 18
    record = outcome.record
    assert record["status"] == "oom" and record["oom_stage"] == "timed steps", record.get("reason")
    assert record["ranks"]["failed_rank"] == 1 and record["ranks"]["how"] == "oom"
    assert "rank 1" in record["reason"] and "during timed steps" in record["reason"]
    assert record["cell"]["strategy"] == "zigzag" and "timing" not in record  # nothing half-measured kept
    assert_nothing_left(marks)


def test_a_cell_asking_for_more_gpus_than_the_machine_has_is_recorded_skipped(tmp_path, monkeypatch):
    """The local executor cannot start it: the rule records it `skipped` instead of failing."""
    from types import SimpleNamespace

    from flashwatt.cell_job import submit_and_record
    from flashwatt.kinds import kind_named
    from flashwatt.records import read_record

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0")
    monkeypatch.setenv("FLASHWATT_SLOT_DIR", str(tmp_path / "slots"))
    cell = ModelCell("t", "llama_tiny", "sdpa_default", "bf16", "train", 64, 1, gpus=4, strategy="zigzag")
    rule = SimpleNamespace(log=[str(tmp_path / "cell.log")], params=SimpleNamespace(submitit_folder=str(tmp_path)),
                           config={"executor": "local"}, resources={"gpus": 4, "tasks": 4},
                           output=SimpleNamespace(record=str(tmp_path / cell.path),
                                                  trace=str(tmp_path / cell.trace_path)))
    submit_and_record(kind_named("model"), cell, {"model": model_spec("llama_tiny")}, rule)
    record = read_record(tmp_path / cell.path)
    assert record["status"] == "skipped" and "job asks for 4 GPUs; this machine shows 1" in record["reason"]
    assert not (tmp_path / "submitit").exists()  # no job was started


# ---- the table ----------------------------------------------------------------------------
def _record(cell: ModelCell, tokens_per_s: float, j_per_token: float, comm: dict | None = None) -> dict:
    from flashwatt.kinds import envelope_of

    record = envelope_of(cell, {})
    step_ms = cell.tokens / tokens_per_s * 1e3
    record.update(status="ok", device={"name": "NVIDIA H100 80GB HBM3", "type": "cuda"},
                  timing={"step_ms": step_ms, "forward_ms": step_ms / 3, "backward_ms": step_ms / 2,
                          "grad_sync_ms": 1.0 if cell.strategy in ("ring", "zigzag") else None,
                          "optimizer_ms": 2.0, "tokens_per_s": tokens_per_s},
                  memory={"peak_allocated_bytes": 2**30 * (3 - cell.gpus), "peak_reserved_bytes": 2**31},
                  energy={"j_per_token": j_per_token, "n_gpus": cell.gpus}, communication=comm or {},
                  check={"passed": True})
    return record


def test_the_table_splits_communication_and_compares_with_one_gpu(tmp_path):
    from flashwatt.models.figures import MODEL_FIGURES
    from flashwatt.models.summary import model_table
    from flashwatt.records import write_record

    base = dict(suite="t", model="llama_3_2_1b", precision="bf16", phase="train", seq_len=8192, batch=1)
    rows = [(ModelCell(backend="sdpa_default", **base), 10_000.0, 0.02, None),
            (ModelCell(backend="sdpa_default", gpus=2, strategy="fsdp", **base), 18_000.0, 0.022,
             {"communication_ms": 30.0, "exposed_ms": 6.0, "hidden_fraction": 0.8}),
            (ModelCell(backend="sdpa_default", gpus=2, strategy="zigzag", **base), 16_000.0, 0.025,
             {"communication_ms": 20.0, "exposed_ms": 8.0, "hidden_fraction": 0.6}),
            (ModelCell(backend="custom", gpus=2, strategy="zigzag", **base), 17_600.0, 0.024, None)]
    paths = []
    for cell, tps, jpt, comm in rows:
        write_record(tmp_path / cell.path, _record(cell, tps, jpt, comm))
        paths.append(tmp_path / cell.path)
    table = model_table(paths).set_index(["backend", "gpus", "strategy"])
    fsdp, zigzag = table.loc[("sdpa_default", 2, "fsdp")], table.loc[("sdpa_default", 2, "zigzag")]
    assert fsdp["global_batch"] == 2 and zigzag["global_batch"] == 1
    assert fsdp["speedup_vs_one_gpu"] == pytest.approx(1.8) and fsdp["scaling_efficiency"] == pytest.approx(0.9)
    assert zigzag["exposed_communication_ms"] == 8.0 and zigzag["hidden_communication_fraction"] == 0.6
    assert zigzag["grad_sync_ms"] == 1.0 and pd_isnan(fsdp["grad_sync_ms"]) and zigzag["energy_gpus"] == 2
    custom = table.loc[("custom", 2, "zigzag")]
    assert custom["speedup_vs_sdpa_default"] == pytest.approx(1.1)  # against the SDPA default on 2 GPUs, zigzag
    assert pd_isnan(custom["speedup_vs_one_gpu"])  # no one-GPU custom cell in the suite
    assert table.loc[("sdpa_default", 1, "none"), "speedup_vs_one_gpu"] == 1.0
    figure = MODEL_FIGURES["model_throughput"].render(model_table(paths))
    labels = {t.get_text() for ax in figure.axes for t in ax.get_yticklabels()}
    assert any("2 GPUs zigzag" in label for label in labels) and any("2 GPUs fsdp" in label for label in labels)


def pd_isnan(value) -> bool:
    return value != value
