"""The report's method sentences, written from what the summary says was done.

A suite's cells can be timed three ways (flashwatt.timing: CUDA-graph replays, eager
batches where a backend refuses capture, perf_counter on a CPU) and have an energy
window or a reason for not having one. The report states the method per group of cells,
with their count, instead of a fixed text that would claim CUDA events on a CPU run.
"""
from __future__ import annotations

import re
from pathlib import Path

import pandas as pd

from flashwatt.attention.summary import device_labels, read_summary

# How each `timing_method` of the summary measured a cell's latency.
TIMING_METHODS = {
    "cuda_graph": (
        "the median time per call over CUDA-graph replays of back-to-back calls, each replay timed "
        "between two CUDA events and divided by its number of calls; the same calls launched eagerly "
        "give the launch overhead, reported as its own column"
    ),
    "eager_batch": (
        "the median time per call over batches of back-to-back calls launched eagerly, each batch timed "
        "between two CUDA events (no CUDA graph: {why}), so host launch time is included"
    ),
    "perf_counter": (
        "the median time per call over batches of back-to-back calls on the CPU, each batch timed with the "
        "host's perf_counter (no CUDA device, so no CUDA events or graphs)"
    ),
}
NOT_YET = "No summary yet: the method sentences are written from it once the cells have run."
# Characters that reStructuredText reads as markup; the sentences carry cells' reasons,
# which may hold any of them (a `*` from a shape, a trailing `_` from a name).
RST_MARKUP = re.compile(r"([\\`*_|])")


def _cells(n: int) -> str:
    return f"{n} cell" if n == 1 else f"{n} cells"


def _range(values: pd.Series, unit: str) -> str:
    low, high = values.min(), values.max()
    return f"{low:.3g} {unit}" if round(low, 2) == round(high, 2) else f"{low:.3g}-{high:.3g} {unit}"


def timing_sentence(frame: pd.DataFrame) -> str:
    timed = frame[frame["median_ms"].notna()]
    if timed.empty:
        return "No cell was timed."
    sentences = []
    for method, group in timed.groupby(timed["timing_method"].fillna("unknown"), sort=True):
        template = TIMING_METHODS.get(method, f"measured by a method named {method!r}")
        why = "; ".join(sorted(set(group["timing_fallback_reason"].dropna()))) or "reason not recorded"
        sentences.append(f"For {_cells(len(group))}, latency is {template.format(why=why)}.")
    return " ".join(sentences)


def energy_sentence(frame: pd.DataFrame) -> str:
    ok = frame[frame["status"] == "ok"]
    if ok.empty:
        return "No cell finished ok, so no energy was measured."
    measured = ok[ok["energy_per_call_j"].notna()]
    sentences = []
    if len(measured):
        sentences.append(
            f"For {_cells(len(measured))}, energy per call is the NVML energy-counter delta over a window of "
            f"{_range(measured['energy_window_s'], 's')} of back-to-back calls, synchronised at both edges, "
            "divided by the calls in the window; idle power is measured before each window.")
    missing = ok[ok["energy_per_call_j"].isna()]
    if len(missing):
        reasons = missing["energy_reason"].fillna("no reason recorded").value_counts()
        listed = (reasons.index[0] if len(reasons) == 1
                  else "; ".join(f"{reason} ({_cells(n)})" for reason, n in reasons.items()))
        sentences.append(f"For {_cells(len(missing))}, no energy was measured: {listed}.")
    return " ".join(sentences)


def device_sentence(frame: pd.DataFrame) -> str:
    devices = device_labels(frame).dropna()
    if devices.empty:
        return "No cell recorded a device."
    listed = ", ".join(f"{name} ({_cells(n)})" for name, n in devices.value_counts().items())
    return f"Measured on {listed}."


def method_sentences(frame: pd.DataFrame) -> dict[str, str]:
    """The report's method sentences for this summary: device, timing, energy."""
    return {"device": device_sentence(frame), "timing": timing_sentence(frame), "energy": energy_sentence(frame)}


def rst_text(text: str) -> str:
    """Plain text as reStructuredText that shows it unchanged."""
    return RST_MARKUP.sub(r"\\\1", text)


def report_method(summary: str | Path) -> dict[str, str]:
    """The method sentences of a summary file, as reStructuredText for the report; before
    the first run (no summary yet) each says so."""
    if not Path(summary).exists():
        return dict.fromkeys(("device", "timing", "energy"), NOT_YET)
    return {key: rst_text(text) for key, text in method_sentences(read_summary(summary)).items()}
