"""How tests/conftest.py lays the tests out for parallel workers (pytest-xdist --dist
loadgroup): tests sharing a module-scoped fixture in one group, the Slurm tests in one,
the rest alone; the Slurm, slow and workflow groups first."""
from __future__ import annotations

from pathlib import Path

pytest_plugins = ["pytester"]

CONFTEST = Path(__file__).with_name("conftest.py")


def _groups(items) -> dict[str, str | None]:
    return {item.name: (m.args[0] if (m := item.get_closest_marker("xdist_group")) else None) for item in items}


def test_tests_sharing_a_module_fixture_share_a_worker_and_the_long_ones_go_first(pytester):
    pytester.makeconftest(CONFTEST.read_text())
    pytester.makepyfile(
        test_shared="""
            import pytest

            @pytest.fixture(scope="module")
            def run():
                return 1

            def test_a(run):
                pass

            def test_b(run):
                pass

            def test_alone():
                pass
        """,
        test_other="""
            import pytest

            def test_c():
                pass

            @pytest.mark.workflow
            def test_d():
                pass

            @pytest.mark.slurm
            def test_e():
                pass

            @pytest.mark.xdist_group("mine")
            def test_f():
                pass

            @pytest.mark.slow
            def test_g():
                pass
        """,
    )
    run = pytester.inline_run("--collect-only", "-p", "no:cacheprovider")
    items = run.getcalls("pytest_collection_finish")[0].session.items
    assert _groups(items) == {"test_a": "test_shared.py", "test_b": "test_shared.py", "test_alone": None,
                              "test_c": None, "test_d": None, "test_e": "slurm", "test_f": "mine", "test_g": None}
    # slurm, then slow, then workflow, then the rest; each group whole, in collection order
    # (test_other.py before test_shared.py)
    assert [item.name for item in items] == ["test_e", "test_g", "test_d", "test_c", "test_f", "test_a", "test_b",
                                             "test_alone"]
