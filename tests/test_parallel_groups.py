"""How tests/conftest.py lays the tests out for parallel workers (pytest-xdist, `--dist
loadscope` as `make test` runs it): each module whole on one worker, its module-scoped
fixtures made once; the Slurm tests of every module on one worker; the Slurm, slow and
workflow tests handed out first."""
from __future__ import annotations

import re
from pathlib import Path

pytest_plugins = ["pytester"]

HERE = Path(__file__).parent

SHARED = """
import pytest

@pytest.fixture(scope="module")
def run(tmp_path_factory):
    with open({made!r}, "a") as fh:  # one line each time the fixture is made
        fh.write("made\\n")

def test_a(run): pass
def test_b(run): pass
def test_c(run): pass
def test_d(): pass
"""


def _layout(pytester):
    pytester.makeconftest((HERE / "conftest.py").read_text())
    pytester.makepyfile(support=(HERE / "support.py").read_text())
    made = pytester.path / "made.txt"
    pytester.makepyfile(
        test_shared=SHARED.format(made=str(made)),
        test_other="""
            import pytest

            def test_e(): pass
            def test_f(): pass

            @pytest.mark.workflow
            def test_g(): pass

            @pytest.mark.slow
            def test_h(): pass
        """,
    )
    slurm = pytester.mkdir("slurm")
    (slurm / "test_one.py").write_text("import pytest\npytestmark = pytest.mark.slurm\ndef test_s1(): pass\n"
                                       "def test_s2(): pass\n")
    (slurm / "test_two.py").write_text("import pytest\npytestmark = pytest.mark.slurm\ndef test_s3(): pass\n")
    return made


def test_the_slurm_slow_and_workflow_units_come_first_each_whole(pytester):
    _layout(pytester)
    run = pytester.inline_run("--collect-only", "-p", "no:cacheprovider")
    items = run.getcalls("pytest_collection_finish")[0].session.items
    # slurm (two modules, one unit), then test_other.py (a slow test), then test_shared.py
    assert [item.name for item in items] == ["test_s1", "test_s2", "test_s3", "test_e", "test_f", "test_g",
                                             "test_h", "test_a", "test_b", "test_c", "test_d"]


def test_a_module_runs_on_one_worker_and_makes_its_fixture_once(pytester):
    made = _layout(pytester)
    result = pytester.runpytest_subprocess("-n", "3", "--dist", "loadscope", "--no-loadscope-reorder", "-v",
                                           "-p", "no:cacheprovider")
    result.assert_outcomes(passed=11)
    worker = {m.group(2): m.group(1) for m in re.finditer(r"\[(gw\d)\].*PASSED \S+::(test_\w+)", result.stdout.str())}
    assert len(worker) == 11, result.stdout.str()
    assert len({worker[t] for t in ("test_a", "test_b", "test_c", "test_d")}) == 1
    assert len({worker[t] for t in ("test_s1", "test_s2", "test_s3")}) == 1
    assert made.read_text() == "made\n"
