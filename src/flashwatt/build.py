"""Builds and loads the custom CUDA kernels: the only module that knows about nvcc.

`load_extension()` compiles kernels/ (where flashwatt.checkout.kernel_dir finds it) for
exactly the compute capability of the current GPU, once per (sources, capability, torch
version, CUDA version): the build directory is keyed by a sha256 of those, under a
cache root (env FLASHWATT_BUILD_CACHE, default `results/build` under the current working
directory, which is the repository root when the workflow runs). Concurrent jobs on one
node build once: the first takes a file lock and builds, the others wait on the lock and
then load the finished build.

Robustness:
- The lock is a `filelock.FileLock`, an OS-level lock (fcntl/flock on POSIX): the
  kernel releases it when the holding process dies, so a build killed half-way leaves a
  lock file on disk but no lock held, and the next job simply acquires it.
- A build is made in a private temporary directory next to the final one, and only a
  complete build (with its COMPLETE marker written) is renamed into place with
  `os.replace`, which is atomic on one filesystem. A half-written directory is never
  mistaken for a finished one; leftovers of killed builds are removed by the next
  builder, under the lock.
- A compile error raises `BuildError`, naming the log file that holds the compiler's
  full output.
"""
from __future__ import annotations

import hashlib
import importlib.machinery
import importlib.util
import json
import os
import shutil
import sys
import time
import uuid
from pathlib import Path
from typing import Any, Callable

from flashwatt.checkout import KernelSourcesNotFound, kernel_dir

SOURCES = ("flash_fwd.cu", "flash_bwd.cu", "flash_fp8.cu", "flash_binding.cpp")
_SOURCE_SUFFIXES = (".cu", ".cuh", ".cpp", ".h", ".hpp")
_MARKER = "COMPLETE"
_LOG = "build.log"
_LOCK_TIMEOUT_S = 3600.0

_MODULE = None
_INFO: dict | None = None


class BuildError(RuntimeError):
    """The CUDA extension failed to compile or load; the message names the full build log."""


def cache_root() -> Path:
    return Path(os.environ.get("FLASHWATT_BUILD_CACHE", "results/build")).resolve()


def _arch(capability: tuple[int, int]) -> tuple[str, list[str]]:
    major, minor = capability
    if (major, minor) == (9, 0):
        # Hopper: the wgmma kernels need the architecture-specific target, and the macro
        # puts them in the launch table (kernels/flash_fwd.cu).
        return "sm_90a", ["-gencode=arch=compute_90a,code=sm_90a", "-DFLASHWATT_WGMMA"]
    name = f"sm_{major}{minor}"
    return name, [f"-gencode=arch=compute_{major}{minor},code=sm_{major}{minor}"]


def _cuda_flags(arch_flags: list[str]) -> list[str]:
    # No --use_fast_math: the fp32 path must stay exact to 1e-5.
    return ["-O3", "-lineinfo", "--ptxas-options=-v", *arch_flags]


def _source_files() -> list[Path]:
    return sorted(p for p in kernel_dir().iterdir() if p.is_file() and p.suffix in _SOURCE_SUFFIXES)


def build_key(capability: tuple[int, int]) -> str:
    import torch

    h = hashlib.sha256()
    for path in _source_files():
        h.update(path.name.encode())
        h.update(b"\0")
        h.update(path.read_bytes())
        h.update(b"\0")
    arch, flags = _arch(capability)
    for part in (arch, torch.__version__, str(torch.version.cuda), sys.version.split()[0], " ".join(_cuda_flags(flags))):
        h.update(part.encode())
        h.update(b"\0")
    return h.hexdigest()[:20]


def _import_from(build_dir: Path, name: str):
    so = next((p for p in build_dir.iterdir() if p.name.startswith(name) and p.suffix in (".so", ".pyd")), None)
    if so is None:
        raise BuildError(f"finished build in {build_dir} has no {name}.so (see {build_dir / _LOG})")
    loader = importlib.machinery.ExtensionFileLoader(name, str(so))
    spec = importlib.util.spec_from_file_location(name, str(so), loader=loader)
    module = importlib.util.module_from_spec(spec)
    loader.exec_module(module)
    return module


