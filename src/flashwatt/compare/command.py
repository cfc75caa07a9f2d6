"""`flashwatt compare BASELINE OTHER [OTHER ...]`: the subcommand's options, its outputs and
its exit status (0; 1 when a --fail-if rule failed a cell; 2 for a bad argument).

Outputs, in --out (default results/compare):
    comparison.parquet, comparison.csv     a row per cell and other side (flashwatt.compare.join)
    by_kernel.csv, by_family.csv            the summaries (flashwatt.compare.summaries), and
    by_kernel.parquet, by_family.parquet    their Parquet twins, which the figures read
    regressions.csv                         the cells a --fail-if rule failed (with --fail-if)
    figures/*.png                           the heat maps and the per-kernel bars
    report.html                             the page (flashwatt.compare.page)
"""
from __future__ import annotations

import argparse

from flashwatt.compare.defaults import CONFIDENCE, DEFAULT_OUT, RESAMPLES

HELP = "compare runs of the same cells: devices, commits, configs, repeats, with intervals"


def add_parser(sub) -> None:
    p = sub.add_parser("compare", help=HELP, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("sides", nargs="+", metavar="SIDE",
                   help="a suite folder (results/<suite>, with its runs/ if kept) or a table "
                        "(results/<suite>/summary.parquet); paths joined by commas are repeated runs of one "
                        "side. The first side is the baseline; every other one is compared with it")
    p.add_argument("-o", "--out", default=DEFAULT_OUT, help=f"folder for the table, figures and page ({DEFAULT_OUT})")
    p.add_argument("--labels", help="names of the sides, comma-separated (default: the paths as given)")
    p.add_argument("--fail-if", nargs="+", default=[], metavar="METRIC:+PCT%",
                   help="exit 1 naming the cells whose METRIC got worse by more than PCT beyond its interval, "
                        "e.g. latency:+5%% energy:+3%% tflops:-5%%")
    p.add_argument("--no-figures", action="store_true",
                   help="write the tables and the page without figures (a quicker check in CI)")
    p.add_argument("--confidence", type=float, default=CONFIDENCE, help=f"the intervals' level ({CONFIDENCE})")
    p.add_argument("--resamples", type=int, default=RESAMPLES, help=f"bootstrap resamples ({RESAMPLES})")


def compare(args) -> int:
    """Run the comparison (pandas, SciPy and matplotlib are imported only now)."""
    from flashwatt.compare.outputs import write_comparison

    return write_comparison(args)
