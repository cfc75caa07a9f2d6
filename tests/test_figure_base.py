"""The figure base every kind of cell draws through (flashwatt.figure_base): the file is
written whole or not at all, every kind's figures are specs of the base written by the same
two-line script, and what a figure says it shows is what it draws (titles naming energy
only where it was measured, reasons in words, missing bars marked). Figures are checked as
matplotlib objects, not pixels."""
import ast
import math
import runpy
from pathlib import Path
from types import SimpleNamespace

import matplotlib.pyplot as plt
import pandas as pd
import pytest
from matplotlib.artist import Artist
from matplotlib.text import Text
from snakemake.iocontainers import InputFiles, OutputFiles, Params

from flashwatt.attention.figures import FIGURES
from flashwatt.control.figures import CONTROL_FIGURES
from flashwatt.control.summary import runs_table, traces_table
from flashwatt.distributed.figures import DISTRIBUTED_FIGURES
from flashwatt.distributed.summary import distributed_table
from flashwatt.figure_base import (FORMATS, NOT_MEASURED, NOTHING_TO_DRAW, FigureSpec, measured_where, parquet_table,
                                   write_figure, write_rule_figures)
from flashwatt.models.cell import ModelCell
from flashwatt.models.figures import MODEL_FIGURES
from flashwatt.kinds import envelope_of
from flashwatt.models.governed_figures import GovernedTables
from flashwatt.models.summary import governed_traces, model_table
from flashwatt.kinds import kind_named
from flashwatt.placeholder import CPU_ENERGY_REASON
from flashwatt.plot_axes import MISSING_BAR
from flashwatt.records import atomic_write, write_record
from flashwatt.training.cell import TrainCell
from flashwatt.training.figures import TRAINING_FIGURES
from flashwatt.training.summary import run_table

from summaries import cpu_summary

REPO = Path(__file__).resolve().parents[1]
MAGIC = {"png": b"\x89PNG", "pdf": b"%PDF"}
# Each kind's figures and the rule inputs they are drawn from (the tables of its aggregate).
KINDS = {
    "attention": (FIGURES, {"summary"}),
    "control": (CONTROL_FIGURES, {"runs", "oracle", "traces"}),
    "distributed": (DISTRIBUTED_FIGURES, {"table"}),
    "model": (MODEL_FIGURES, {"table", "governed_traces"}),
    "train": (TRAINING_FIGURES, {"runs", "curves"}),
}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    plt.close("all")


def texts(fig) -> list[str]:
    return [t.get_text() for t in fig.findobj(Text) if t.get_text()]


def message(fig, headline: str = NOTHING_TO_DRAW) -> str:
    [text] = [t for t in texts(fig) if t.startswith(headline)]
    return text


# ---- the file: whole or not at all ----------------------------------------------------

@pytest.fixture
def table(tmp_path) -> Path:
    path = tmp_path / "table.parquet"
    pd.DataFrame({"suite": ["s"], "status": ["ok"], "device": ["x86_64"], "device_type": ["cpu"],
                  "value": [2.0]}).to_parquet(path)
    return path


def probe(draw, ext: str = "pdf") -> FigureSpec:
    return FigureSpec("probe", ext, "A probe", "What a probe shows.", draw, parquet_table("table"))


def bars(frame: pd.DataFrame) -> plt.Figure:
    fig, ax = plt.subplots()
    ax.bar([0], frame["value"])
    return fig


class Unrenderable(Artist):
    """An artist that draws for the layout (savefig's tight bounding box draws the figure
    once) and then fails as the figure is drawn into the file: a PDF is half written then."""

    def __init__(self):
        super().__init__()
        self.drawn = 0

    def draw(self, renderer):
        self.drawn += 1
        if self.drawn > 1:
            raise RuntimeError("drawing failed halfway through the file")


def fails_while_saving(frame: pd.DataFrame) -> plt.Figure:
    fig = bars(frame)
    fig.axes[0].add_artist(Unrenderable())
    return fig


def fails_to_draw(frame: pd.DataFrame) -> plt.Figure:
    raise ValueError("no such column")


def folder(path: Path) -> list[str]:
    return sorted(p.name for p in path.parent.iterdir())


@pytest.fixture(autouse=True)
def no_open_figures():
    """Figures other modules' tests left open on this worker are not this module's to judge."""
    plt.close("all")


@pytest.mark.parametrize("ext", FORMATS)
def test_a_figure_is_written_whole_in_its_format_titled_and_closed(tmp_path, table, ext):
    out = tmp_path / "figures" / f"probe.{ext}"
    write_figure(probe(bars, ext), {"table": table}, out)
    assert out.read_bytes()[:4] == MAGIC[ext]
    assert folder(out) == [out.name]  # no temporary file left beside it
    assert not plt.get_fignums()