def _compile(tmp: Path, name: str, arch_flags: list[str]):
    """Runs torch's JIT build in `tmp`, all compiler output going to tmp/build.log."""
    from torch.utils import cpp_extension

    log_path = tmp / _LOG
    sources_dir = kernel_dir()
    sources = [str(sources_dir / s) for s in SOURCES]
    sys.stdout.flush()
    sys.stderr.flush()
    saved_out, saved_err = os.dup(1), os.dup(2)
    try:
        with open(log_path, "w") as log:
            os.dup2(log.fileno(), 1)
            os.dup2(log.fileno(), 2)
            try:
                return cpp_extension.load(
                    name=name,
                    sources=sources,
                    extra_cflags=["-O3"],
                    extra_cuda_cflags=_cuda_flags(arch_flags),
                    extra_include_paths=[str(sources_dir)],
                    build_directory=str(tmp),
                    verbose=True,
                )
            finally:
                sys.stdout.flush()
                sys.stderr.flush()
    finally:
        os.dup2(saved_out, 1)
        os.dup2(saved_err, 2)
        os.close(saved_out)
        os.close(saved_err)


def build_once(root: Path, key: str, compile_into: Callable[[Path], Any], describe: dict, what: str):
    """Builds `root/key` once across every process that asks for it (module docstring).

    `compile_into(tmp)` builds into the private directory `tmp`, writing its log to
    tmp/build.log, and returns what it built. Returns (what it built or None when another
    process had built it, built_now, build seconds, seconds waited for the lock).
    """
    from filelock import FileLock, Timeout

    final = root / key
    if (final / _MARKER).exists():
        return None, False, 0.0, 0.0
    t0 = time.perf_counter()
    lock = FileLock(str(root / f"{key}.lock"))
    try:
        lock.acquire(timeout=_LOCK_TIMEOUT_S)
    except Timeout as err:
        raise BuildError(f"waited {_LOCK_TIMEOUT_S:.0f} s for the build lock {root / f'{key}.lock'}") from err
    lock_wait_s = time.perf_counter() - t0
    try:
        if (final / _MARKER).exists():  # built by the process that held the lock before us
            return None, False, 0.0, lock_wait_s
        # Leftovers of builds that were killed: nobody else builds while we hold the lock.
        for stale in root.glob(f"{key}.tmp-*"):
            shutil.rmtree(stale, ignore_errors=True)
        if final.exists():
            shutil.rmtree(final)
        tmp = root / f"{key}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        tmp.mkdir()
        t1 = time.perf_counter()
        try:
            built = compile_into(tmp)
        except Exception as err:
            failed = root / f"{key}.failed"
            shutil.rmtree(failed, ignore_errors=True)
            os.replace(tmp, failed)
            raise BuildError(
                f"building {what} failed ({type(err).__name__}); full compiler output: {failed / _LOG}"
            ) from None
        build_s = time.perf_counter() - t1
        marker = {
            "build_key": key,
            **describe,
            "build_seconds": build_s,
            "sources": [p.name for p in _source_files()],
            "built_at": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        (tmp / _MARKER).write_text(json.dumps(marker, indent=2))
        os.replace(tmp, final)
        return built, True, build_s, lock_wait_s
    finally:
        lock.release()


def load_extension():
    """The compiled kernel module for the current GPU, built at first use on a node."""
    global _MODULE, _INFO
    if _MODULE is not None:
        return _MODULE
    import torch

    if not torch.cuda.is_available():
        raise BuildError("the custom kernels need a CUDA device; torch.cuda.is_available() is False")
    capability = torch.cuda.get_device_capability()
    if capability < (8, 0):
        raise BuildError(f"the custom kernels need compute capability 8.0 or newer (device has {capability})")
    arch, arch_flags = _arch(capability)
    try:
        key = build_key(capability)
    except KernelSourcesNotFound as err:
        raise BuildError(str(err)) from None
    name = f"flashwatt_flash_{key}"
    root = cache_root()
    root.mkdir(parents=True, exist_ok=True)
    final = root / key
    module, built_now, build_s, lock_wait_s = build_once(
        root,
        key,
        lambda tmp: _compile(tmp, name, arch_flags),
        describe={"arch": arch, "torch": torch.__version__, "cuda": torch.version.cuda},
        what=f"the custom CUDA kernels for {arch}",
    )
    if module is not None:
        _MODULE = module

    t2 = time.perf_counter()
    if _MODULE is None:
        try:
            _MODULE = _import_from(final, name)
        except BuildError:
            raise
        except Exception as err:
            raise BuildError(f"loading the built kernels from {final} failed: {err} (build log: {final / _LOG})") from err
    load_s = time.perf_counter() - t2
    _INFO = {
        "build_key": key,
        "build_dir": str(final),
        "built_now": built_now,
        "build_seconds": round(build_s, 3),
        "load_seconds": round(load_s, 4),
        "lock_wait_seconds": round(lock_wait_s, 3),
        "arch": arch,
        "kernel_dir": str(kernel_dir()),
    }
    return _MODULE


def build_info() -> dict:
    """Facts of the loaded build for the cell record (loads the extension if needed)."""
    if _INFO is None:
        load_extension()
    assert _INFO is not None
    return dict(_INFO)
