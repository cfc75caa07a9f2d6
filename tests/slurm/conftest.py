"""Tests against the real single-node Slurm of .ci/slurm/up.sh (run that first).

A missing or dead cluster is a failure, never a skip: these tests exist to prove the
Slurm path works, and a skipped proof looks like a passing one.
"""
from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def pytest_collection_modifyitems(items):
    here = Path(__file__).parent
    for item in items:
        if here in Path(item.fspath).parents:
            item.add_marker(pytest.mark.slurm)


def sh(*cmd: str, timeout: float = 10) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout.strip()


@pytest.fixture(scope="session")
def slurm() -> None:
    """Fail (never skip) unless sinfo reaches a controller with an idle node and sacct works."""
    if shutil.which("sinfo") is None:
        pytest.fail("Slurm tests need a cluster: no `sinfo` on PATH. Run `sudo .ci/slurm/up.sh` first.", pytrace=False)
    try:
        states = sh("sinfo", "-h", "-o", "%P %t")
        sh("sacct", "-n", "-X", "-S", "now")
    except (subprocess.SubprocessError, OSError) as error:
        detail = getattr(error, "stderr", "") or error
        pytest.fail(f"Slurm is not reachable ({detail}). Run `sudo .ci/slurm/up.sh` first.", pytrace=False)
    partitions = {line.split()[0].rstrip("*") for line in states.splitlines()}
    if not {"cpu", "gpu"} <= partitions:
        pytest.fail(f"Slurm needs partitions cpu and gpu (found: {states!r}); use .ci/slurm/up.sh", pytrace=False)


@pytest.fixture
def fast_wait(monkeypatch):
    """Poll the result file and sacct often: test jobs last seconds, not hours."""
    monkeypatch.setenv("FLASHWATT_POLL_S", "0.2")
    monkeypatch.setenv("FLASHWATT_STATUS_INTERVAL_S", "2")


def pytest_terminal_summary(terminalreporter):
    from support import CI_LINES

    if CI_LINES:
        terminalreporter.section("Slurm jobs of this run")
        for line in CI_LINES:
            terminalreporter.write_line(line)
