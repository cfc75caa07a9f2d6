"""The training kind: one training run per cell, on the suite's tokenised corpus
(flashwatt.kind says what a kind is). Its data is prepared once per suite by the rule in
workflow/rules/training_data.smk, an input of every cell."""
from __future__ import annotations

from flashwatt.kind import CompareMetric, Kind, TableFile
from flashwatt.training.cell import TrainCell, refusal_without_cuda
from flashwatt.training.figures import TRAINING_FIGURES
from flashwatt.training.suite import DATA_MANIFEST, training_runs


def plan(config: dict, suite: str) -> dict:
    from flashwatt.settings import measure_settings

    if not config["suites"][suite].get("training"):
        return {}
    return training_runs(config, suite, measure_settings(config, suite))



KIND = Kind(
    name="train",
    section="training",
    cell=TrainCell,
    plan=plan,
    job="flashwatt.training.job:run_train_cell",
    tables=(
        TableFile("runs", "training.parquet"),
        TableFile("curves", "training_curves.parquet"),
        TableFile("csv", "training.csv", "training_table.rst", "training runs", about="training runs"),
        TableFile("settings", "training_settings.csv", "training_settings.rst", "training settings",
                  about="training settings over their seeds"),
    ),
    write_tables="flashwatt.training.summary:write_tables",
    figures=TRAINING_FIGURES,
    schema="schema.yaml",
    report="report.rst",
    rule_prefix="training_",
    runtime_min=60,
    cell_inputs={"data": DATA_MANIFEST},
    rules="training_data.smk",
    figure_caption="training_figure.rst",
    compare_metrics=(
        CompareMetric("throughput", "tokens_per_s", "higher", "tokens per second"),
        CompareMetric("energy", "j_per_token", "lower", "energy per token (J)"),
        CompareMetric("power", "mean_power_w", "lower", "mean power (W)", heat_map=False),
        CompareMetric("loss", "final_val_loss", "lower", "final validation loss"),
        CompareMetric("time_to_target", "wall_s_to_target", "lower", "seconds to the target loss", heat_map=False),
        CompareMetric("energy_to_target", "energy_j_to_target", "lower", "joules to the target loss", heat_map=False),
    ),
    compare_group=("backend",),
    compare_family=("model", "precision", "optimizer", "schedule"),
    refusal_without_cuda=refusal_without_cuda,
)
