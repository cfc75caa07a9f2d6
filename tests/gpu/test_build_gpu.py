"""The real build on a GPU node: concurrent jobs with an empty cache build the extension
once (nvcc, torch's JIT), the others wait on the lock and load that build; loading a
finished build is fast; the record facts (key, arch, seconds) are consistent."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

pytestmark = [pytest.mark.gpu, pytest.mark.nvcc]
REPO = Path(__file__).resolve().parents[2]

JOB = textwrap.dedent(
    """
    import json
    from flashwatt.build import build_info, load_extension
    load_extension()
    print(json.dumps(build_info()))
    """
)


def _jobs(cache: Path, n: int) -> list[dict]:
    env = {**os.environ, "FLASHWATT_BUILD_CACHE": str(cache),
           "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    procs = [subprocess.Popen([sys.executable, "-c", JOB], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                              env=env) for _ in range(n)]
    infos = []
    for proc in procs:
        out, err = proc.communicate(timeout=900)
        assert proc.returncode == 0, err[-3000:]
        infos.append(json.loads(out.strip().splitlines()[-1]))
    return infos


def test_concurrent_cold_builds_compile_once(tmp_path):
    infos = _jobs(tmp_path, 3)
    built = [i for i in infos if i["built_now"]]
    assert len(built) == 1, infos
    assert len({i["build_dir"] for i in infos}) == 1 and len({i["build_key"] for i in infos}) == 1
    waiters = [i for i in infos if not i["built_now"]]
    assert all(i["lock_wait_seconds"] > 1.0 for i in waiters), infos  # they waited for the build
    marker = json.loads((Path(built[0]["build_dir"]) / "COMPLETE").read_text())
    assert marker["build_key"] == built[0]["build_key"] and marker["arch"] == built[0]["arch"]
    loads = ", ".join(f"{i['load_seconds']:.3f}" for i in waiters)
    print(f"cold build {built[0]['build_seconds']:.1f} s; waiters loaded in {loads} s")

    again = _jobs(tmp_path, 1)[0]  # a later job: no lock, no build, a quick load
    assert not again["built_now"] and again["lock_wait_seconds"] == 0.0 and again["load_seconds"] < 2.0, again
