"""What each attention figure shows: titles, axes, which kernels and cells are drawn, the
words of a figure with nothing to draw, facets only where cells ran, missing bars marked
with why, and tick labels a reader can read. Figures are checked as matplotlib objects
(`FigureSpec.render`); tests/test_figure_base.py checks how every kind's files are written."""
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
import pytest
from matplotlib.text import Text

from flashwatt.attention.cell import Cell
from flashwatt.attention.figures import FIGURES, MAX_OVERVIEW_CELLS, speedups
from flashwatt.kinds import envelope_of
from flashwatt.attention.summary import summarize
from flashwatt.figure_base import write_figure
from flashwatt.plot_axes import MISSING_BAR, log_ticks, plain_number, sequence_length_label
from flashwatt.records import write_record

from summaries import GPU_LATENCY_MS, GPU_LENGTHS, GPU_NAME, GPU_PRECISIONS, NO_CUDA, cpu_summary, gpu_summary

GPU_KERNELS = sorted(GPU_LATENCY_MS)
NOTHING = "Nothing to draw."


@pytest.fixture
def gpu(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)  # the summary's record paths (and so the traces) are relative
    return gpu_summary(tmp_path)


@pytest.fixture
def cpu(tmp_path):
    return cpu_summary(tmp_path)


@pytest.fixture
def render():
    """Render a figure of the registry; closed after the test."""
    drawn = []

    def _render(name, frame, options=None):
        fig = FIGURES[name].render(frame, options)
        drawn.append(fig)
        return fig

    yield _render
    for fig in drawn:
        plt.close(fig)


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


def message(fig) -> str:
    """The text a figure shows in place of data."""
    [text] = [t for t in texts(fig) if t.startswith(NOTHING)]
    return text


def legend_labels(fig) -> list[str]:
    legends = list(fig.legends) + [ax.get_legend() for ax in fig.axes if ax.get_legend()]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def data_axes(fig):
    return [ax for ax in fig.axes if ax.lines or ax.patches]


def tick_labels(ax, axis="y") -> list[str]:
    ax.figure.canvas.draw()
    ticks = ax.get_yticklabels() if axis == "y" else ax.get_xticklabels()
    return [t.get_text() for t in ticks if t.get_text()]


# ---- every figure --------------------------------------------------------------------

@pytest.mark.parametrize("name", list(FIGURES))
def test_every_figure_has_its_title_and_where_it_was_measured(gpu, cpu, render, name):
    for frame, where in [(gpu, f"suite gpu · {GPU_NAME} · 18 of 20 cells ok"),
                         (cpu, "suite smoke · CPU x86_64 · 8 of 8 cells ok")]:
        fig = render(name, frame)
        assert fig.get_suptitle() == f"{FIGURES[name].title_for(frame)}\n{where}"
        if name != "overview":  # the one title that names its parts (test_the_overview_title_...)
            assert FIGURES[name].title_for(frame) == FIGURES[name].title


@pytest.mark.parametrize("name", list(FIGURES))
def test_every_figure_draws_real_content_for_a_gpu_summary(gpu, render, name):
    fig = render(name, gpu)
    assert not any(NOTHING in t or "Not measured" in t for t in texts(fig))
    assert data_axes(fig), f"{name} drew no lines or bars"
    # the incorrect cell (sdpa_efficient) and the skipped one (sdpa_cudnn) are nowhere
    everything = " ".join(texts(fig))
    assert "sdpa_efficient" not in everything and "sdpa_cudnn" not in everything


@pytest.mark.parametrize("name", list(FIGURES))
def test_a_figure_with_no_cells_says_so(gpu, render, name):
    fig = render(name, gpu.iloc[:0])
    assert message(fig) == f"{NOTHING}\nThe summary has no cells."
    assert fig.get_suptitle() == f"{FIGURES[name].title_for(gpu.iloc[:0])}\nno cells in the summary"


