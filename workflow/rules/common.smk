# Configuration and the cell table: validated once, before any job starts.
from snakemake.exceptions import WorkflowError

from flashwatt.attention.cell import WILDCARD_CONSTRAINTS
from flashwatt.config import ConfigError, measure_settings, resolve_suite, suite_cells, validate_config
from flashwatt.control.figures import CONTROL_FIGURES
from flashwatt.control.suite import control_runs
from flashwatt.distributed.figures import DISTRIBUTED_FIGURES
from flashwatt.distributed.suite import distributed_runs
from flashwatt.models.figures import MODEL_FIGURES
from flashwatt.models.suite import model_runs
from flashwatt.attention.figures import FIGURES
from flashwatt.training.figures import TRAINING_FIGURES
from flashwatt.training.suite import training_runs, training_section
from flashwatt.submit.resources import refuse_unknown_resources

try:
    validate_config(config)
    SUITE = resolve_suite(config)
    config["suite"] = SUITE  # what ran, for the report (auto is resolved once, here)
    CELLS = {SUITE: suite_cells(config, SUITE)}
    CONTROL = {SUITE: control_runs(config, SUITE)}
    DISTRIBUTED = {SUITE: distributed_runs(config, SUITE)}
    MODELS = {SUITE: model_runs(config, SUITE, measure_settings(config, SUITE))}
    TRAINING = {SUITE: training_runs(config, SUITE, measure_settings(config, SUITE))}
    # Resources set for the cells (profile or --set-resources), checked before any job
    # starts: a misspelt name (slurm_acount) would otherwise fail every cell.
    refuse_unknown_resources("cell", workflow.resource_settings.overwrite_resources.get("cell", {}))
except (ConfigError, ValueError) as error:
    raise WorkflowError(f"flashwatt: {error}") from None

# The report's method sentences (workflow/report/workflow.rst), written from what the
# suite's summary says each cell used (timing method, energy or why none, device): the
# report is built by its own Snakemake run after the cells, so the summary read here is
# the one the report shows. The report text sees only the config, hence the key.
from flashwatt.report_method import report_method

config["report_method"] = report_method(f"results/{SUITE}/summary.parquet")
config["report_parts"] = {"cells": bool(CELLS[SUITE]), "control": bool(CONTROL[SUITE]),
                          "distributed": bool(DISTRIBUTED[SUITE]), "models": bool(MODELS[SUITE]),
                          "training": bool(TRAINING[SUITE])}

wildcard_constraints:
    **WILDCARD_CONSTRAINTS,
    figure="|".join(FIGURES),

def cells_of(suite):
    if suite not in CELLS:
        try:
            CELLS[suite] = suite_cells(config, suite)
        except ConfigError as error:
            raise WorkflowError(f"flashwatt: {error}") from None
    return CELLS[suite]

def control_cells_of(suite):
    """The suite's control cells (empty for a suite without a control section)."""
    if suite not in CONTROL:
        CONTROL[suite] = control_runs(config, suite)
    return list(CONTROL[suite])

def control_spec(cell):
    """What a control cell runs beyond its name: lengths, the co-located load, the oracle."""
    if cell.suite not in CONTROL:
        control_cells_of(cell.suite)
    if cell not in CONTROL[cell.suite]:
        raise WorkflowError(f"flashwatt: {cell.path} is not a control cell of suite {cell.suite} in this config")
    return CONTROL[cell.suite][cell]

def distributed_cells_of(suite):
    """The suite's distributed cells (empty for a suite without a distributed section)."""
    if suite not in DISTRIBUTED:
        try:
            DISTRIBUTED[suite] = distributed_runs(config, suite)
        except ConfigError as error:
            raise WorkflowError(f"flashwatt: {error}") from None
    return list(DISTRIBUTED[suite])

def distributed_cell_of(wc):
    """The distributed cell a job's wildcards name."""
    from flashwatt.distributed.cell import DistributedCell

    return DistributedCell.from_wildcards(wc.suite, wc.method, wc.dprecision, wc.dname)

