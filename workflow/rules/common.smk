# Configuration and the cell table: validated once, before any job starts. Every kind of
# cell (flashwatt.kinds) plans its own cells from its section of the suite.
import os
import re

from snakemake.exceptions import WorkflowError

from flashwatt import failures
from flashwatt.config import ConfigError, command_line_measure_first, read_config_file, resolve_suite, validate_config
from flashwatt.host_skips import Host, refused_here, runs_here
from flashwatt.kinds import all_kinds, plan_suite
from flashwatt.submit.resources import refuse_unknown_resources

try:
    # The measure settings given on the command line (config files named after
    # config/config.yaml, then --config) win over a suite's own, as in flashwatt.config.load_config.
    command_line_measure_first(config, [
        *(read_config_file(path) for path in workflow.config_settings.configfiles
          if os.path.realpath(path) != os.path.realpath("config/config.yaml")),
        dict(workflow.config_settings.config),
    ])
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


def suite_records(suite):
    """The record of every cell of the suite (the filter applied)."""
    return [cell.path for kind in all_kinds() for cell in planned(suite, kind)]


# Failed cells the next plain run measures again (config key retry_failed, flashwatt.failures):
# {cell: status of its record}.
RETRIES = failures.to_retry([cell for cells in PLANS[SUITE].values() for cell in cells],
                            failures.retried_statuses(config))
# Cells that cannot run on this host, where the cells run on it: {cell: (kind, spec, reason)}
# (flashwatt.host_skips; workflow/rules/skipped_here.smk records them without a job).
REFUSED_HERE = refused_here(PLANS[SUITE], Host.here()) if runs_here(config) else {}


def force_again(paths):
    """Make Snakemake run the jobs writing `paths` again, and what depends on them, as
    `--forcerun PATH ...` would. No directive does this from a workflow: the paths join
    the forced files of the DAG being built (the set --forcerun fills), which a dry run
    shows as "Forced execution"."""
    forced = getattr(getattr(workflow, "dag", None), "forcefiles", None)
    if not isinstance(forced, set):
        raise WorkflowError("flashwatt: this Snakemake does not let the workflow retry failed cells; run "
                            "`snakemake --forcerun $(flashwatt failed)`, or keep them with --config retry_failed=false")
    forced.update(paths)


# The failed cells this run forces (those of RETRIES when it builds the default target; none
# when it builds named files), for what the run says before it starts (run_outcome.smk).
FORCED_AGAIN = {}


def default_target(wildcards):
    """What a plain run builds: every record of the suite (a deleted one is measured again;
    Snakemake would not rerun a job for a missing file that no out-of-date job needs), the
    tables and the figures; failed records to retry are forced (retry_failed)."""
    if RETRIES:
        force_again([cell.path for cell in RETRIES])
        FORCED_AGAIN.update(RETRIES)
    return [*suite_records(SUITE), *suite_outputs(SUITE)]