@pytest.mark.parametrize("name", list(FIGURES))
def test_a_figure_with_no_ok_cell_counts_the_outcomes_and_their_reasons(gpu, render, name):
    failed = gpu[gpu["status"] != "ok"]
    fig = render(name, failed)
    assert message(fig).splitlines()[1:] == [
        "None of the 2 cells finished ok:",
        "1 incorrect: check against float64 failed: rel_err=0.9 (tol 0.005)",
        "1 skipped: sdpa_cudnn cannot run this cell",
    ]


@pytest.mark.parametrize("name", list(FIGURES))
def test_facets_without_cells_are_drawn_without_error(gpu, render, name):
    # A second shape run only at bf16: its fp16 facet is empty (cannot be log-scaled).
    other = gpu[(gpu["status"] == "ok") & (gpu["precision"] == "bf16")].assign(heads=4)
    fig = render(name, pd.concat([gpu, other], ignore_index=True))
    assert data_axes(fig)


# ---- on a machine without a GPU ------------------------------------------------------

@pytest.mark.parametrize("name,what", [("energy_per_call", "an energy measurement"),
                                       ("gflops_per_w", "an energy measurement"),
                                       ("power", "a power measurement"),
                                       ("power_trace", "a power trace")])
def test_energy_figures_without_a_gpu_say_there_is_no_cuda_device(cpu, render, name, what):
    fig = render(name, cpu)
    assert message(fig) == (f"{NOTHING}\nNone of the 8 ok cells has {what}.\n"
                             f"Reason recorded:\n{NO_CUDA} (8 cells)")
    assert not data_axes(fig)


def test_energy_placeholder_counts_each_reason(cpu, render):
    frame = cpu.copy()
    frame.loc[frame["kernel"] == "naive", "energy_reason"] = "energy measurement switched off (measure.energy: false)"
    fig = render("energy_per_call", frame)
    assert message(fig).splitlines()[2:] == [
        "Reasons recorded:", "energy measurement switched off (measure.energy: false) (4 cells)", f"{NO_CUDA} (4 cells)"]


def test_speedup_over_a_kernel_the_suite_did_not_run_says_so(cpu, render):
    fig = render("speedup_vs_sdpa_flash", cpu)
    assert message(fig) == (f"{NOTHING}\nsdpa_flash is not among this suite's kernels (naive, sdpa_math): "
                             "no baseline to compare with.")


def test_speedup_over_a_baseline_that_never_finished_ok_gives_its_outcomes(gpu, render):
    frame = gpu.copy()
    frame.loc[frame["kernel"] == "naive", ["status", "reason"]] = ["oom", "out of memory: tried to allocate 9 GiB"]
    fig = render("speedup_vs_naive", frame)
    assert message(fig).splitlines()[1:] == ["None of the 6 naive cells finished ok:",
                                              "6 oom: out of memory: tried to allocate 9 GiB"]


def test_speedup_with_no_other_kernel_at_the_baselines_cells_says_so(gpu, render):
    frame = gpu[gpu["kernel"] == "naive"]
    fig = render("speedup_vs_naive", frame)
    assert message(fig) == f"{NOTHING}\nNo other kernel finished ok at the 6 cells where naive did."


def test_latency_without_a_gpu_draws_the_cpu_cells(cpu, render):
    fig = render("latency", cpu)
    assert sorted(ax.get_title() for ax in data_axes(fig)) == ["D=16 H=2 causal fwd_bwd | fp32",
                                                               "D=16 H=2 full fwd | fp32"]
    assert legend_labels(fig) == ["naive", "sdpa_math"]  # no line-style entry for one series
    assert fig.legends[0].get_title().get_text() == "kernel"


def test_the_overview_title_names_only_what_it_draws(gpu, cpu, render):
    assert render("overview", gpu).get_suptitle().splitlines()[0] == "Energy, efficiency and latency per kernel"
    assert render("overview", cpu).get_suptitle().splitlines()[0] == "Latency per kernel"


