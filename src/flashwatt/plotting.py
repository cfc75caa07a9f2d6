"""pyplot and seaborn, imported where a figure is first drawn rather than where figures are
declared.

Every process that plans or runs cells (Snakemake's parse of the workflow, each cell's job,
the tables, the CLI) imports each kind's figure registry for the figures' names and
captions; seaborn (which brings SciPy) and pyplot take about two seconds of CPU to import,
and only a figure job draws. `plt` and `sns` here are the modules themselves from their
first attribute read on.
"""
from __future__ import annotations

import importlib
from types import ModuleType


def _agg_backend() -> None:
    # Figures are written to files, on machines without a display: never a GUI backend
    # (set before pyplot is first imported, which seaborn also does).
    import matplotlib

    matplotlib.use("Agg")


class _OnFirstUse:
    """A module imported at the first read of one of its attributes."""

    def __init__(self, name: str):
        self._name = name
        self._loaded: ModuleType | None = None

    def __getattr__(self, attribute: str):
        if attribute.startswith("__"):  # copy, pickle and introspection ask for these first
            raise AttributeError(attribute)
        if self._loaded is None:
            _agg_backend()
            self._loaded = importlib.import_module(self._name)
        return getattr(self._loaded, attribute)

    def __repr__(self) -> str:
        return f"<{self._name}, imported on first use{'' if self._loaded is None else ': imported'}>"


plt = _OnFirstUse("matplotlib.pyplot")
sns = _OnFirstUse("seaborn")