def distributed_spec(cell):
    """The job spec of a distributed cell (its shape, strategy, block, repeats and warmup)."""
    distributed_cells_of(cell.suite)
    if cell not in DISTRIBUTED[cell.suite]:
        raise WorkflowError(f"flashwatt: {cell.path} is not a distributed cell of suite {cell.suite} in this config")
    return DISTRIBUTED[cell.suite][cell]

def model_cells_of(suite):
    """The suite's model cells (empty for a suite without a models section)."""
    if suite not in MODELS:
        try:
            MODELS[suite] = model_runs(config, suite, measure_settings(config, suite))
        except ConfigError as error:
            raise WorkflowError(f"flashwatt: {error}") from None
    return list(MODELS[suite])

def model_cell_of(wc):
    """The model cell a job's wildcards name."""
    from flashwatt.models.cell import ModelCell

    return ModelCell.from_wildcards(wc.suite, wc.mmodel, wc.mbackend, wc.mprecision, wc.mname)

def model_spec_of(cell):
    """The job spec of a model cell (its model's config, steps, seed and measure settings)."""
    model_cells_of(cell.suite)
    if cell not in MODELS[cell.suite]:
        raise WorkflowError(f"flashwatt: {cell.path} is not a model cell of suite {cell.suite} in this config")
    return MODELS[cell.suite][cell]

def train_cells_of(suite):
    """The suite's training cells (empty for a suite without a training section)."""
    if suite not in TRAINING:
        try:
            TRAINING[suite] = training_runs(config, suite, measure_settings(config, suite))
        except ConfigError as error:
            raise WorkflowError(f"flashwatt: {error}") from None
    return list(TRAINING[suite])

def train_cell_of(wc):
    """The training cell a job's wildcards name."""
    from flashwatt.training.cell import TrainCell

    return TrainCell.from_wildcards(wc.suite, wc.tmodel, wc.tbackend, wc.tprecision, wc.tname)

def train_spec_of(cell):
    """The job spec of a training cell (model, data manifest, evaluation, schedule, target)."""
    train_cells_of(cell.suite)
    if cell not in TRAINING[cell.suite]:
        raise WorkflowError(f"flashwatt: {cell.path} is not a training cell of suite {cell.suite} in this config")
    return TRAINING[cell.suite][cell]

def training_section_of(suite):
    """The suite's training section with its defaults (what the data rule reads)."""
    section = training_section(config, suite)
    if section is None:
        raise WorkflowError(f"flashwatt: suite {suite} has no training section")
    return section

def suite_outputs(suite):
    """What the default target builds for a suite: the attention cells' summary and figures,
    the control runs', distributed cells' and model cells' tables and figures, as the suite has them."""
    out = []
    if cells_of(suite):
        out += [f"results/{suite}/summary.parquet", f"results/{suite}/flagged.csv", *figure_paths(suite)]
    if control_cells_of(suite):
        out += [f"results/{suite}/control.parquet", *(f"figures/{suite}/{name}.pdf" for name in CONTROL_FIGURES)]
    if distributed_cells_of(suite):
        out += [f"results/{suite}/distributed.parquet",
                *(f"figures/{suite}/{name}.pdf" for name in DISTRIBUTED_FIGURES)]
    if model_cells_of(suite):
        out += [f"results/{suite}/models.parquet", *(f"figures/{suite}/{name}.pdf" for name in MODEL_FIGURES)]
    if train_cells_of(suite):
        out += [f"results/{suite}/training.parquet", *(f"figures/{suite}/{name}.pdf" for name in TRAINING_FIGURES)]
    return out

def recorded_cells_of(suite):
    """Record paths of every cell of the suite, filter or not: the summary covers all of
    them that have a record, so a filtered run adds to the suite's summary, figures and
    report instead of replacing them with the slice."""
    return [cell.path for cell in suite_cells(config, suite, filtered=False)]

def figure_paths(suite):
    return [f"figures/{suite}/{f.name}.{f.ext}" for f in FIGURES.values()]