@pytest.mark.parametrize("ext", FORMATS)
@pytest.mark.parametrize("draw", [fails_while_saving, fails_to_draw])
def test_a_failing_draw_leaves_the_previous_figure_and_no_partial_file(tmp_path, table, ext, draw):
    out = tmp_path / f"probe.{ext}"
    out.write_bytes(b"the previous figure")
    with pytest.raises((RuntimeError, ValueError)):
        write_figure(probe(draw, ext), {"table": table}, out)
    assert out.read_bytes() == b"the previous figure"
    assert folder(out) == sorted([out.name, table.name])
    assert not plt.get_fignums()  # the failed figure is closed too


def test_a_first_figure_that_fails_while_saving_leaves_no_file(tmp_path, table):
    out = tmp_path / "probe.pdf"
    with pytest.raises(RuntimeError, match="halfway"):
        write_figure(probe(fails_while_saving), {"table": table}, out)
    assert not out.exists() and folder(out) == [table.name]


def test_a_figure_is_not_written_under_another_formats_name(tmp_path, table):
    with pytest.raises(ValueError, match="is a PDF file"):
        write_figure(probe(bars, "pdf"), {"table": table}, tmp_path / "probe.png")
    with pytest.raises(ValueError, match="was not given table"):
        write_figure(probe(bars), {"summary": table}, tmp_path / "probe.pdf")


def test_the_title_is_the_figures_over_where_it_was_measured(table):
    fig = probe(bars).render(pd.read_parquet(table))
    assert fig.get_suptitle() == "A probe\nsuite s · CPU x86_64 · 1 of 1 cells ok"


def test_the_line_under_the_title_names_each_device_once():
    cells = pd.DataFrame({"suite": ["s", "s", "s"], "status": ["ok", "skipped", "ok"],
                          "device": ["cpu", None, "NVIDIA H200"], "device_type": ["cpu", None, "cuda"]})
    assert measured_where(cells) == "suite s · CPU, NVIDIA H200 · 2 of 3 cells ok"


# ---- every kind through the base ------------------------------------------------------

def test_no_two_figures_of_any_kind_share_a_name():
    names = [name for figures, _ in KINDS.values() for name in figures]
    assert len(names) == len(set(names))  # figures/<suite>/<name>.<ext> names one figure

@pytest.mark.parametrize("kind", list(KINDS))
def test_every_kinds_figures_are_specs_of_the_base_drawn_from_the_rules_inputs(kind):
    figures, inputs = KINDS[kind]
    assert kind_named(kind).figures is figures and set(kind_named(kind).figure_tables("s")) <= inputs
    assert figures
    for name, spec in figures.items():
        assert isinstance(spec, FigureSpec) and spec.name == name
        assert spec.caption and spec.ext in FORMATS
        assert set(spec.source.inputs) <= inputs, (name, spec.source.inputs)


def test_one_figure_script_draws_every_kinds_figures():
    tree = ast.parse((REPO / "scripts" / "figure.py").read_text())
    docstring, *imports, assignment, call = tree.body
    assert isinstance(docstring.value, ast.Constant)
    assert sorted(ast.unparse(i) for i in imports) == ["from flashwatt.figure_base import write_rule_figures",
                                                        "from flashwatt.kinds import kind_named"]
    assert ast.unparse(call) == "write_rule_figures(kind_named(snakemake.params.kind).figures, snakemake)"
    assert not [p.name for p in (REPO / "scripts").glob("*figure*.py") if p.name != "figure.py"]


def empty_tables(kind: str, root: Path) -> dict[str, pd.DataFrame]:
    """Each kind's tables as its aggregate writes them for a suite with no such cells."""
    if kind == "attention":
        return {"summary": cpu_summary(root)}
    if kind == "control":
        runs, oracle = runs_table([])
        return {"runs": runs, "oracle": oracle, "traces": traces_table([])}
    if kind == "train":
        runs, curves = run_table([])
        return {"runs": runs, "curves": curves}
    if kind == "model":
        return {"table": model_table([]), "governed_traces": governed_traces([])}
    return {"table": distributed_table([])}


@pytest.mark.parametrize("kind", list(KINDS))
def test_each_script_writes_its_figure_through_the_base(tmp_path, monkeypatch, kind):
    figures, _ = KINDS[kind]
    monkeypatch.chdir(tmp_path)
    inputs = {}
    for name, frame in empty_tables(kind, tmp_path).items():
        frame.to_parquet(tmp_path / f"{name}.parquet")
        inputs[name] = str(tmp_path / f"{name}.parquet")
    writes = []

    def recorded(path, write):
        writes.append(Path(path).name)
        atomic_write(path, write)

    monkeypatch.setattr("flashwatt.figure_base.atomic_write", recorded)
    outs = {spec.name: str(tmp_path / "figures" / f"{spec.name}.{spec.ext}") for spec in figures.values()}
    rule = SimpleNamespace(input=InputFiles(fromdict=inputs), output=OutputFiles(fromdict=outs),
                           params=Params(fromdict={"kind": kind, "options": {},
                                                   "captions": {s.name: s.caption for s in figures.values()}}))
    runpy.run_path(str(REPO / "scripts" / "figure.py"), init_globals={"snakemake": rule})  # every figure, one process
    for out in outs.values():
        assert Path(out).read_bytes()[:4] == MAGIC[Path(out).suffix[1:]]
    assert writes == [f"{s.name}.{s.ext}" for s in figures.values()]


