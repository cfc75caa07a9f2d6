"""The distributed kind: one sequence-parallel attention problem per cell, one process
per GPU (flashwatt.kind says what a kind is)."""
from __future__ import annotations

from flashwatt.distributed import cell as distributed
from flashwatt.distributed.figures import DISTRIBUTED_FIGURES
from flashwatt.distributed.suite import distributed_runs
from flashwatt.kind import CompareMetric, Kind, TableFile


def fill_schema(section: dict) -> None:
    grid = section["properties"]["grids"]["items"]["properties"]
    for key, names in (("strategies", distributed.STRATEGIES), ("blocks", distributed.BLOCKS),
                       ("precisions", distributed.PRECISIONS), ("passes", distributed.PASSES)):
        grid[key]["items"] = {"enum": list(names)}


class _DistributedKind(Kind):
    def resources(self, cell) -> dict:
        # One task per node, supervising that node's ranks (one process per GPU: flashwatt.distributed.rank_supervisor).
        return {"gpus": cell.gpus // cell.nodes, "tasks": 1, "nodes": cell.nodes, "runtime": self.runtime_min}


KIND = _DistributedKind(
    name="distributed",
    section="distributed",
    cell=distributed.DistributedCell,
    plan=distributed_runs,
    job="flashwatt.distributed.cell_run:run_distributed_cell",
    tables=(
        TableFile("table", "distributed.parquet"),
        TableFile("csv", "distributed.csv", "distributed_table.rst", "distributed", about="distributed cells"),
    ),
    write_tables="flashwatt.distributed.summary:write_tables",
    figures=DISTRIBUTED_FIGURES,
    schema="schema.yaml",
    fill_schema=fill_schema,
    report="report.rst",
    rule_prefix="distributed_",
    runtime_min=60,
    figure_caption="distributed_figure.rst",
    compare_metrics=(
        CompareMetric("latency", "total_ms", "lower", "time per call (ms)"),
        CompareMetric("tflops", "tflops_total", "higher", "TFLOP/s over the job's GPUs", heat_map=False),
        CompareMetric("energy", "energy_per_call_j", "lower", "energy per call (J)"),
        CompareMetric("power", "avg_power_w", "lower", "average power (W)", heat_map=False),
        CompareMetric("error", "error_out", "lower", "output's relative error against float64", heat_map=False),
    ),
    compare_group=("strategy", "block"),
    compare_family=("precision", "gpus", "heads", "kv_heads", "head_dim", "causal", "pass"),
    refusal_without_cuda=lambda cell: distributed.refusal_without_cuda(cell.precision),
)
