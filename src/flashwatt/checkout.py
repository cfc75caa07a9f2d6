"""The flashwatt checkout: where the CUDA sources of kernels/ and the git history are.

The Python package is found by import; those two are not package data (kernels/ is the
repository's, beside the Snakefile), so they are looked up, in this order:

1. FLASHWATT_KERNEL_DIR, for the kernel sources only: an explicit choice wins.
2. The checkout this package was imported from (`pip install -e .` or PYTHONPATH=src):
   its kernels/ matches the Python code that calls them.
3. The working directory: an installed flashwatt run from the repository root, where
   Snakemake runs every workflow job (kernels/ for the build; the git state when the
   directory has the Snakefile).

Anything else is an error that says what to set, never a guess.
"""
from __future__ import annotations

import os
from pathlib import Path

import flashwatt

KERNEL_DIR_VARIABLE = "FLASHWATT_KERNEL_DIR"
# The file that marks a folder as the kernel sources (the build's entry point).
KERNEL_ENTRY = "flash_fwd.cu"


class KernelSourcesNotFound(FileNotFoundError):
    """kernels/ could not be found; the message says what to set."""


def package_checkout() -> Path | None:
    """The checkout whose src/ holds the imported flashwatt, or None for an installed copy."""
    package = Path(flashwatt.__file__).resolve().parent
    root = package.parent.parent
    if package.parent.name == "src" and (root / "pyproject.toml").is_file():
        return root
    return None


def working_checkout() -> Path | None:
    """The working directory when it is a flashwatt checkout (it has the Snakefile)."""
    cwd = Path.cwd()
    return cwd if (cwd / "Snakefile").is_file() else None


def checkout() -> Path | None:
    """The checkout of the code that runs: the package's own, else the working directory's."""
    return package_checkout() or working_checkout()


def kernel_dir() -> Path:
    """The folder of the CUDA kernel sources (module docstring for the order)."""
    explicit = os.environ.get(KERNEL_DIR_VARIABLE)
    if explicit:
        folder = Path(explicit).expanduser().resolve()
        if not (folder / KERNEL_ENTRY).is_file():
            raise KernelSourcesNotFound(f"{KERNEL_DIR_VARIABLE}={explicit}: no {KERNEL_ENTRY} there; "
                                        f"point it at the kernels/ folder of a flashwatt checkout")
        return folder
    looked = []
    for root in (package_checkout(), Path.cwd()):
        if root is None:
            continue
        folder = root / "kernels"
        if (folder / KERNEL_ENTRY).is_file():
            return folder
        looked.append(str(folder))
    raise KernelSourcesNotFound(
        f"the CUDA kernel sources ({KERNEL_ENTRY}) were not found (looked in {', '.join(looked)}): "
        f"set {KERNEL_DIR_VARIABLE} to the kernels/ folder of a flashwatt checkout, "
        f"or run from the checkout (where the Snakefile is)")
