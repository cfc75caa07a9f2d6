"""The model kind: one step of a whole model per cell, on one GPU or several
(flashwatt.kind says what a kind is)."""
from __future__ import annotations

from flashwatt.kind import CompareMetric, Kind, TableFile
from flashwatt.models import cell as models
from flashwatt.models.figures import MODEL_FIGURES
from flashwatt.models.suite import model_runs


def fill_schema(section: dict) -> None:
    grid = section["properties"]["grids"]["items"]["properties"]
    for key, names in (("precisions", models.MODEL_PRECISIONS), ("phases", models.PHASES),
                       ("strategies", models.MODEL_STRATEGIES)):
        grid[key]["items"] = {"enum": list(names)}
    grid["backends"]["items"] = {"anyOf": [{"enum": list(models.MODEL_BACKENDS)},
                                           {"type": "string", "pattern": f"^{models.CONTROL_BACKEND_RE}$"}]}


def plan(config: dict, suite: str) -> dict:
    from flashwatt.settings import measure_settings

    if not config["suites"][suite].get("models"):
        return {}
    return model_runs(config, suite, measure_settings(config, suite))


class _ModelKind(Kind):
    def resources(self, cell) -> dict:
        # One task: a cell of several GPUs supervises its ranks from it (flashwatt.distributed.rank_supervisor),
        # brings their process group up and checks against one process.
        return {"gpus": cell.gpus, "tasks": 1, "runtime": 30 if cell.gpus == 1 else 60}


KIND = _ModelKind(
    name="model",
    section="models",
    cell=models.ModelCell,
    plan=plan,
    job="flashwatt.models.job:run_model_cell",
    tables=(
        TableFile("table", "models.parquet"),
        TableFile("csv", "models.csv", "models_table.rst", "models", about="model cells against the SDPA default"),
        TableFile("front", "models_front.csv", about="the static front of governed cells: every backend, micro-batch "
                                                      "split and duty"),
        TableFile("governed_traces", "models_governed_traces.parquet"),
    ),
    write_tables="flashwatt.models.summary:write_tables",
    figures=MODEL_FIGURES,
    schema="schema.yaml",
    fill_schema=fill_schema,
    report="report.rst",
    rule_prefix="model_",
    figure_caption="models_figure.rst",
    compare_metrics=(
        CompareMetric("latency", "step_ms", "lower", "time per step (ms)"),
        CompareMetric("throughput", "tokens_per_s", "higher", "tokens per second", heat_map=False),
        CompareMetric("tflops", "achieved_tflops", "higher", "achieved TFLOP/s", heat_map=False),
        CompareMetric("energy", "j_per_token", "lower", "energy per token (J)"),
        CompareMetric("power", "avg_power_w", "lower", "average power (W)", heat_map=False),
        CompareMetric("error", "logits_error", "lower", "logits' relative error", heat_map=False),
    ),
    compare_group=("backend",),
    compare_family=("model", "precision", "phase", "recompute", "compiled", "gpus", "strategy"),
    refusal_without_cuda=models.refusal_without_cuda,
)
