"""The attention kind: one attention call per cell (flashwatt.kind says what a kind is)."""
from __future__ import annotations

from flashwatt.attention.cell import Cell
from flashwatt.attention.figures import FIGURES
from flashwatt.attention.suite import attention_cells, filter_cells
from flashwatt.kind import CompareMetric, Kind, TableFile
from flashwatt.vocabulary import SCHEMA_ENUMS


def fill_schema(grids: dict) -> None:
    """The grid's lists of names, from the code that names them (flashwatt.vocabulary)."""
    grid = grids["items"]["properties"]
    for key, names in SCHEMA_ENUMS.items():
        grid[key]["items"] = {"enum": list(names)}



def refusal_without_cuda(cell: Cell) -> str | None:
    """What the job records for the cell on a host without CUDA: its backend's declared
    refusal for a CPU (the job asks the same declaration first, flashwatt.kernels.declaration)."""
    from flashwatt.kernels.registry import backend

    return backend(cell.kernel).refusal(cell, "cpu")


def report_values(suite: str) -> dict:
    """The report's method sentences, from what the suite's summary says each cell used."""
    from flashwatt.attention.report_method import report_method

    return report_method(f"results/{suite}/summary.parquet")


KIND = Kind(
    name="attention",
    section="grids",
    cell=Cell,
    plan=attention_cells,
    filter=filter_cells,
    job="flashwatt.attention.job:run_cell",
    tables=(
        TableFile("summary", "summary.parquet"),
        TableFile("csv", "summary.csv", "summary.rst", "summary"),
        TableFile("flagged", "flagged.csv", "flagged.rst", "flagged", about="cells to look at"),
        TableFile("ladder", "precision_ladder.csv", "precision_ladder.rst", "precision ladder",
                  about="each precision's accuracy and joules beside bf16"),
    ),
    write_tables="flashwatt.attention.summary:write_tables",
    figures=FIGURES,
    schema="schema.yaml",
    fill_schema=fill_schema,
    report="report.rst",
    report_values="flashwatt.attention.kind:report_values",
    spec_field="settings",
    figure_caption="figure.rst",
    compare_metrics=(
        CompareMetric("latency", "median_ms", "lower", "median latency per call (ms)",
                      "flashwatt.attention.repeats:latency_samples"),
        CompareMetric("tflops", "tflops", "higher", "TFLOP/s", "flashwatt.attention.repeats:tflops_samples", heat_map=False),
        CompareMetric("energy", "energy_per_call_j", "lower", "energy per call (J)"),
        CompareMetric("power", "avg_power_w", "lower", "average power (W)", heat_map=False),
        CompareMetric("efficiency", "gflops_per_w", "higher", "GFLOP/s per watt", heat_map=False),
        CompareMetric("error", "rel_err", "lower", "relative error against float64", heat_map=False),
    ),
    compare_group=("kernel", "variant"),
    compare_family=("precision", "head_dim", "heads", "causal", "pass"),
    refusal_without_cuda=refusal_without_cuda,
)
