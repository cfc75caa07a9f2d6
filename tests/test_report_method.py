"""The report's method sentences say what the summary says was done, cell group by group."""
import pytest

from flashwatt.attention.report_method import NOT_YET, method_sentences, report_method, rst_text

from summaries import GPU_NAME, NO_CUDA, cpu_summary, gpu_summary


@pytest.fixture
def gpu(tmp_path):
    return gpu_summary(tmp_path)


def test_a_cpu_run_is_said_to_be_timed_with_perf_counter_and_to_have_no_energy(tmp_path):
    said = method_sentences(cpu_summary(tmp_path))
    assert said["device"] == "Measured on CPU x86_64 (8 cells)."
    assert said["timing"].startswith("For 8 cells, latency is the median time per call over batches of "
                                     "back-to-back calls on the CPU, each batch timed with the host's perf_counter")
    assert "between two CUDA events" not in said["timing"] and "graph replays" not in said["timing"]
    assert said["energy"] == f"For 8 cells, no energy was measured: {NO_CUDA}."


def test_a_gpu_run_is_said_to_be_timed_by_graph_replay_with_its_energy_window(gpu):
    said = method_sentences(gpu)
    assert said["device"] == f"Measured on {GPU_NAME} (19 cells)."  # the skipped cell recorded no device
    assert said["timing"].startswith("For 19 cells, latency is the median time per call over CUDA-graph replays")
    assert said["energy"].startswith("For 18 cells, energy per call is the NVML energy-counter delta over a "
                                     "window of 3 s of back-to-back calls")
    assert "no energy was measured" not in said["energy"]


def test_cells_timed_differently_are_each_described_with_their_count_and_reason(gpu):
    frame = gpu.copy()
    eager = (frame["kernel"] == "naive") & frame["median_ms"].notna()
    frame.loc[eager, "timing_method"] = "eager_batch"
    frame.loc[eager, "timing_fallback_reason"] = "graph capture failed: RuntimeError: not capturable"
    frame.loc[frame["kernel"] == "custom", ["energy_per_call_j", "energy_reason"]] = [
        None, "energy measurement switched off (measure.energy: false)"]
    said = method_sentences(frame)
    assert said["timing"].startswith("For 13 cells, latency is the median time per call over CUDA-graph replays")
    assert ("For 6 cells, latency is the median time per call over batches of back-to-back calls launched "
            "eagerly, each batch timed between two CUDA events (no CUDA graph: graph capture failed: "
            "RuntimeError: not capturable)") in said["timing"]
    assert said["energy"].endswith("For 6 cells, no energy was measured: energy measurement switched off "
                                   "(measure.energy: false).")


def test_report_text_is_escaped_and_waits_for_a_summary(gpu, tmp_path):
    assert rst_text("perf_counter *B* `x` |y|") == r"perf\_counter \*B\* \`x\` \|y\|"
    assert report_method(tmp_path / "none.parquet") == {"device": NOT_YET, "timing": NOT_YET, "energy": NOT_YET}
    gpu.to_parquet(tmp_path / "summary.parquet")
    assert report_method(tmp_path / "summary.parquet")["timing"].startswith("For 19 cells, latency")