def test_a_rule_whose_output_names_no_figure_is_refused(tmp_path):
    rule = SimpleNamespace(input=InputFiles(fromdict={}),
                           output=OutputFiles(fromdict={"nosuch": str(tmp_path / "nosuch.pdf")}), params=Params(fromdict={}))
    with pytest.raises(ValueError, match="no figure named 'nosuch'"):
        write_rule_figures(MODEL_FIGURES, rule)


# ---- training on a machine without a GPU ----------------------------------------------

def train_record(cell: TrainCell, device: dict, energy: bool) -> dict:
    curve = [{"step": s, "tokens": s * cell.tokens_per_step, "val_loss": 6.0 - s / cell.steps, "train_loss": None,
              "current_lr": cell.lr, "train_s": s * 0.1, "eval_s": 0.1, "checkpoint_s": 0.0, "wall_s": s * 0.1 + 0.1,
              "energy_j": (s * 40.0 + 1.0) if energy else None} for s in (0, cell.steps // 2, cell.steps)]
    reached = curve[-1]
    return {"kind": "train", "status": "ok", "reason": None, "device": device,
            "model": {"parameters": 1000, "vocab_size": 512}, "check": {"passed": True}, "curve": curve,
            "final": {"val_loss": reached["val_loss"], "perplexity": math.exp(reached["val_loss"])},
            "timing": {"tokens_trained": reached["tokens"], "tokens_per_s": 1000.0, "steady_tokens_per_s": 1100.0,
                       "train_s": 1.0, "eval_s": 0.3, "checkpoint_s": 0.0, "wall_s": reached["wall_s"]},
            "energy": {"energy_j": reached["energy_j"], "j_per_token": 0.01} if energy
            else {"energy_j": None, "reason": "no NVML"},
            "target": {"loss": 5.5, "reached": True, "tokens": reached["tokens"], "wall_s": reached["wall_s"],
                       "energy_j": reached["energy_j"]}}


def training_tables(root: Path, gpu: bool) -> tuple[pd.DataFrame, pd.DataFrame]:
    device = {"type": "cuda", "name": "NVIDIA H100 80GB HBM3"} if gpu else {"type": "cpu", "name": "x86_64"}
    paths = []
    for optimizer in ("adamw", "lion"):
        cell = TrainCell("t", "gpt2_tiny", "sdpa_math", "fp32", optimizer, "cosine", 1e-3, 0.0, 0.0, 2, 32, 2048, 0)
        write_record(root / cell.path, train_record(cell, device, energy=gpu))
        paths.append(root / cell.path)
    return run_table(paths)


def axes_labelled(fig, text: str) -> list:
    return [ax for ax in fig.axes if text in ax.get_xlabel()]


def test_training_figures_without_a_gpu_promise_no_energy_and_say_why(tmp_path):
    runs, curves = training_tables(tmp_path, gpu=False)
    for name, data, title in (("training_curves", curves, "Validation loss against tokens and time"),
                              ("training_to_target", runs, "Time to the target validation loss")):
        fig = TRAINING_FIGURES[name].render(data)
        assert fig.get_suptitle().splitlines()[0] == title
        assert "energy" not in fig.get_suptitle().lower()
        assert not axes_labelled(fig, "kilojoules")
        assert message(fig, NOT_MEASURED) == (f"{NOT_MEASURED}\nNone of the 2 ok training runs has an energy "
                                              f"measurement.\nReason recorded:\n{CPU_ENERGY_REASON} (2 cells)")
        assert "2 of 2 cells ok" in fig.get_suptitle()  # runs counted, not evaluations


def test_training_figures_on_a_gpu_draw_the_energy_their_title_names(tmp_path):
    runs, curves = training_tables(tmp_path, gpu=True)
    for name, data, title, label in (
            ("training_curves", curves, "Validation loss against tokens, time and energy", "kilojoules (NVML"),
            ("training_to_target", runs, "Time and energy to the target validation loss", "kilojoules to target")):
        fig = TRAINING_FIGURES[name].render(data)
        assert fig.get_suptitle().splitlines()[0] == title
        [ax] = axes_labelled(fig, label)
        assert ax.lines or ax.patches
        assert not [t for t in texts(fig) if t.startswith(NOT_MEASURED)]


def test_a_training_backends_missing_bar_says_why(tmp_path):
    runs, _ = training_tables(tmp_path, gpu=False)
    one = runs.iloc[[0]]
    # custom beside sdpa_math at context 32; at context 64 sdpa_math ran and custom was skipped
    table = pd.concat([runs, one.assign(backend="custom"), one.assign(context=64),
                       one.assign(context=64, backend="custom", status="skipped", reason="custom needs a CUDA device",
                                  steady_tokens_per_s=float("nan"))], ignore_index=True)
    fig = TRAINING_FIGURES["training_throughput"].render(table)
    [ax] = fig.axes
    [mark] = [t for t in ax.texts if t.get_gid() == MISSING_BAR]
    assert mark.get_text() == "skipped:\nneeds a CUDA device"
    labels = [t.get_text() for t in ax.get_yticklabels()]
    assert labels == ["gpt2_tiny fp32 B2 L32", "gpt2_tiny fp32 B2 L64"]
    assert mark.get_position()[1] == pytest.approx(1 - 0.2)  # custom's place (the first of two) at L64


# ---- model cells on a machine without a GPU -------------------------------------------

def cpu_model_table(root: Path) -> pd.DataFrame:
    """sdpa_default and eager timed on a CPU (no energy: no NVML), custom skipped there."""
    paths = []
    for backend, tokens_per_s in (("sdpa_default", 2000.0), ("eager", 1500.0), ("custom", None)):
        cell = ModelCell("t", "gpt2_tiny", backend, "fp32", "prefill", 64, 2)
        record = envelope_of(cell, {})
        if tokens_per_s is None:
            record.update(status="skipped", reason="custom needs a CUDA device (running on cpu)")
        else:
            record.update(status="ok", device={"type": "cpu", "name": "x86_64"},
                          timing={"step_ms": 64.0, "tokens_per_s": tokens_per_s}, energy={"reason": "no NVML"})
        write_record(root / cell.path, record)
        paths.append(root / cell.path)
    return model_table(paths)


def test_a_model_figure_with_no_energy_says_why_in_words(tmp_path):
    fig = MODEL_FIGURES["model_energy"].render(cpu_model_table(tmp_path))
    assert message(fig) == (f"{NOTHING_TO_DRAW}\nNone of the 2 ok model cells has an energy measurement.\n"
                            f"Reason recorded:\n{CPU_ENERGY_REASON} (2 cells)")


def test_no_model_figure_names_a_column_for_a_reason(tmp_path):
    table = cpu_model_table(tmp_path)
    for name, spec in MODEL_FIGURES.items():
        data = table if spec.source.inputs == ("table",) else GovernedTables(table, governed_traces([]))
        said = " ".join(texts(spec.render(data)))
        assert "j_per_token" not in said and "j per token" not in said, (name, said)
        assert "paired_speed" not in said and "peak_allocated" not in said, (name, said)


def gpu_model_table(root: Path) -> pd.DataFrame:
    """Three backends at L=1024 on an H100; at L=4096 eager ran out of memory and custom was
    not in the grid."""
    paths = []
    for seq_len, backend, outcome in ((1024, "sdpa_default", "ok"), (1024, "eager", "ok"), (1024, "custom", "ok"),
                                      (4096, "sdpa_default", "ok"), (4096, "eager", "oom")):
        cell = ModelCell("t", "llama_3_2_1b", backend, "bf16", "train", seq_len, 1)
        record = envelope_of(cell, {})
        record.update(status=outcome, device={"type": "cuda", "name": "NVIDIA H100 80GB HBM3"})
        if outcome == "ok":
            record.update(timing={"step_ms": 100.0, "tokens_per_s": 1e7 / seq_len}, energy={"j_per_token": 0.01})
        else:
            record["reason"] = "out of memory during forward: CUDA out of memory. Tried to allocate 4 GiB"
        write_record(root / cell.path, record)
        paths.append(root / cell.path)
    return model_table(paths)


def test_a_model_backends_missing_bar_is_marked_with_its_outcome(tmp_path):
    fig = MODEL_FIGURES["model_throughput"].render(gpu_model_table(tmp_path))
    [ax] = [ax for ax in fig.axes if ax.patches]
    said = {t.get_text(): t.get_position()[1] for t in ax.texts if t.get_gid() == MISSING_BAR}
    oom = "oom:\nout of memory during forward: CUDA out of memory. Tried…"  # the reason cut to fit
    assert sorted(said) == ["not in grid", oom]
    assert [t.get_text().split("\n")[0] for t in ax.get_yticklabels()] == ["llama_3_2_1b", "llama_3_2_1b"]
    # the second cell (L=4096): custom's place is the first of three, eager's the second
    assert said["not in grid"] == pytest.approx(1 - 0.8 / 3)
    assert said[oom] == pytest.approx(1.0)
