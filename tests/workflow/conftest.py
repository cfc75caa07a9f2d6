"""A copy of the workflow in a temporary folder, and a way to run Snakemake in it."""
import os
import subprocess
import sys
from pathlib import Path

import pytest
from support import REPO, copy_workflow


@pytest.fixture
def workdir(tmp_path):
    return copy_workflow(tmp_path)


def snakemake(workdir: Path, *args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run Snakemake as a user would, with no GPU visible."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