def test_overview_without_a_gpu_draws_latency_and_says_why_energy_is_missing(cpu, render):
    fig = render("overview", cpu)
    energy, efficiency, latency = fig.axes[:3]
    for ax in (energy, efficiency):
        assert not ax.patches
        assert texts(ax)[0].startswith("Not measured.\nNone of the 8 ok cells has an energy measurement.")
        assert NO_CUDA in texts(ax)[0]
    # one bar per cell and kernel: four cells (L and the shape vary), two kernels
    assert len([p for p in latency.patches if p.get_height() > 0]) == 8
    assert legend_labels(fig) == ["L=32 full fwd", "L=32 causal fwd_bwd", "L=64 full fwd",
                                      "L=64 causal fwd_bwd"]


# ---- what the GPU figures draw -------------------------------------------------------

def test_latency_draws_one_line_per_ok_kernel_with_its_latencies(gpu, render):
    fig = render("latency", gpu)
    assert legend_labels(fig) == GPU_KERNELS
    assert sorted(ax.get_title() for ax in data_axes(fig)) == [f"D=64 H=8 full fwd | {p}" for p in sorted(GPU_PRECISIONS)]
    ax = fig.axes[0]
    assert ax.get_ylabel() == "median latency per call (ms)" and ax.get_xlabel() == "sequence length L"
    ok = gpu[gpu["status"] == "ok"]
    precision = ax.get_title().split(" | ")[1]
    drawn = sorted(tuple(np.round(line.get_ydata(), 6)) for line in ax.lines if len(line.get_ydata()) > 1)
    expected = sorted(tuple(np.round(g.sort_values("seq_len")["median_ms"].to_numpy(), 6))
                      for _, g in ok[ok["precision"] == precision].groupby("kernel"))
    assert drawn == expected
    assert tick_labels(ax, "x") == [sequence_length_label(n) for n in GPU_LENGTHS] == ["512", "1k", "2k"]


def test_log_axes_are_labelled_with_plain_numbers(gpu, render):
    for name in ("latency", "speedup_vs_naive", "speedup_vs_sdpa_flash", "energy_per_call"):
        for ax in data_axes(render(name, gpu)):
            labels = tick_labels(ax)
            assert len(labels) >= 2, (name, labels)
            assert not any("10^" in t or "$" in t or "×10" in t for t in labels), (name, labels)
            assert all(float(t.rstrip("×")) > 0 for t in labels), (name, labels)


def test_speedup_is_the_baselines_latency_over_the_kernels_with_ticks_in_x(gpu, render):
    merged = speedups(gpu, "naive")
    assert set(merged["kernel"]) == {"custom", "sdpa_flash"}
    row = merged[(merged["kernel"] == "custom") & (merged["precision"] == "fp16") & (merged["seq_len"] == 512)]
    assert row["speedup"].iloc[0] == pytest.approx(GPU_LATENCY_MS["naive"] / GPU_LATENCY_MS["custom"])
    fig = render("speedup_vs_naive", gpu)
    assert legend_labels(fig) == ["custom", "sdpa_flash"]
    for ax in data_axes(fig):
        labels = tick_labels(ax)
        assert "1×" in labels and all(t.endswith("×") for t in labels), labels
        assert any(list(line.get_ydata()) == [1.0, 1.0] for line in ax.lines)  # the parity line


def test_speedup_ticks_under_a_decade_are_round_plain_numbers(cpu, render):
    # the smoke suite's speedups span 0.3-1: matplotlib alone labels these 4×10⁻¹, 6×10⁻¹
    for ax in data_axes(render("speedup_vs_naive", cpu)):
        labels = tick_labels(ax)
        assert labels and all(t.endswith("×") and len(t) <= 5 for t in labels), labels


def test_energy_bars_are_the_ok_cells_energy_in_mj(gpu, render):
    fig = render("energy_per_call", gpu)
    ok = gpu[gpu["status"] == "ok"]
    heights = sorted(round(p.get_height(), 6) for ax in data_axes(fig) for p in ax.patches if p.get_height() > 0)
    assert heights == sorted(round(v * 1e3, 6) for v in ok["energy_per_call_j"])
    assert legend_labels(fig) == ["512", "1k", "2k"]  # by length, not alphabetically
    for ax in data_axes(fig):
        assert tick_labels(ax, "x") == GPU_KERNELS
    assert fig.axes[0].get_ylabel() == "energy per call (mJ, NVML counter)"


