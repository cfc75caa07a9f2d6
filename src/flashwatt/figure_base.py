"""What every figure of every kind of cell has in common: how it is declared, titled and written.

A kind's figures module (attention, control, distributed, models, training) holds only its
own draw functions and its registry of `FigureSpec`s; everything else lives here:

- `FigureSpec`: a figure's name, file format, title, caption, draw function and the
  `Source` it is drawn from (the workflow rule's named inputs and how they are read);
- the title convention: the figure's title (which names only what is drawn) over the line
  saying where it was measured (`measured_where`);
- the file: `write_figure` renders and writes through `flashwatt.records.atomic_write`, so a
  draw that fails leaves neither half a PDF/PNG nor a clobbered previous figure;
- the pages and panels that say why something is not drawn (`nothing_to_draw`,
  `not_measured_panel`), whose words come from `flashwatt.placeholder`.

Axis helpers shared by the kinds (plain log ticks, sequence-length axes, facets without
data left out, missing bars marked) are in `flashwatt.plot_axes`.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable, Mapping

import pandas as pd

from flashwatt.plotting import plt, sns
from flashwatt.records import atomic_write

FORMATS = ("png", "pdf")
DPI = 130  # raster figures (PNG); a PDF's vector parts do not depend on it


def _itself(data: Any) -> pd.DataFrame:
    return data


@dataclass(frozen=True)
class Source:
    """The tables a figure is drawn from: the rule's named inputs (`inputs`), read into the
    object the draw function takes by `read(*paths)`; `cells(data)` gives one row per cell
    (status, suite, device), which the line under the title counts."""
    inputs: tuple[str, ...]
    read: Callable[..., Any]
    cells: Callable[[Any], pd.DataFrame] = _itself

    def load(self, paths: Mapping[str, str | Path]) -> Any:
        missing = [name for name in self.inputs if name not in paths]
        if missing:
            raise ValueError(f"a figure drawn from {', '.join(self.inputs)} was not given "
                             f"{', '.join(missing)} (inputs given: {', '.join(paths) or 'none'})")
        return self.read(*(paths[name] for name in self.inputs))


def parquet_table(name: str) -> Source:
    """A figure drawn from one Parquet table, the rule's input `name`."""
    return Source((name,), pd.read_parquet)


@dataclass(frozen=True)
class FigureSpec:
    """One figure: `draw(data, **options)` returns the matplotlib figure for the data its
    `source` reads, without a title; `title` is a string, or a function of the data where
    the title names a part (energy, say) that is drawn only when it was measured. `options`
    names the run-time options the draw function takes (the attention power trace's
    `trace_filter`); the rest of the options given to `render` are not its own."""
    name: str
    ext: str
    title: str | Callable[[Any], str]
    caption: str
    draw: Callable[..., plt.Figure]
    source: Source
    options: tuple[str, ...] = ()

    def __post_init__(self):
        if self.ext not in FORMATS:
            raise ValueError(f"figure {self.name}: format {self.ext!r} is none of {', '.join(FORMATS)}")

    def title_for(self, data: Any) -> str:
        return self.title(data) if callable(self.title) else self.title

    def render(self, data: Any, options: Mapping[str, Any] | None = None) -> plt.Figure:
        """The figure for `data`, titled with what it shows and where it was measured."""
        sns.set_theme(style="whitegrid", context="paper")
        own = {key: value for key, value in (options or {}).items() if key in self.options}
        fig = self.draw(data, **own)
        # Above the axes (and their facet titles); savefig's tight bounding box takes it in.
        fig.suptitle(f"{self.title_for(data)}\n{measured_where(self.source.cells(data))}", y=1.0, va="bottom",
                     fontsize=11)
        return fig


def registry(*specs: FigureSpec) -> dict[str, FigureSpec]:
    """A kind's figures by name (the workflow's figure wildcard and file name)."""
    figures: dict[str, FigureSpec] = {}
    for spec in specs:
        if spec.name in figures:
            raise ValueError(f"two figures are named {spec.name}")
        figures[spec.name] = spec
    return figures


