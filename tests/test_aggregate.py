"""Records of every outcome become one tidy row each; the flagged table says why a cell is in it."""
import os

import pandas as pd
import pytest

from flashwatt.attention.summary import COLUMNS, device_labels, flagged, read_summary, summarize
from flashwatt.attention.cell import Cell
from flashwatt.records import read_record, write_record
from flashwatt.job_frame import job_failed
from flashwatt.kinds import envelope_of


def cell(kernel, L):
    return Cell("smoke", kernel, "fp16", L, 2, 2, 16)


def ok_record(kernel, L, ms, energy=True):
    c = cell(kernel, L)
    rec = envelope_of(c, {})
    rec.update(status="ok", device={"type": "cuda", "name": "NVIDIA H200", "compute_capability": "9.0"},
               provenance={"host": "h", "job_id": "12", "git": {"commit": "abc", "dirty": False}},
               timing={"median_ms": ms, "p10_ms": ms * 0.9, "p90_ms": ms * 1.1, "repeats": 30,
                       "tflops": c.flops / ms / 1e9},
               check={"rel_err": 1e-3, "tol": 5e-3, "passed": True},
               memory={"peak_bytes": 2**30, "workspace_bytes": 2**20})
    if energy:
        rec["energy"] = {"energy_per_call_j": ms * 0.7, "avg_power_w": 690.0, "peak_power_w": 710.0,
                         "idle_power_w": 94.0, "gflops_per_w": 100.0, "window_s": 3.0, "calls": 3000.5,
                         "counter_vs_integral_pct": 7.5, "flags": ["counter_vs_integral>5%"],
                         "clock_reasons": ["SwPowerCap"]}
    return c, rec


@pytest.fixture
def records(tmp_path):
    paths = []
    for kernel, L, ms in [("naive", 32, 2.0), ("naive", 64, 4.0), ("sdpa_math", 32, 1.0), ("sdpa_math", 64, 1.5)]:
        c, rec = ok_record(kernel, L, ms)
        paths.append(tmp_path / c.path)
        write_record(paths[-1], rec)
    skipped = envelope_of(cell("sdpa_flash", 32), {})
    skipped.update(status="skipped", reason="sdpa_flash needs a CUDA device")
    oom = envelope_of(cell("naive", 128), {})
    oom.update(status="oom", reason="out of memory: tried to allocate 80 GiB")
    dead = job_failed(envelope_of(cell("sdpa_math", 128), {}), "slurm job 7 failed, state OUT_OF_MEMORY", "7")
    for c, rec in [(cell("sdpa_flash", 32), skipped), (cell("naive", 128), oom), (cell("sdpa_math", 128), dead)]:
        paths.append(tmp_path / c.path)
        write_record(paths[-1], rec)
    return paths


def test_summary_has_one_row_per_cell_with_every_outcome(records):
    frame = summarize(records)
    assert list(frame.columns) == COLUMNS and len(frame) == 7
    assert frame["status"].value_counts().to_dict() == {"ok": 4, "skipped": 1, "oom": 1, "job_failed": 1}
    row = frame[(frame["kernel"] == "naive") & (frame["seq_len"] == 64)].iloc[0]
    assert row["median_ms"] == 4.0 and row["peak_mem_gib"] == 1.0 and row["job_id"] == "12"
    assert row["energy_calls"] == 3000.5  # the window ends inside a batch: calls are interpolated
    assert frame.loc[frame["status"] == "oom", "reason"].str.contains("out of memory").all()


def test_flagged_lists_failures_and_doubtful_windows(records, tmp_path):
    table = flagged(summarize(records))
    assert set(table["status"]) == {"ok", "skipped", "oom", "job_failed"}
    assert (table.loc[table["status"] == "ok", "energy_flags"] == "counter_vs_integral>5%").all()
    # a window at the power cap is the card's normal state, not a reason for doubt
    c, rec = ok_record("naive", 256, 1.0)
    rec["energy"]["flags"] = ["power_capped"]
    write_record(tmp_path / c.path, rec)
    assert c.id not in set(flagged(summarize([tmp_path / c.path]))["cell_id"])


def test_records_follow_the_umask(tmp_path):
    old = os.umask(0o022)
    try:
        write_record(tmp_path / "r.json", {"status": "ok"})
    finally:
        os.umask(old)
    assert (tmp_path / "r.json").stat().st_mode & 0o777 == 0o644


def test_records_are_strict_json(tmp_path):
    c, rec = ok_record("naive", 32, 1.0)
    rec["check"]["rel_err"] = float("nan")
    write_record(tmp_path / "r.json", rec)
    assert read_record(tmp_path / "r.json")["check"]["rel_err"] is None
    with pytest.raises(ValueError, match="cannot read cell record"):
        (tmp_path / "bad.json").write_text("{")
        read_record(tmp_path / "bad.json")


def test_timed_latency_disagreeing_with_the_window_is_flagged(tmp_path):
    paths = []
    for L, pct in [(256, 1.2), (512, -7.0), (1024, None)]:
        c, rec = ok_record("naive", L, 1.0)
        rec["energy"]["flags"] = ["power_capped"]
        rec["energy"]["gpu_util_pct"], rec["energy"]["mem_util_pct"] = 98.5, 40.0
        rec["timing"].update(method="cuda_graph", calls_per_step=50, eager_ms=1.3, launch_overhead_ms=0.3)
        if pct is not None:
            rec["timing"].update(window_ms_per_call=1.0 / (1 + pct / 100), timed_vs_window_pct=pct)
        paths.append(tmp_path / c.path)
        write_record(paths[-1], rec)
    frame = summarize(paths)
    assert frame["gpu_util_pct"].tolist() == [98.5] * 3 and frame["timing_method"].tolist() == ["cuda_graph"] * 3
    assert frame["launch_overhead_ms"].tolist() == pytest.approx([0.3] * 3)
    table = flagged(frame)
    assert table["cell_id"].tolist() == [cell("naive", 512).id]  # only the cell 7% apart
    assert "differ by -7.0%" in table["flagged_because"].iloc[0]


def test_how_a_cell_was_timed_and_on_what_device_are_columns(tmp_path):
    c, rec = ok_record("naive", 32, 1.0, energy=False)
    rec["timing"].update(method="eager_batch", fallback_reason="graph capture failed: RuntimeError: no")
    cpu, cpu_rec = ok_record("naive", 64, 1.0, energy=False)
    cpu_rec.update(device={"type": "cpu", "name": "x86_64"})
    cpu_rec["timing"]["method"] = "perf_counter"
    paths = [tmp_path / c.path, tmp_path / cpu.path]
    write_record(paths[0], rec)
    write_record(paths[1], cpu_rec)
    frame = summarize(paths)
    assert frame["timing_method"].tolist() == ["eager_batch", "perf_counter"]
    assert frame["timing_fallback_reason"].iloc[0] == "graph capture failed: RuntimeError: no"
    assert frame["device_type"].tolist() == ["cuda", "cpu"]
    assert device_labels(frame).tolist() == ["NVIDIA H200", "CPU x86_64"]


def test_a_summary_written_before_a_column_existed_reads_with_it_empty(records, tmp_path):
    old = summarize(records).drop(columns=["device_type", "timing_fallback_reason"])
    old.to_parquet(tmp_path / "old.parquet")
    frame = read_summary(tmp_path / "old.parquet")
    assert list(frame.columns) == COLUMNS
    assert frame["device_type"].isna().all() and device_labels(frame).notna().sum() == 4