def test_tflops_draws_the_matmul_peak_of_the_gpu(gpu, render):
    fig = render("tflops", gpu)
    for ax in data_axes(fig):
        assert any(list(line.get_ydata()) == [790.0, 790.0] for line in ax.lines)
        assert f" matmul peak {GPU_NAME}" in texts(ax)


def test_a_second_batch_series_gets_a_line_style(gpu, render):
    # B=8 at L=2048 and B=16 at L=1024 are both 16k tokens: a series with two lengths
    extra = gpu[(gpu["status"] == "ok") & (gpu["seq_len"] == 2048)].assign(batch=8)
    fig = render("latency", pd.concat([gpu, extra], ignore_index=True))
    labels = legend_labels(fig)
    assert labels[labels.index("series"):] == ["series", "B=16", "B=8", "16k tokens"]


def test_overview_draws_a_bar_per_cell_named_by_what_varies(gpu, render):
    fig = render("overview", gpu)
    assert [ax.get_title() for ax in fig.axes[:3]] == ["energy per call (mJ)", "GFLOP/s per W",
                                                       "median latency per call (ms)"]
    assert fig.legends[0].get_title().get_text() == "cell"
    assert legend_labels(fig) == ["bf16 L=512", "bf16 L=1k", "bf16 L=2k", "fp16 L=512", "fp16 L=1k", "fp16 L=2k"]
    for ax in fig.axes[:3]:
        assert len([p for p in ax.patches if p.get_height() > 0]) == 18
        assert tick_labels(ax, "x") == GPU_KERNELS


def test_overview_of_a_suite_with_many_cells_points_to_the_per_shape_figures(gpu, render):
    ok = gpu[gpu["status"] == "ok"]
    many = pd.concat([ok.assign(batch=b) for b in range(1, MAX_OVERVIEW_CELLS)], ignore_index=True)
    fig = render("overview", many)
    assert "too many to read as bars" in message(fig) and not data_axes(fig)


def test_power_trace_draws_each_kernels_hungriest_cell_with_its_window(gpu, render):
    fig = render("power_trace", gpu)
    assert [ax.get_title() for ax in fig.axes] == [f"gpu/{k}/bf16/L2048-B16-H8-D64-full-fwd" for k in GPU_KERNELS]
    for ax in fig.axes:
        assert legend_labels_of(ax) == ["instant power", "energy window"]


def legend_labels_of(ax) -> list[str]:
    return [t.get_text() for t in ax.get_legend().get_texts()]


def test_power_trace_filter_that_selects_nothing_says_so(gpu, render):
    fig = render("power_trace", gpu, {"trace_filter": "seq_len > 100000"})
    assert message(fig) == f"{NOTHING}\ntrace_filter 'seq_len > 100000' selects none of the ok cells with a power trace."


def test_bad_trace_filter_names_the_config_key(gpu, tmp_path):
    summary = tmp_path / "s.parquet"
    gpu.to_parquet(summary)
    with pytest.raises(ValueError, match="config key trace_filter"):
        write_figure(FIGURES["power_trace"], {"summary": summary}, tmp_path / "t.png", {"trace_filter": "kernal == 'naive'"})


@pytest.mark.parametrize("name", ["latency", "overview"])
def test_draw_writes_the_figure_in_its_format_from_an_older_summary(gpu, tmp_path, name):
    summary = tmp_path / "s.parquet"
    gpu.drop(columns=["device_type", "timing_fallback_reason"]).to_parquet(summary)  # before those columns
    out = tmp_path / f"{name}.{FIGURES[name].ext}"
    write_figure(FIGURES[name], {"summary": summary}, out)
    assert out.read_bytes()[:4] == {"png": b"\x89PNG", "pdf": b"%PDF"}[FIGURES[name].ext]


# ---- no empty facet, no silent gap ---------------------------------------------------

SKIPPED_FP32 = "sdpa_flash runs fp16/bf16 only (cell asks for fp32)"
ENERGY_OFF = "energy measurement switched off (measure.energy: false)"


