"""Where and with what a record was measured: host, job, software versions, code version."""
from __future__ import annotations

import os
import platform
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path

import flashwatt
from flashwatt.checkout import checkout
from flashwatt.submit.environment import current_job_info


def utc_now() -> str:
    return datetime.now(timezone.utc).isoformat(timespec="milliseconds")


def git_state(root: Path | None = None) -> dict:
    """Commit and dirty flag of the checkout that measured (flashwatt.checkout: the
    package's own, else the working directory's); None with a reason outside a checkout."""
    root = root or checkout()
    if root is None:
        reason = "not in a checkout: flashwatt is installed and the working directory has no Snakefile"
    else:
        try:
            commit = _git(root, "rev-parse", "HEAD").strip()
            dirty = bool(_git(root, "status", "--porcelain", "--untracked-files=no").strip())
            return {"commit": commit, "dirty": dirty, "checkout": str(root)}
        except (OSError, subprocess.SubprocessError) as err:
            reason = f"git unavailable: {err}"
    # A copy of the tree without .git (an export to a compute node) can name its commit.
    exported = os.environ.get("FLASHWATT_SOURCE_COMMIT")
    if exported:
        return {"commit": exported, "dirty": None, "source": "FLASHWATT_SOURCE_COMMIT"}
    return {"commit": None, "dirty": None, "reason": reason}


def _git(root: Path, *args: str) -> str:
    return subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, timeout=20, check=True).stdout


def software() -> dict:
    import torch

    return {
        "python": platform.python_version(),
        "torch": str(torch.__version__),
        "cuda": str(torch.version.cuda) if torch.version.cuda else None,
        "cudnn": torch.backends.cudnn.version() if torch.backends.cudnn.is_available() else None,
        "flashwatt": flashwatt.__version__,
        "platform": platform.platform(),
        "executable": sys.executable,
    }


def provenance() -> dict:
    return {
        "host": socket.gethostname(),
        **current_job_info(),
        "slurm_partition": os.environ.get("SLURM_JOB_PARTITION"),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "git": git_state(),
        "software": software(),
    }
