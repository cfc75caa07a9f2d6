"""Snakemake resources -> submitit executor parameters, and the check for misspelt names.

The one place where Snakemake's resource names meet submitit's parameter names. It
imports neither: the Snakefile checks resource names before any job starts without
loading submitit.
"""
from __future__ import annotations

import shlex
from typing import Any, Mapping

from humanfriendly import InvalidTimespan, parse_timespan

DEFAULT_TIMEOUT_MIN = 60

# Snakemake resource name -> submitit (AutoExecutor) parameter name.
_RESOURCE_TO_PARAMETER = {
    "slurm_partition": "slurm_partition",
    "partition": "slurm_partition",
    "slurm_account": "slurm_account",
    "account": "slurm_account",
    "gpus": "gpus_per_node",
    "gpu": "gpus_per_node",
    "gres": "slurm_gres",
    "cpus_per_task": "cpus_per_task",
    "qos": "slurm_qos",
    "constraint": "slurm_constraint",
    "tasks": "tasks_per_node",
    "nodes": "nodes",
}
_INTEGER_PARAMETERS = ("gpus_per_node", "cpus_per_task", "tasks_per_node", "nodes")
# Resources Snakemake adds to every job (mem and disk are its human-readable copies of
# mem_mb and disk_mb); they say nothing the mapping needs.
_IGNORED_RESOURCES = frozenset({"_cores", "_nodes", "tmpdir", "mem_mib", "disk_mb", "disk_mib", "mem", "disk"})
_KNOWN_RESOURCES = frozenset(_RESOURCE_TO_PARAMETER) | {"mem_mb", "runtime", "slurm_extra"}
KNOWN_RESOURCE_NAMES = tuple(sorted(_KNOWN_RESOURCES))

# Short sbatch options accepted in slurm_extra, by their long name.
_SHORT_OPTIONS = {
    "A": "account", "C": "constraint", "G": "gpus", "N": "nodes", "c": "cpus_per_task",
    "n": "ntasks", "p": "partition", "q": "qos", "t": "time", "w": "nodelist", "x": "exclude",
}


def _as_dict(resources: Any) -> dict[str, Any]:
    if resources is None:
        return {}
    if hasattr(resources, "items"):  # a Mapping or Snakemake's Resources object
        return {str(k): v for k, v in resources.items()}
    raise TypeError(f"resources must be a mapping of Snakemake resource names, got {type(resources).__name__}")


def runtime_minutes(value: Any) -> int:
    """The runtime resource in whole minutes (at least 1), read the way Snakemake reads it.

    Snakemake turns a runtime string into minutes before a rule sees it: digits are
    minutes, anything else goes through humanfriendly's time-span parser ('2h', '90min',
    '1.5 hours'). run_job called directly accepts the same forms, so one value means the
    same time limit in a profile and in a script.
    """
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        return max(1, round(value))
    text = str(value).strip().strip("'\"")
    try:
        return max(1, round(float(text)))
    except ValueError:
        pass
    try:
        return max(1, round(parse_timespan(text) / 60))
    except InvalidTimespan:
        raise ValueError(f"resource runtime={value!r}: give minutes (e.g. 90) or a time span "
                         f"Snakemake reads, such as '2h', '90min' or '1.5 hours'") from None


def _parse_slurm_extra(extra: str) -> dict[str, Any]:
    """'--qos=high --exclusive -C a100' -> {'qos': 'high', 'exclusive': True, 'constraint': 'a100'}."""
    options: dict[str, Any] = {}
    tokens = shlex.split(str(extra))
    i = 0
    while i < len(tokens):
        token = tokens[i]
        if token.startswith("--"):
            key, eq, value = token[2:].partition("=")
            if not eq:
                if i + 1 < len(tokens) and not tokens[i + 1].startswith("-"):
                    value, i = tokens[i + 1], i + 1
                else:
                    value = True
        elif token.startswith("-") and len(token) >= 2 and token[1] in _SHORT_OPTIONS:
            key = _SHORT_OPTIONS[token[1]]
            value = token[2:]
            if not value:
                if i + 1 >= len(tokens):
                    raise ValueError(f"slurm_extra={extra!r}: option {token} needs a value")
                value, i = tokens[i + 1], i + 1
        else:
            raise ValueError(f"slurm_extra={extra!r}: cannot read {token!r} (use --long-option=value)")
        options[key.replace("-", "_")] = value
        i += 1
    return options


def unknown_resources(names) -> list[str]:
    """The resource names in `names` that no executor of flashwatt knows (misspellings)."""
    return sorted(n for n in names if n not in _KNOWN_RESOURCES and n not in _IGNORED_RESOURCES)


def refuse_unknown_resources(rule: str, names) -> None:
    """ValueError naming the unknown resources set for `rule`, and the known ones."""
    unknown = unknown_resources(names)
    if unknown:
        raise ValueError(f"unknown resource(s) for rule {rule}: {', '.join(unknown)}; "
                         f"known: {', '.join(KNOWN_RESOURCE_NAMES)}")


def slurm_parameters(resources: Mapping[str, Any] | None) -> dict[str, Any]:
    """Map Snakemake resources onto submitit AutoExecutor parameters.

    Unknown names raise, except those Snakemake adds to every job (_cores, _nodes,
    tmpdir, mem_mib, disk_mb, disk_mib, mem, disk).
    """
    res = _as_dict(resources)
    unknown = unknown_resources(res)
    if unknown:
        raise ValueError(
            f"unknown resource(s) {', '.join(map(repr, unknown))} for a submitted job; "
            f"known: {', '.join(KNOWN_RESOURCE_NAMES)}"
        )
    params: dict[str, Any] = {}
    for key, value in res.items():
        if value is None or key in _IGNORED_RESOURCES:
            continue
        if key == "mem_mb":
            params["slurm_mem"] = f"{int(value)}M"
        elif key == "runtime":
            params["timeout_min"] = runtime_minutes(value)
        elif key == "slurm_extra":
            if str(value).strip():
                params["slurm_additional_parameters"] = _parse_slurm_extra(value)
        else:
            name = _RESOURCE_TO_PARAMETER[key]
            if name in _INTEGER_PARAMETERS:
                try:
                    value = int(value)
                except (TypeError, ValueError):
                    raise ValueError(f"resource {key}={value!r}: must be an integer") from None
            else:
                value = str(value)
            if name in params and params[name] != value:
                raise ValueError(f"resource {key}={value!r} conflicts with an alias given {params[name]!r}")
            params[name] = value
    params.setdefault("timeout_min", DEFAULT_TIMEOUT_MIN)
    return params