def gapped_summary(root) -> pd.DataFrame:
    """A suite with holes, as users run them: fwd_bwd only at fp16 (so the fp32 x fwd_bwd
    facet has no cells); sdpa_flash skipped at fp32 with its backend's reason; custom at fp32
    and L=1024 not in the grid; naive at fp16, L=1024, fwd timed with its energy switched off."""
    device = {"type": "cuda", "name": GPU_NAME, "compute_capability": "9.0"}
    paths = []
    for kernel in ("naive", "sdpa_flash", "custom"):
        for precision, passes in (("fp16", ("fwd", "fwd_bwd")), ("fp32", ("fwd",))):
            for pass_ in passes:
                for seq_len in (512, 1024):
                    if (kernel, precision, seq_len) == ("custom", "fp32", 1024):
                        continue
                    cell = Cell("gaps", kernel, precision, seq_len, 16, 8, 64, False, pass_)
                    record = envelope_of(cell, {})
                    ms = {"naive": 0.4, "sdpa_flash": 0.05, "custom": 0.04}[kernel] * seq_len / 512
                    if kernel == "sdpa_flash" and precision == "fp32":
                        record.update(status="skipped", reason=SKIPPED_FP32)
                    elif (kernel, precision, seq_len, pass_) == ("naive", "fp16", 1024, "fwd"):
                        record.update(status="ok", device=device, timing={"median_ms": ms},
                                      energy={"reason": ENERGY_OFF})
                    else:
                        record.update(status="ok", device=device,
                                      timing={"median_ms": ms, "tflops": cell.flops / ms / 1e9},
                                      energy={"energy_per_call_j": ms * 0.6, "avg_power_w": 600.0,
                                              "peak_power_w": 650.0 + seq_len / 100, "idle_power_w": 90.0,
                                              "gflops_per_w": cell.flops / (ms * 0.6) / 1e9})
                    write_record(root / cell.path, record)
                    paths.append(root / cell.path)
    return summarize(paths)


@pytest.fixture
def gaps(tmp_path):
    return gapped_summary(tmp_path)


def marks(ax) -> list:
    return [t for t in ax.texts if t.get_gid() == MISSING_BAR]


def facet(fig, title):
    [ax] = [ax for ax in fig.axes if ax.get_title() == title]
    return ax


def bar_at(ax, x: float):
    """The height of the bar centred at `x`, None where there is none."""
    heights = [p.get_height() for p in ax.patches if p.get_width() > 0 and abs(p.get_x() + p.get_width() / 2 - x) < 1e-9]
    return heights[0] if heights else None


SHAPE = "D=64 H=8 full"


@pytest.mark.parametrize("name,bars", [("latency", False), ("tflops", False), ("speedup_vs_naive", False),
                                       ("energy_per_call", True), ("gflops_per_w", True)])
def test_a_figure_draws_no_facet_without_cells(gaps, render, name, bars):
    fig = render(name, gaps)
    suffix = " B=16" if bars else ""
    assert sorted(ax.get_title() for ax in fig.axes) == [f"{SHAPE} fwd{suffix} | fp16", f"{SHAPE} fwd{suffix} | fp32",
                                                         f"{SHAPE} fwd_bwd{suffix} | fp16"]
    for ax in fig.axes:  # and every facet drawn has cells drawn in it
        assert [p for p in ax.patches if p.get_height() > 0] or [line for line in ax.lines if len(line.get_xdata()) > 1]


def test_a_facet_above_a_dropped_one_keeps_its_kernel_names_and_the_left_one_its_axis_label(gaps, render):
    fig = render("gflops_per_w", gaps)
    fig.canvas.draw()
    fp32 = facet(fig, f"{SHAPE} fwd B=16 | fp32")  # the facet under it, fwd_bwd x fp32, is not drawn
    assert [t.get_text() for t in fp32.get_xticklabels() if t.get_visible()] == ["custom", "naive", "sdpa_flash"]
    assert facet(fig, f"{SHAPE} fwd_bwd B=16 | fp16").get_ylabel() == "GFLOP/s per W"
    # a shape run at fp32 only: its row's first facet (fp16) is not drawn, the fp32 one takes the axis label
    fp32_only = gaps[(gaps["precision"] == "fp32") & (gaps["status"] == "ok")].assign(heads=4)
    fig = render("gflops_per_w", pd.concat([gaps, fp32_only], ignore_index=True))
    assert facet(fig, "D=64 H=4 full fwd B=16 | fp32").get_ylabel() == "GFLOP/s per W"