def write_figure(spec: FigureSpec, inputs: Mapping[str, str | Path], out: str | Path,
                 options: Mapping[str, Any] | None = None) -> None:
    """Draw `spec` from the tables at `inputs` (by the names its source reads) into `out`,
    atomically: the file appears whole or not at all, and a failing draw or save leaves a
    previous figure at `out` as it was."""
    out = Path(out)
    if out.suffix != f".{spec.ext}":
        raise ValueError(f"figure {spec.name} is a {spec.ext.upper()} file; cannot write it to {out}")
    fig = spec.render(spec.source.load(inputs), options)
    try:
        atomic_write(out, lambda tmp: fig.savefig(tmp, format=spec.ext, dpi=DPI, bbox_inches="tight"))
    finally:
        plt.close(fig)


def write_rule_figures(figures: Mapping[str, FigureSpec], rule) -> None:
    """A workflow rule's figures: each named output (figures/<suite>/<name>.<ext>, named by
    the figure) drawn from the rule's named inputs with its `options` parameter, where it has
    one, in one process. `rule` is the `snakemake` object of a `script:` directive."""
    inputs = {name: rule.input[name] for name in rule.input.keys()}
    for name in rule.output.keys():
        out = Path(rule.output[name])
        if name not in figures or out.stem != name:
            raise ValueError(f"{out}: no figure named {name!r} (figures: {', '.join(figures)})")
        write_figure(figures[name], inputs, out, rule.params.get("options"))


def device_labels(cells: pd.DataFrame) -> pd.Series:
    """Each cell's device as a reader names it ('CPU x86_64', 'NVIDIA H100 80GB HBM3');
    missing where the cell recorded none (a job that died before it started)."""
    device = cells["device"] if "device" in cells else pd.Series(pd.NA, index=cells.index, dtype="string")
    kind = cells["device_type"] if "device_type" in cells else pd.Series(pd.NA, index=cells.index, dtype="string")
    on_cpu = kind.astype("string").eq("cpu").fillna(False).astype(bool)
    named = device.astype("string")
    # a CPU is named by its architecture where the record gives one ('cpu' alone says no more)
    cpu = ("CPU " + named).where(named.str.lower() != "cpu", "CPU")
    return named.where(~on_cpu, cpu)


def measured_where(cells: pd.DataFrame) -> str:
    """'suite smoke · CPU x86_64 · 8 of 8 cells ok': the line under every figure's title."""
    if cells.empty:
        return "no cells in the summary"
    suites = ", ".join(sorted(cells["suite"].dropna().unique())) or "unknown suite"
    devices = sorted(device_labels(cells).dropna().unique())
    ok = int((cells["status"] == "ok").sum())
    parts = [f"suite {suites}", *([", ".join(devices)] if devices else []), f"{ok} of {len(cells)} cells ok"]
    return " · ".join(parts)


def spoken_list(parts: list[str]) -> str:
    """'tokens, time and energy': parts as a sentence lists them."""
    return parts[0] if len(parts) == 1 else ", ".join(parts[:-1]) + " and " + parts[-1]


NOTHING_TO_DRAW = "Nothing to draw."
NOT_MEASURED = "Not measured."


def nothing_to_draw(message: str) -> plt.Figure:
    """The canvas of a figure with nothing to draw: the words say why."""
    fig, ax = plt.subplots(figsize=(7, 3))
    ax.text(0.5, 0.5, f"{NOTHING_TO_DRAW}\n{message}", ha="center", va="center", wrap=True)
    ax.set_axis_off()
    return fig


def not_measured_panel(ax, title: str, message: str) -> None:
    """A panel in place of one whose quantity was not measured: its title, and why."""
    ax.text(0.5, 0.5, f"{NOT_MEASURED}\n{message}", ha="center", va="center", wrap=True, fontsize=8,
            transform=ax.transAxes)
    ax.set_xticks([])
    ax.set_yticks([])
    ax.set_title(title)
