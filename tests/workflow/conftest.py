"""A copy of the workflow in a temporary folder, and a way to run Snakemake in it."""
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
WORKFLOW_FILES = ["Snakefile", "workflow", "config", "scripts", "profiles", "envs", "kernels"]


def copy_workflow(dest: Path) -> Path:
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True)
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


@pytest.fixture
def workdir(tmp_path):
    return copy_workflow(tmp_path)


def snakemake(workdir: Path, *args: str, timeout: int = 600, env: dict | None = None) -> subprocess.CompletedProcess:
    """Run Snakemake as a user would, with no GPU visible."""
    full_env = {**os.environ, "CUDA_VISIBLE_DEVICES": "", **(env or {})}
    return subprocess.run([sys.executable, "-m", "snakemake", *args], cwd=workdir, env=full_env,
                          capture_output=True, text=True, timeout=timeout)
