"""The build cache's once-per-node logic (flashwatt.build.build_once) across real processes
and a real file lock, with a stand-in compile step: concurrent builders build once, a
killed builder's lock and leftovers do not block the next one, a failed build names its log.
The same logic with nvcc and the real extension runs in tests/gpu/test_build_gpu.py."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from support import wait_until

from flashwatt.build import BuildError, build_once

# A builder process: build_once with a compile step that takes `seconds` and leaves a trace.
BUILDER = textwrap.dedent(
    """
    import json, os, sys, time
    from pathlib import Path
    from flashwatt.build import build_once

    root, seconds = Path(sys.argv[1]), float(sys.argv[2])

    def compile_into(tmp):
        (tmp / "build.log").write_text("compiling\\n")
        with open(root / "compiles.log", "a") as f:
            f.write(f"{os.getpid()}\\n")
        time.sleep(seconds)
        (tmp / "kernels.so").write_text("built by %d" % os.getpid())
        return "module"

    built, built_now, build_s, wait_s = build_once(root, "key", compile_into, {"arch": "sm_test"}, "test kernels")
    print(json.dumps({"built": built, "built_now": built_now, "build_s": build_s, "wait_s": wait_s}), flush=True)
    """
)


def _builder(root: Path, seconds: float) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).resolve().parents[1] / "src"),
                                                       os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-c", BUILDER, str(root), str(seconds)], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, env=env)


def test_concurrent_builders_build_once_and_the_rest_wait_and_load(tmp_path):
    procs = [_builder(tmp_path, 2.0) for _ in range(4)]
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert proc.returncode == 0, err
        results.append(json.loads(out.splitlines()[-1]))
    assert len((tmp_path / "compiles.log").read_text().split()) == 1, "more than one process compiled"
    builders = [r for r in results if r["built_now"]]
    assert len(builders) == 1 and builders[0]["built"] == "module" and builders[0]["build_s"] >= 2.0
    waiters = [r for r in results if not r["built_now"]]
    assert all(r["built"] is None and r["build_s"] == 0.0 for r in waiters)
    assert any(r["wait_s"] > 0.5 for r in waiters), "no process waited on the lock: the test raced past it"
    marker = json.loads((tmp_path / "key" / "COMPLETE").read_text())
    assert marker["build_key"] == "key" and marker["arch"] == "sm_test" and marker["build_seconds"] >= 2.0
    assert (tmp_path / "key" / "kernels.so").exists()
    assert not list(tmp_path.glob("key.tmp-*"))


def test_a_killed_build_leaves_no_held_lock_and_its_leftovers_are_removed(tmp_path):
    victim = _builder(tmp_path, 120.0)
    wait_until(lambda: list(tmp_path.glob("key.tmp-*")) and (tmp_path / "compiles.log").exists(), 30,
               "the victim to start compiling")
    os.kill(victim.pid, signal.SIGKILL)  # OOM killer, scancel -s KILL: no cleanup runs
    victim.wait(timeout=10)
    assert (tmp_path / "key.lock").exists() and not (tmp_path / "key").exists()

    def compile_into(tmp: Path) -> str:
        (tmp / "kernels.so").write_text("ok")
        return "module"

    started = time.monotonic()
    built, built_now, _, wait_s = build_once(tmp_path, "key", compile_into, {}, "test kernels")
    assert built == "module" and built_now and wait_s < 5 and time.monotonic() - started < 10
    assert not list(tmp_path.glob("key.tmp-*")), "the killed build's directory was left behind"
    assert (tmp_path / "key" / "COMPLETE").exists()


def test_a_failed_build_names_its_full_log_and_leaves_no_build(tmp_path):
    def compile_into(tmp: Path):
        (tmp / "build.log").write_text("flash_fwd.cu(12): error: identifier \"x\" is undefined\n")
        raise RuntimeError("Error building extension")

    with pytest.raises(BuildError) as info:
        build_once(tmp_path, "key", compile_into, {}, "test kernels")
    log = tmp_path / "key.failed" / "build.log"
    assert str(log) in str(info.value) and "test kernels" in str(info.value)
    assert "identifier" in log.read_text()
    assert not (tmp_path / "key").exists()


def test_a_build_directory_without_its_marker_is_rebuilt(tmp_path):
    (tmp_path / "key").mkdir()
    (tmp_path / "key" / "kernels.so").write_text("half written")
    calls = []

    def compile_into(tmp: Path) -> str:
        calls.append(tmp)
        (tmp / "kernels.so").write_text("complete")
        return "module"

    assert build_once(tmp_path, "key", compile_into, {}, "test kernels")[1] is True
    assert (tmp_path / "key" / "kernels.so").read_text() == "complete" and len(calls) == 1
    assert build_once(tmp_path, "key", compile_into, {}, "test kernels")[:2] == (None, False)
    assert len(calls) == 1
