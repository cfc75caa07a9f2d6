"""A slice of the smoke suite run twice by `flashwatt run --repeat 2`, then its report and the
comparison of its runs read in headless Chromium (tests/browser_pages.py): the suite's report
(Snakemake's self-contained HTML) shows every figure and table with its caption and no
script error, and a broken caption or figure in it fails the check."""
import json
import os
import subprocess
import sys

import pandas as pd
import pytest

from browser_pages import check_comparison_page, check_suite_report, chromium
from support import copy_workflow

from .conftest import snakemake

# Heavy: two runs of the slice and a browser on their report; `make test` keeps the report's
# contents (test_local_run.py), the comparison page in Chromium (tests/test_compare_page_browser.py)
# and the repeats' bookkeeping (tests/test_repeat.py).
pytestmark = [pytest.mark.workflow, pytest.mark.browser, pytest.mark.heavy]
# two cells, forward and forward-backward: enough for every figure and table of the report
SLICE = ["suite=smoke", 'filter=kernel == "naive" and seq_len == 32']


def flashwatt(workdir, *args, timeout=900):
    return subprocess.run([sys.executable, "-m", "flashwatt.cli", *args], cwd=workdir, capture_output=True, text=True,
                          env={**os.environ, "CUDA_VISIBLE_DEVICES": ""}, timeout=timeout)


@pytest.fixture(scope="module")
def repeated(tmp_path_factory):
    workdir = copy_workflow(tmp_path_factory.mktemp("repeated"))
    proc = flashwatt(workdir, "run", "--repeat", "2", "--cores", "2", "--config", *SLICE)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return workdir, proc


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def test_each_repeat_is_measured_again_and_kept(repeated):
    workdir, proc = repeated
    suite = workdir / "results/smoke"
    assert "run 2 of 2 kept in" in proc.stdout
    started = []
    for i in (1, 2):
        run = suite / "runs" / str(i)
        info = json.loads((run / "run.json").read_text())
        assert info["run"] == i and info["of"] == 2 and info["exit_status"] == 0
        table = pd.read_parquet(run / "summary.parquet")
        assert len(table) == 2 and set(table["status"]) == {"ok"}
        records = sorted((run / "cells").rglob("*.json"))
        assert len(records) == 2
        record = json.loads(records[0].read_text())
        assert len(record["timing"]["per_call_ms"]) == record["timing"]["steps"]
        started.append(record["started"])
    assert started[0] != started[1]  # the second run measured the cell again


def test_the_suite_report_reads_well_in_a_browser(repeated, browser):
    workdir, _ = repeated
    assert check_suite_report(browser, workdir / "results/smoke/report.html") == []


def test_the_comparison_of_the_runs_reads_well_and_passes_a_loose_check(repeated, browser):
    workdir, _ = repeated
    proc = flashwatt(workdir, "compare", "results/smoke/runs/1", "results/smoke/runs/2", "--labels", "run1,run2",
                     "--fail-if", "latency:+1000%", timeout=300)
    assert proc.returncode == 0, proc.stdout[-2000:] + proc.stderr[-2000:]
    table = pd.read_parquet(workdir / "results/compare/comparison.parquet")
    assert len(table) == 2 and set(table["latency_from"]) == {"repeats/repeats"}
    assert check_comparison_page(browser, workdir / "results/compare/report.html") == []


def test_a_broken_caption_or_figure_in_the_suite_report_fails_the_check(repeated, browser):
    workdir, _ = repeated
    caption = workdir / "workflow/report/figure.rst"
    figure = workdir / "figures/smoke/latency.png"
    text, good = caption.read_text(), figure.read_bytes()
    try:
        caption.write_text(text + "\nA caption with ``an unclosed literal.\n")
        figure.write_bytes(b"\x89PNG but not an image")
        proc = snakemake(workdir, "--config", *SLICE, "--report", "results/smoke/broken.html")
        assert proc.returncode == 0, proc.stderr[-3000:]
        problems = check_suite_report(browser, workdir / "results/smoke/broken.html")
    finally:
        caption.write_text(text)
        figure.write_bytes(good)
    assert any("caption" in p and "System Message" in p for p in problems), problems
    assert any("latency" in p and "figure not shown" in p for p in problems), problems
