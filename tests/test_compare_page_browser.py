"""The comparison's page in a real browser (headless Chromium, tests/browser_pages.py): every
figure shown with its caption, every table readable, no script error; and each kind of
breakage - a figure that does not load, a caption gone, a script error - fails the check."""
from __future__ import annotations

import shutil

import pytest

from browser_pages import check_comparison_page, chromium
from compare_runs import CELLS, suite_run
from flashwatt.cli import main

pytestmark = pytest.mark.browser


@pytest.fixture(scope="module")
def page(tmp_path_factory):
    root = tmp_path_factory.mktemp("compare-page")
    base = suite_run(root / "a", seed=1, runs=2)
    other = suite_run(root / "b", seed=2, changes={CELLS[2]: {"latency_factor": 1.3}})
    out = root / "out"
    assert main(["compare", str(base), str(other), "-o", str(out), "--labels", "main,branch",
                 "--fail-if", "latency:+5%"]) == 1
    return out / "report.html"


@pytest.fixture(scope="module")
def browser():
    with chromium() as driver:
        yield driver


def test_the_page_reads_well(page, browser):
    assert check_comparison_page(browser, page) == []


def _broken_copy(page, tmp_path):
    copy = tmp_path / "out"
    shutil.copytree(page.parent, copy)
    return copy / "report.html"


def test_a_figure_that_does_not_load_fails_the_check(page, browser, tmp_path):
    broken = _broken_copy(page, tmp_path)
    (broken.parent / "figures" / "1-attention-latency.png").write_bytes(b"not a png")
    problems = check_comparison_page(browser, broken)
    assert any("figure not shown" in p and "1-attention-latency.png" in p for p in problems), problems
    (broken.parent / "figures" / "1-attention-energy.png").unlink()
    problems = check_comparison_page(browser, broken)
    assert any("console error" in p and "1-attention-energy.png" in p for p in problems), problems


def test_a_missing_or_broken_caption_fails_the_check(page, browser, tmp_path):
    broken = _broken_copy(page, tmp_path)
    html = broken.read_text()
    start = html.index("<figcaption>") + len("<figcaption>")
    broken.write_text(html[:start] + html[html.index("</figcaption>", start):])
    assert any("has no caption" in p for p in check_comparison_page(browser, broken))
    broken.write_text(html.replace("</figcaption>", " {{ metric.label }}</figcaption>", 1))
    assert any("broken text" in p for p in check_comparison_page(browser, broken))


def test_a_script_error_or_an_empty_table_fails_the_check(page, browser, tmp_path):
    broken = _broken_copy(page, tmp_path)
    html = broken.read_text()
    broken.write_text(html.replace("</body>", "<script>flashwatt.missing()</script></body>"))
    assert any("console error" in p and "flashwatt is not defined" in p for p in check_comparison_page(browser, broken))
    start = html.index('<tbody>', html.index('id="by-kernel-1-attention"'))
    broken.write_text(html[:start] + "<tbody></tbody>" + html[html.index("</tbody>", start) + len("</tbody>"):])
    assert any("by-kernel-1-attention" in p and "without rows" in p for p in check_comparison_page(browser, broken))
