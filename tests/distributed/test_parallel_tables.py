"""docs/parallel.md from synthetic tables: records made up to known numbers, turned into the
suites' real tables (flashwatt.distributed.summary, flashwatt.models.summary), then into the
document, whose speedups, reasons and targets are checked against what the numbers imply."""
from __future__ import annotations

import re

import pytest

from flashwatt.distributed.cell import DistributedCell
from flashwatt.distributed.parallel_reasons import attention_reason, model_reason, ring_causal_cap
from flashwatt.distributed.parallel_tables import main, model_rows, parallel_markdown
from flashwatt.distributed.summary import distributed_table
from flashwatt.kinds import envelope_of
from flashwatt.models.cell import ModelCell
from flashwatt.models.summary import model_table
from flashwatt.records import write_record

H100 = "NVIDIA H100 80GB HBM3"
GIB = 2 ** 30


def attention_record(cell: DistributedCell, total_ms: float, single_ms: float, exposed_ms: float,
                     status: str = "ok") -> dict:
    record = envelope_of(cell, cell.spec())
    record["status"] = status
    if status != "ok":
        record["reason"] = "rank 1 (pid 7, h) killed by SIGKILL 3.0 s in"
        return record
    speedup = single_ms / total_ms
    record["result"] = {
        "device": H100, "world_size": cell.gpus, "nodes": cell.nodes,
        "time": {"forward_ms": total_ms / 3, "backward_ms": 2 * total_ms / 3, "total_ms": total_ms},
        "communication": {"forward": {"exposed_ms": exposed_ms / 3}, "backward": {"exposed_ms": 2 * exposed_ms / 3}},
        "tflops": {"total": 400.0 * cell.gpus * speedup / cell.gpus, "per_gpu": 400.0 * speedup / cell.gpus},
        "single_gpu": {"total_ms": single_ms, "energy": {"energy_per_call_j": 1.0}},
        "speedup": speedup, "efficiency": speedup / cell.gpus,
        "memory": {"peak_bytes_per_gpu": [GIB * 10 // cell.gpus] * cell.gpus, "ratio_to_one_gpu": 1 / cell.gpus},
        "check": {"passed": True, "error": {"out": 1e-3}, "tolerance": {"out": 2e-3}, "single_gpu_error": {}},
        "energy": {"energy_per_call_j": cell.gpus * total_ms / single_ms, "j_per_token": 1e-4, "n_gpus": cell.gpus},
        "energy_ratio_to_one_gpu": cell.gpus * total_ms / single_ms}
    return record


def model_record(cell: ModelCell, step_ms: float, optimizer_ms: float, peak_gib: float, exposed_share: float | None,
                 mfu: float = 0.38) -> dict:
    record = envelope_of(cell, {})
    record.update(status="ok", device={"name": H100, "type": "cuda", "uuid": f"GPU-{cell.gpus}"},
                  timing={"step_ms": step_ms, "optimizer_ms": optimizer_ms,
                          "grad_sync_ms": 12.0 if cell.strategy in ("ring", "zigzag", "ulysses") else None,
                          "tokens_per_s": cell.tokens / (step_ms / 1e3)},
                  memory={"peak_allocated_bytes": peak_gib * GIB}, flops={"mfu": mfu},
                  energy={"j_per_token": 2e-5 * cell.gpus, "n_gpus": cell.gpus}, check={"passed": True},
                  communication={} if exposed_share is None else {
                      "exposed_share_of_step": exposed_share, "exposed_ms": exposed_share * step_ms * 1.2,
                      "exposed_method": "profiler_timeline_within_step_window"})
    return record


LLAMA_ATTENTION = dict(suite="distributed", block="cudnn", precision="bf16", seq_len=131072, batch=1, heads=32,
                       kv_heads=8, head_dim=128, causal=True, pass_="fwd_bwd")


@pytest.fixture
def tables(tmp_path):
    seed = dict(suite="distributed", block="auto", precision="fp32", seq_len=8192, batch=1, heads=1, kv_heads=1,
                head_dim=128)
    attention = [
        (DistributedCell(strategy="zigzag", gpus=4, **LLAMA_ATTENTION), 248.0, 911.0, 3.0, "ok"),
        (DistributedCell(strategy="ulysses", gpus=4, **LLAMA_ATTENTION), 245.0, 911.0, 4.0, "ok"),
        (DistributedCell(strategy="ring", gpus=4, **LLAMA_ATTENTION), 419.0, 911.0, 5.0, "ok"),
        (DistributedCell(strategy="zigzag", gpus=2, **seed), 1.21, 0.95, 0.21, "ok"),
        (DistributedCell(strategy="ring", gpus=2, **seed), 1.0, 1.0, 0.0, "job_failed"),
    ]
    paths = []
    for cell, total, single, exposed, status in attention:
        write_record(tmp_path / cell.path, attention_record(cell, total, single, exposed, status))
        paths.append(tmp_path / cell.path)
    base = dict(suite="models", model="llama_3_2_1b", backend="sdpa_default", precision="bf16", phase="train",
                seq_len=8192, batch=1)
    models = [(ModelCell(**base), 191.5, 6.5, 32.1, None),
              (ModelCell(gpus=4, strategy="fsdp", **base), 205.0, 3.0, 20.0, 0.05),
              (ModelCell(gpus=4, strategy="zigzag", **base), 178.0, 6.4, 30.0, 0.30)]
    model_paths = []
    for cell, step, optimizer, peak, share in models:
        write_record(tmp_path / cell.path, model_record(cell, step, optimizer, peak, share))
        model_paths.append(tmp_path / cell.path)
    eight_b = ModelCell(suite="models", model="llama_3_8b", backend="sdpa_default", precision="bf16", phase="train",
                        seq_len=8192, batch=1, recompute=True, gpus=4, strategy="fsdp")
    write_record(tmp_path / eight_b.path, model_record(eight_b, 590.0, 40.0, 60.0, 0.04, mfu=0.36))
    model_paths.append(tmp_path / eight_b.path)
    return distributed_table(paths), model_table(model_paths)


def _row(text: str, *needles: str) -> str:
    lines = [line for line in text.splitlines() if line.startswith("|") and all(n in line for n in needles)]
    assert len(lines) == 1, (needles, lines)
    return lines[0]


def test_the_document_has_speedup_efficiency_memory_communication_energy_and_why(tables):
    text = parallel_markdown(*tables, command="python -m flashwatt.distributed.parallel_tables")
    assert f"Devices: {H100}." in text
    zigzag = _row(text, "zigzag, cudnn", "| 4 H100 |")
    assert "3.67x" in zigzag and "0.92" in zigzag and "| 2.50 |" in zigzag and "scales" in zigzag
    ring = _row(text, "ring, cudnn")
    assert "2.17x" in ring and f"capping the speedup at {ring_causal_cap(4):.2f}x" in ring and "2.29x" in ring
    small = _row(text, "zigzag, auto")
    # compute 1.0 ms against an ideal of 0.475: 32 query tiles of 128 rows on each rank
    assert "the blocks take 2.11x their share" in small and "32 query tiles" in small
    assert "too few tiles per rank" in small
    assert "- `distributed/distributed/ring-auto/fp32/G2-L8192" in text and "job_failed (rank 1" in text


def test_model_rows_say_where_the_step_went_against_one_gpu(tables):
    text = parallel_markdown(*tables, command="x")
    fsdp = _row(text, "llama_3_2_1b, sdpa_default", "4 H100, fsdp")
    assert "93% of linear" in fsdp and "weights sharded: peak 0.62x" in fsdp and "0.93" in fsdp
    zigzag = _row(text, "llama_3_2_1b, sdpa_default", "4 H100, zigzag")
    # ideal 191.5 / 4 = 47.9 ms; exposed 0.30 x 178 = 53.4; whole optimizer 6.4 - 6.5 / 4 = 4.8; the rest compute
    assert "27% of linear: the step is 130 ms over its ideal" in zigzag
    assert re.search(r"72 ms of compute that did not shrink with the GPUs, 53 ms exposed communication, the "
                     r"gradient all-reduce's 12 ms among it, 5 ms of the whole optimizer on every GPU", zigzag), zigzag
    assert "weights replicated under CP: peak 0.93x" in zigzag and "53.4 (30%)" in zigzag
    assert "no one-GPU cell of the same step" in _row(text, "llama_3_8b")


def test_the_targets_are_checked_against_the_cells_that_speak_to_them(tables):
    text = parallel_markdown(*tables, command="x")
    four = _row(text, "L 128k, fwd+bwd, 4 GPUs")
    assert "zigzag/cudnn on 4 H100: 3.67" in four and "ulysses/cudnn on 4 H100: 3.72" in four and four.rstrip().endswith("| met |")
    assert "not measured" in _row(text, "8 GPUs: speedup")
    fsdp = _row(text, "Llama-3.2-1B training step, 4 GPUs")  # 4 x 191.5 / 205 tokens per second
    assert "fsdp/sdpa_default on 4 H100: 3.74" in fsdp and fsdp.rstrip().endswith("| met |")
    eight_b = _row(text, "Llama-3-8B training step")
    assert "fsdp/sdpa_default, recompute on 4 H100: 0.36" in eight_b and eight_b.rstrip().endswith("| not met |")


def test_main_writes_the_file_from_the_suites_tables(tables, tmp_path):
    distributed, models = tables
    (tmp_path / "results" / "distributed").mkdir(parents=True)
    (tmp_path / "results" / "models").mkdir(parents=True)
    distributed.to_parquet(tmp_path / "results" / "distributed" / "distributed.parquet")
    models.to_parquet(tmp_path / "results" / "models" / "models.parquet")
    out = tmp_path / "docs" / "parallel.md"
    assert main(["--results", str(tmp_path / "results"), "--out", str(out)]) == 0
    text = out.read_text()
    assert text.startswith("# Several GPUs") and "--suites distributed models" in text
    assert text.count("| zigzag, cudnn |") == 1


def test_a_cell_without_its_one_gpu_time_says_so_instead_of_guessing():
    row = {"status": "ok", "total_ms": 10.0, "single_gpu_total_ms": None, "gpus": 2}
    assert attention_reason(row) == "no one-GPU time in the same job to compare with"
    assert model_rows(model_table([])).empty


def test_folders_from_two_machines_go_into_one_document_each_row_against_its_own_one_gpu_cell(tmp_path):
    base = dict(suite="models", model="llama_3_2_1b", backend="sdpa_default", precision="bf16", phase="train",
                seq_len=8192, batch=1)
    machines = {"results-g2": [(ModelCell(**base), 240.0), (ModelCell(gpus=2, strategy="fsdp", **base), 250.0)],
                "results-g4": [(ModelCell(**base), 190.0), (ModelCell(gpus=4, strategy="fsdp", **base), 200.0)]}
    for root, cells in machines.items():
        paths = []
        for cell, step in cells:
            write_record(tmp_path / root / "cells" / cell.path, model_record(cell, step, 5.0, 20.0, 0.02))
            paths.append(tmp_path / root / "cells" / cell.path)
        (tmp_path / root / "models").mkdir(parents=True)
        model_table(paths).to_parquet(tmp_path / root / "models" / "models.parquet")
    out = tmp_path / "parallel.md"
    assert main(["--results", str(tmp_path / "results-g2"), str(tmp_path / "results-g4"), "--suites", "models",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert f"--results {tmp_path / 'results-g2'} {tmp_path / 'results-g4'} --suites models" in text
    # each machine's ideal is its own one-GPU step: 240 ms on the first, 190 ms on the second
    two, four = _row(text, "| 2 H100, fsdp |"), _row(text, "| 4 H100, fsdp |")
    assert "96% of linear" in two and "240 ms" in two and "1.92x" in two
    assert "95% of linear" in four and "190 ms" in four and "3.80x" in four


def test_a_table_from_before_recompute_shares_reads_as_percents_beside_a_share_that_meets_the_mfu_target(tmp_path):
    """A folder aggregated when `recompute` was true/false (its one-GPU and 4-GPU 1B cells,
    the 8B recomputing every block) beside one with the 8B recomputing half its blocks: the
    old rows still find their one-GPU cell, each 8B row names its share, and the MFU target
    is met by the share that reaches it (the shares are settings of one step to choose among)."""
    base = dict(suite="models", backend="sdpa_default", precision="bf16", phase="train", seq_len=8192, batch=1)
    eight_b = dict(model="llama_3_8b", gpus=4, strategy="fsdp", **base)
    machines = {"results-old": [(ModelCell(model="llama_3_2_1b", **base), 0.30),
                                (ModelCell(model="llama_3_2_1b", gpus=4, strategy="fsdp", **base), 0.30),
                                (ModelCell(recompute=True, **eight_b), 0.349)],
                "results-new": [(ModelCell(recompute=50, **eight_b), 0.405)]}
    for root, cells in machines.items():
        paths = []
        for cell, mfu in cells:
            write_record(tmp_path / root / "cells" / cell.path, model_record(cell, 200.0, 5.0, 20.0, 0.02, mfu=mfu))
            paths.append(tmp_path / root / "cells" / cell.path)
        table = model_table(paths)
        if root == "results-old":
            table["recompute"] = table["recompute"] > 0  # the column as such a table has it
            assert table["recompute"].dtype == bool
        (tmp_path / root / "models").mkdir(parents=True)
        table.to_parquet(tmp_path / root / "models" / "models.parquet")
    out = tmp_path / "parallel.md"
    assert main(["--results", str(tmp_path / "results-old"), str(tmp_path / "results-new"), "--suites", "models",
                 "--out", str(out)]) == 0
    text = out.read_text()
    assert "4.00x" in _row(text, "| llama_3_2_1b, sdpa_default |", "| 4 H100, fsdp |")  # found its one-GPU cell
    assert "34.9%" in _row(text, "| llama_3_8b, sdpa_default, recompute |")
    assert "40.5%" in _row(text, "| llama_3_8b, sdpa_default, recompute 50% |")
    target = _row(text, "Llama-3-8B training step")
    assert "fsdp/sdpa_default, recompute on 4 H100: 0.349; fsdp/sdpa_default, recompute 50% on 4 H100: 0.405" in target
    assert target.rstrip().endswith("| met |")


def test_a_results_folder_that_is_not_there_is_named_not_taken_for_no_cells(tmp_path, capsys):
    with pytest.raises(SystemExit) as ended:
        main(["--results", str(tmp_path / "results-g4"), "--out", str(tmp_path / "parallel.md")])
    assert ended.value.code == 2
    assert f"--results: no such folder: {tmp_path / 'results-g4'}" in capsys.readouterr().err
    assert not (tmp_path / "parallel.md").exists()


def test_a_failed_cell_is_one_short_line_in_its_table_and_whole_in_the_list_below():
    reason = ("rank 3 (pid 1907, vm) raised OutOfMemoryError during warm-up 21.4 s in: CUDA out of memory. "
              "Tried to allocate 3.91 GiB. GPU 3 has a total capacity of 79.18 GiB of which 3.79 GiB is free; "
              "rank(s) 0, 1, 2 stopped by the supervisor")
    row = {"status": "oom", "reason": reason, "gpus": 4, "strategy": "fsdp"}
    assert model_reason(row, None) == ("oom: rank 3 (pid 1907, vm) raised OutOfMemoryError during warm-up 21.4 s in "
                                       "(whole reason below)")
    long = {"status": "error", "reason": "x" * 40 + " " + "y" * 80}
    assert attention_reason(long) == "error: " + "x" * 40 + " ... (whole reason below)"
    assert attention_reason({"status": "error"}) == "error: no reason recorded (whole reason below)"
