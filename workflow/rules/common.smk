# Configuration and the cell table: validated once, before any job starts. Every kind of
# cell (flashwatt.kinds) plans its own cells from its section of the suite.
import re

from snakemake.exceptions import WorkflowError

from flashwatt.config import ConfigError, resolve_suite, validate_config
from flashwatt.kinds import all_kinds, plan_suite
from flashwatt.submit.resources import refuse_unknown_resources

try:
    validate_config(config)
    SUITE = resolve_suite(config)
    config["suite"] = SUITE  # what ran, for the report (auto is resolved once, here)
    PLANS = {SUITE: plan_suite(config, SUITE)}
    # Resources set for the cells (profile or --set-resources), checked before any job
    # starts: a misspelt name (slurm_acount) would otherwise fail every cell.
    for kind in all_kinds():
        refuse_unknown_resources(f"{kind.rule_prefix}cell",
                                 workflow.resource_settings.overwrite_resources.get(f"{kind.rule_prefix}cell", {}))
except (ConfigError, ValueError) as error:
    raise WorkflowError(f"flashwatt: {error}") from None

wildcard_constraints:
    suite="[a-z0-9_]+",


# The report's text: for each kind with cells in the suite, how its cells were measured.
# The report is built by its own Snakemake run after the cells, so what a kind's text
# reads from the suite's tables (the attention kind's method sentences) is what the report shows.
config["report_parts"] = [kind.report_text(SUITE) for kind in all_kinds() if kind.name in PLANS[SUITE]]


def planned(suite, kind, filtered=True):
    """{cell: spec} of one kind in a suite (the filter applied unless `filtered` is False)."""
    key = suite if filtered else (suite, "unfiltered")
    if key not in PLANS:
        try:
            PLANS[key] = plan_suite(config, suite, filtered=filtered)
        except ConfigError as error:
            raise WorkflowError(f"flashwatt: {error}") from None
    return PLANS[key].get(kind.name, {})


def cell_of(kind, wc):
    """The cell a job's wildcards name (those of its record pattern)."""
    return kind.cell.from_wildcards(**{name: wc[name] for name in re.findall(r"{(\w+)}", kind.cell.RECORD_PATTERN)})


def spec_of(kind, wc):
    """The job spec of the cell a job's wildcards name, from the suite's plan."""
    cell = cell_of(kind, wc)
    cells = planned(cell.suite, kind, filtered=False)
    if cell not in cells:
        raise WorkflowError(f"flashwatt: {cell.path} is not a {kind.name} cell of suite {cell.suite} in this config")
    return cells[cell]


def suite_outputs(suite):
    """What the default target builds for a suite: each kind's tables and figures."""
    return [path for kind in all_kinds() if planned(suite, kind) for path in kind.outputs(suite)]
