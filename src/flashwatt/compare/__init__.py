"""`flashwatt compare`: runs of the same cells side by side (devices, commits, configs,
repeats), each ratio with an interval from the cells' own repeats and from repeated runs.

    sides        what a side is: suite folders, summary files, the runs a folder keeps
    repeat       `flashwatt run --repeat N`: the suite run N times, each kept under runs/<i>/
    intervals    a ratio's interval, bootstrapped with SciPy
    join         the cells of two sides joined by what they measure, per kind (flashwatt.kinds)
    summaries    per kernel and per shape family
    regression   `--fail-if latency:+5%`: the cells that got worse beyond noise and a threshold
    figures      the ratio heat maps and the per-kernel bars, in the suite's figure style
    page         the report page (HTML)
    command      the subcommand: arguments, outputs, exit status

docs/compare.md says how to use it and how the intervals are made.
"""
