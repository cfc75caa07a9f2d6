"""Where the files outside the Python package are found (flashwatt.checkout), in this
checkout and in a copy of flashwatt installed without -e, the way `pip install .` does."""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from support import REPO

from flashwatt.checkout import KERNEL_DIR_VARIABLE, KernelSourcesNotFound, kernel_dir, package_checkout

# ---- this checkout (PYTHONPATH=src or pip install -e) ----------------------------------------


def test_the_package_knows_its_checkout_and_kernels(monkeypatch, tmp_path):
    monkeypatch.delenv(KERNEL_DIR_VARIABLE, raising=False)
    monkeypatch.chdir(tmp_path)  # not the working directory: the package's own checkout
    assert package_checkout() == REPO
    assert kernel_dir() == REPO / "kernels"


def test_an_explicit_kernel_dir_wins_and_a_wrong_one_is_named(monkeypatch, tmp_path):
    sources = tmp_path / "my-kernels"
    sources.mkdir()
    (sources / "flash_fwd.cu").write_text("// stand-in\n")
    monkeypatch.setenv(KERNEL_DIR_VARIABLE, str(sources))
    assert kernel_dir() == sources
    monkeypatch.setenv(KERNEL_DIR_VARIABLE, str(tmp_path))
    with pytest.raises(KernelSourcesNotFound, match=f"{KERNEL_DIR_VARIABLE}=.*no flash_fwd.cu"):
        kernel_dir()


# ---- an installed copy ----------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    """flashwatt installed, not editable, into a folder of its own (no dependencies: the
    test's own environment provides them)."""
    source = tmp_path_factory.mktemp("source")
    shutil.copy2(REPO / "pyproject.toml", source)
    shutil.copy2(REPO / "README.md", source)
    shutil.copytree(REPO / "src", source / "src", ignore=shutil.ignore_patterns("__pycache__", "*.egg-info"))
    target = tmp_path_factory.mktemp("site")
    subprocess.run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-build-isolation",
                    "--target", str(target), str(source)], check=True, capture_output=True, text=True)
    return target


# Run in a subprocess that imports the installed copy; prints one JSON line.
PROBE = textwrap.dedent(
    """
    import json, flashwatt
    from flashwatt.checkout import kernel_dir
    from flashwatt.config import load_config
    from flashwatt.provenance import git_state
    out = {"package": flashwatt.__file__}
    out["suites"] = sorted(load_config(CONFIG)["suites"])
    try:
        out["kernel_dir"] = str(kernel_dir())
    except FileNotFoundError as err:
        out["kernel_error"] = str(err)
    out["git"] = git_state()
    print(json.dumps(out))
    """
)


def probe(site: Path, cwd: Path, **env: str) -> dict:
    environment = {k: v for k, v in os.environ.items() if k != KERNEL_DIR_VARIABLE}
    environment.update(PYTHONPATH=str(site), **env)
    code = f"CONFIG = {str(REPO / 'config' / 'config.yaml')!r}\n{PROBE}"
    done = subprocess.run([sys.executable, "-c", code], cwd=cwd, env=environment, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    out = json.loads(done.stdout.splitlines()[-1])
    assert Path(out["package"]).is_relative_to(site), f"imported {out['package']}, not the installed copy"
    return out


def test_installed_copy_validates_configs_with_its_packaged_schema(site, tmp_path):
    assert (site / "flashwatt" / "config.schema.yaml").is_file()
    assert probe(site, tmp_path)["suites"] == ["control", "control_heldout", "control_step",
                                               "control_step_gpus", "distributed", "distributed_nodes", "models", "models_smoke",
                                               "seed", "smoke", "sweep", "training", "training_backends",
                                               "training_full", "training_smoke"]


def test_installed_copy_outside_a_checkout_says_what_to_set(site, tmp_path):
    out = probe(site, tmp_path)
    assert "kernel_dir" not in out
    assert KERNEL_DIR_VARIABLE in out["kernel_error"] and str(tmp_path / "kernels") in out["kernel_error"]
    assert out["git"]["commit"] is None and "not in a checkout" in out["git"]["reason"]


def test_installed_copy_run_from_the_checkout_uses_its_kernels_and_commit(site):
    out = probe(site, REPO)
    assert out["kernel_dir"] == str(REPO / "kernels")
    head = subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, text=True).stdout.strip()
    assert out["git"]["commit"] == head and out["git"]["checkout"] == str(REPO)


def test_installed_copy_takes_the_kernel_dir_it_is_given(site, tmp_path):
    assert probe(site, tmp_path, **{KERNEL_DIR_VARIABLE: str(REPO / "kernels")})["kernel_dir"] == str(REPO / "kernels")