@pytest.mark.parametrize("name", ["energy_per_call", "gflops_per_w"])
def test_a_missing_bar_is_marked_with_its_cells_outcome_where_the_bar_would_be(gaps, render, name):
    fig = render(name, gaps)
    fp32, fp16 = facet(fig, f"{SHAPE} fwd B=16 | fp32"), facet(fig, f"{SHAPE} fwd B=16 | fp16")
    said = {}
    for mark in marks(fp32):
        said.setdefault(mark.get_text(), []).append(mark.get_position()[0])
    assert sorted(said) == ["not in grid", "skipped:\nruns fp16/bf16 only (cell asks for fp32)"]
    assert len(said["skipped:\nruns fp16/bf16 only (cell asks for fp32)"]) == 2  # at L=512 and at 1k
    [not_in_grid] = said["not in grid"]
    assert bar_at(fp32, not_in_grid) is None  # the mark stands in the empty place ...
    custom_1k = gaps[(gaps["kernel"] == "custom") & (gaps["precision"] == "fp16") & (gaps["seq_len"] == 1024)
                     & (gaps["pass"] == "fwd")][name.replace("energy_per_call", "energy_per_call_j")].iloc[0]
    scale = 1e3 if name == "energy_per_call" else 1.0  # ... where custom's bar at L=1k is in the fp16 facet
    assert bar_at(fp16, not_in_grid) == pytest.approx(custom_1k * scale)
    [off] = marks(fp16)
    assert off.get_text() == "not measured:\n" + ENERGY_OFF
    assert bar_at(fp16, off.get_position()[0]) is None
    assert not marks(facet(fig, f"{SHAPE} fwd_bwd B=16 | fp16"))  # every bar of that facet is drawn


def test_the_overview_marks_missing_bars_in_each_panel(gaps, render):
    fig = render("overview", gaps)
    energy, efficiency, latency = fig.axes[:3]
    skipped = "skipped:\nruns fp16/bf16 only (cell asks for fp32)"
    assert sorted(m.get_text() for m in marks(latency)) == ["not in grid", skipped, skipped]
    for ax in (energy, efficiency):
        assert sorted(m.get_text() for m in marks(ax)) == ["not in grid", "not measured:\n" + ENERGY_OFF, skipped, skipped]


def test_power_marks_missing_bars_too(gaps, render):
    fig = render("power", gaps)
    for measure in ("average (counter)", "peak (instant)"):
        assert sorted(m.get_text() for m in marks(facet(fig, f"{measure} | fp32"))) == [
            "not in grid", "skipped:\nruns fp16/bf16 only (cell asks for fp32)",
            "skipped:\nruns fp16/bf16 only (cell asks for fp32)"]
        assert not marks(facet(fig, f"{measure} | fp16"))  # naive's fwd_bwd cell at 1k has its power


@pytest.mark.parametrize("name", list(FIGURES))
def test_a_suite_without_gaps_has_no_marks(gpu, render, name):
    assert not [t for t in render(name, gpu).findobj(Text) if t.get_gid() == MISSING_BAR]


# ---- axis helpers --------------------------------------------------------------------

def test_plain_numbers_and_round_log_ticks():
    assert [plain_number(v) for v in (0.05, 2.5, 10000.0, 0.1 + 0.2, 790.0)] == ["0.05", "2.5", "10000", "0.3", "790"]
    assert log_ticks(0.3, 1.05) == pytest.approx([0.4, 0.6, 0.8, 1.0])
    assert log_ticks(0.04, 0.7) == pytest.approx([0.05, 0.1, 0.2, 0.5])
    assert log_ticks(0.01, 500) == pytest.approx([0.01, 0.1, 1, 10, 100])  # 1-2-5 would be 15 ticks
    assert log_ticks(0, 1) == [] and log_ticks(2, 1) == []
