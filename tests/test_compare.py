"""`flashwatt compare` on synthetic suite folders (tests/compare_runs.py: attention records
as a job writes them, tabled by the suite's own aggregation): a planted regression is found
and named, pure noise is not; intervals come from the cells' repeats or from repeated runs;
cells on one side only are listed; every kind compares through the registry."""
from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from compare_runs import CELLS, H100, suite_run
from flashwatt.cli import main
from flashwatt.compare.intervals import Samples, change, ratio_interval, samples_of
from flashwatt.compare.regression import parse_rule
from flashwatt.config_error import ConfigError
from flashwatt.kind import resolve
from flashwatt.kinds import all_kinds

REGRESSED = CELLS[3]


def compare(capsys, *args, figures: bool = False) -> tuple[int, str, str]:
    """`flashwatt compare ARGS` (without figures unless asked: their tests are the page's)."""
    status = main(["compare", *map(str, args), *([] if figures else ["--no-figures"])])
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_a_planted_latency_regression_is_found_and_named(tmp_path, capsys):
    base = suite_run(tmp_path / "a", seed=1)
    other = suite_run(tmp_path / "b", seed=2, changes={REGRESSED: {"latency_factor": 1.12}})
    out = tmp_path / "out"
    status, _, err = compare(capsys, base, other, "-o", out, "--fail-if", "latency:+5%", "--labels", "main,branch")
    assert status == 1
    assert f"regression: attention {REGRESSED.id.partition('/')[2]} against branch" in err
    failed = pd.read_csv(out / "regressions.csv")
    assert list(failed["cell"]) == [REGRESSED.id.partition("/")[2]] and list(failed["rule"]) == ["latency:+5%"]
    table = pd.read_parquet(out / "comparison.parquet")
    row = table.set_index("cell").loc[REGRESSED.id.partition("/")[2]]
    assert row["latency_low"] > 1.05 and row["latency_change"] == "worse"
    assert row["latency_from"] == "repeats/repeats"  # one run a side: the cell's own timed steps
    assert row["tflops_change"] == "worse" and row["tflops_high"] < 1
    # the same cells, 12% slower, are not beyond a 15% threshold
    status, _, _ = compare(capsys, base, other, "-o", tmp_path / "out2", "--fail-if", "latency:+15%")
    assert status == 0


def test_pure_noise_is_not_a_regression(tmp_path, capsys):
    base = suite_run(tmp_path / "a", seed=1)
    other = suite_run(tmp_path / "b", seed=2)
    out = tmp_path / "out"
    status, stdout, _ = compare(capsys, base, other, "-o", out, "--fail-if", "latency:+5%", "tflops:-5%")
    assert status == 0 and "No cell got worse" in stdout
    table = pd.read_parquet(out / "comparison.parquet")
    assert len(table) == len(CELLS) and (table["presence"] == "both").all()
    assert table["latency_ratio"].between(0.97, 1.03).all()
    assert (table["latency_low"] < table["latency_ratio"]).all() and (table["latency_ratio"] < table["latency_high"]).all()
    assert pd.read_csv(out / "regressions.csv").empty


def test_repeated_runs_give_energy_its_interval(tmp_path, capsys):
    """Energy is one window per cell: its interval comes from repeated runs only."""
    single = suite_run(tmp_path / "single", seed=3)
    base = suite_run(tmp_path / "a", seed=1, runs=3)
    noise = suite_run(tmp_path / "b", seed=2, runs=3)
    worse = suite_run(tmp_path / "c", seed=4, runs=3, changes={REGRESSED: {"energy_factor": 1.06}})
    out = tmp_path / "out"
    status, _, err = compare(capsys, base, noise, worse, "-o", out, "--fail-if", "energy:+3%", "--labels", "a,b,c")
    assert status == 1
    table = pd.read_parquet(out / "comparison.parquet")
    assert set(table["energy_from"]) == {"runs/runs"} and table["energy_low"].notna().all()
    assert (table["runs_base"] == 3).all()
    failed = pd.read_csv(out / "regressions.csv")
    assert list(zip(failed["other"], failed["cell"])) == [("c", REGRESSED.id.partition("/")[2])]
    # one run a side: the energy ratio has no interval, and the page and table say so
    compare(capsys, single, suite_run(tmp_path / "d", seed=5), "-o", tmp_path / "out2")
    table = pd.read_parquet(tmp_path / "out2" / "comparison.parquet")
    assert set(table["energy_change"]) == {"no interval"} and table["energy_low"].isna().all()
    assert "no interval" in (tmp_path / "out2" / "report.html").read_text()


def test_a_change_within_its_noise_is_not_a_regression_however_large_its_ratio(tmp_path, capsys):
    """Energy 8% up on runs whose energy moves by 10%: above a 5% threshold, within the noise."""
    base = suite_run(tmp_path / "a", seed=1, runs=3, energy_noise=0.1)
    other = suite_run(tmp_path / "b", seed=2, runs=3, energy_noise=0.1, energy_factor=1.08)
    status, _, _ = compare(capsys, base, other, "-o", tmp_path / "out", "--fail-if", "energy:+5%")
    table = pd.read_parquet(tmp_path / "out" / "comparison.parquet")
    assert (table["energy_ratio"] > 1.05).sum() >= 3  # ratios beyond the threshold ...
    assert status == 0 and (table["energy_low"] < 1.05).all()  # ... whose intervals are not
    # the same change on runs that hold within 0.3% is found in every cell
    quiet = suite_run(tmp_path / "c", seed=3, runs=3, energy_factor=1.08)
    status, _, _ = compare(capsys, suite_run(tmp_path / "d", seed=4, runs=3), quiet, "-o", tmp_path / "out2",
                           "--fail-if", "energy:+5%")
    assert status == 1 and len(pd.read_csv(tmp_path / "out2" / "regressions.csv")) == len(CELLS)


def test_the_rule_reads_the_interval_end_and_the_ratio_only_without_one():
    from flashwatt.compare.regression import regressions

    rows = pd.DataFrame([
        {"other": "b", "kind": "attention", "cell": cell, "status_base": "ok", "status_other": "ok",
         "energy_base": 1.0, "energy_other": ratio, "energy_ratio": ratio, "energy_low": low, "energy_high": high,
         "energy_from": "runs/runs"}
        for cell, ratio, low, high in (("noisy", 1.10, 1.01, 1.20), ("clear", 1.10, 1.06, 1.14),
                                       ("single", 1.06, np.nan, np.nan), ("small", 1.04, np.nan, np.nan))])
    failed = regressions(rows, [parse_rule("energy:+5%")])
    assert list(failed["cell"]) == ["clear", "single"]
    assert "no interval" in failed.set_index("cell").loc["single", "why"]


def test_comma_joined_folders_are_repeated_runs_of_one_side(tmp_path, capsys):
    runs = [suite_run(tmp_path / f"r{i}", seed=i) for i in range(3)]
    other = suite_run(tmp_path / "o", seed=9)
    compare(capsys, ",".join(map(str, runs)), other, "-o", tmp_path / "out")
    table = pd.read_parquet(tmp_path / "out" / "comparison.parquet")
    assert (table["runs_base"] == 3).all() and set(table["latency_from"]) == {"runs/repeats"}


def test_cells_on_one_side_only_are_listed_not_dropped(tmp_path, capsys):
    extra = type(CELLS[0])("syn", "sdpa_cudnn", "bf16", 512, 16, 8, 64, False, "fwd")
    base = suite_run(tmp_path / "a", seed=1)
    other = suite_run(tmp_path / "b", seed=2, drop=[CELLS[0]], add=[extra],
                      changes={CELLS[1]: {"status": "error"}})
    out = tmp_path / "out"
    status, _, err = compare(capsys, base, other, "-o", out, "--fail-if", "latency:+50%")
    table = pd.read_parquet(out / "comparison.parquet").set_index("cell")
    label = lambda cell: cell.id.partition("/")[2]  # noqa: E731
    assert table.loc[label(CELLS[0]), "presence"] == "baseline only"
    assert table.loc[label(extra), "presence"] == "other only"
    assert len(table) == len(CELLS) + 1
    page = (out / "report.html").read_text()
    assert "Cells on one side only" in page and label(extra) in page and label(CELLS[0]) in page
    # a cell that stopped working is a regression whatever the metric rules
    assert status == 1 and f"{label(CELLS[1])} against" in err and "ok on the baseline, error" in err


def test_the_header_names_each_sides_device_commit_and_settings(tmp_path, capsys):
    base = suite_run(tmp_path / "a", seed=1, commit="1" * 40)
    other = suite_run(tmp_path / "b", seed=2, device="NVIDIA H200", commit="2" * 40)
    out = tmp_path / "out"
    compare(capsys, base, other, "-o", out, "--labels", "h100,h200", figures=True)
    page = (out / "report.html").read_text()
    assert H100 in page and "NVIDIA H200" in page and "1" * 12 in page and "2" * 12 in page
    assert "580.65" in page and "attention.warmup_ms" in page
    assert "flashwatt comparison: h200 against h100" in page
    figures = sorted(p.name for p in (out / "figures").iterdir())
    assert "1-attention-latency.png" in figures and "1-attention-kernels.png" in figures


def test_fail_if_rules_are_parsed_with_the_metrics_direction():
    assert str(parse_rule("latency:+5%")) == "latency:+5%"
    assert str(parse_rule("latency:5")) == "latency:+5%"  # no sign: the worse direction
    assert str(parse_rule("tflops:3%")) == "tflops:-3%"
    with pytest.raises(ConfigError, match="tflops is better higher.*tflops:-5%"):
        parse_rule("tflops:+5%")
    with pytest.raises(ConfigError, match="no kind compares a metric 'speed'"):
        parse_rule("speed:+5%")
    with pytest.raises(ConfigError, match="METRIC:\\+PCT%"):
        parse_rule("latency>5%")


def test_bad_sides_are_named(tmp_path, capsys):
    status, _, err = compare(capsys, tmp_path / "nowhere", tmp_path / "nowhere2")
    assert status == 2 and "nowhere: no such suite folder or table" in err
    (tmp_path / "empty").mkdir()
    status, _, err = compare(capsys, tmp_path / "empty", tmp_path / "empty")
    assert status == 2 and "a folder with none of the tables flashwatt compares" in err


def test_the_interval_covers_a_known_ratio_and_narrows_with_more_repeats():
    rng = np.random.default_rng(0)
    few = [ratio_interval(Samples(rng.lognormal(0, 0.05, 10), "repeats"),
                          Samples(1.1 * rng.lognormal(0, 0.05, 10), "repeats")) for _ in range(40)]
    many = ratio_interval(Samples(rng.lognormal(0, 0.05, 400), "repeats"),
                          Samples(1.1 * rng.lognormal(0, 0.05, 400), "repeats"))
    covered = sum(r.low <= 1.1 <= r.high for r in few)
    assert covered >= 34  # a 95% interval covers the true ratio about 38 times in 40
    assert (many.high - many.low) < np.median([r.high - r.low for r in few]) / 3
    assert ratio_interval(Samples(np.array([2.0]), "single"), Samples(np.array([3.0]), "single")).low is None
    one_sided = ratio_interval(Samples(np.array([2.0]), "single"), Samples(np.array([3.0, 3.3, 2.7]), "runs"))
    assert one_sided.low < 1.5 < one_sided.high and one_sided.source == "single/runs"
    assert change(ratio_interval(Samples(np.array([1.0, 1.01]), "runs"), Samples(np.array([2.0, 2.02]), "runs")),
                  "higher") == "better"


def test_samples_prefer_runs_then_the_cells_own_repeats():
    assert samples_of([1.0, 1.1], [5.0, 6.0]).source == "runs"
    assert samples_of([1.0], [0.9, 1.0, 1.1]).source == "repeats"
    assert samples_of([1.0], None).source == "single"
    assert samples_of([], [1.0, 2.0]) is None


def _empty_tables(kind, folder):
    outputs = {t.key: folder / t.name for t in kind.tables}
    resolve(kind.write_tables)([], outputs)
    return pd.read_parquet(outputs[kind.compared_table().key])


@pytest.mark.parametrize("kind", all_kinds(), ids=lambda k: k.name)
def test_every_kind_compares_columns_its_table_has(kind, tmp_path):
    """Each kind's metrics name columns of the table its aggregation writes."""
    table = _empty_tables(kind, tmp_path)
    assert kind.compare_metrics, f"kind {kind.name} declares no metric to compare"
    missing = [m.column for m in kind.compare_metrics if m.column not in table.columns]
    assert not missing, f"kind {kind.name}: metrics read {missing}, not in {kind.compared_table().name}"
    assert "cell_id" in table.columns


def test_a_kind_with_no_declarations_compares_by_its_cell(tmp_path, capsys, monkeypatch):
    """A kind from outside flashwatt (tests/kinds/toy_kind.py) declares nothing for the
    comparison: its cells are matched by their row less suite and id, statuses side by side."""
    from pathlib import Path

    kinds_dir = Path(__file__).parent / "kinds"
    monkeypatch.syspath_prepend(str(kinds_dir))
    monkeypatch.setenv("FLASHWATT_KINDS", "toy_kind")
    from flashwatt.kinds import kind_named
    from flashwatt.records import write_record

    toy = kind_named("toy")
    for side, sizes in (("a", [2, 5]), ("b", [5, 7])):
        paths = []
        for n in sizes:
            cell = toy.cell(f"suite{side}", n)
            path = tmp_path / side / cell.path
            write_record(path, {**toy.envelope(cell, {"n": n}), "status": "ok", "total": n})
            paths.append(str(path))
        resolve(toy.write_tables)(paths, {t.key: tmp_path / side / t.path(f"suite{side}") for t in toy.tables})
    status, _, _ = compare(capsys, tmp_path / "a/results/suitea", tmp_path / "b/results/suiteb", "-o", tmp_path / "out")
    assert status == 0
    table = pd.read_parquet(tmp_path / "out" / "comparison.parquet").set_index("cell")
    assert table.loc["toy/n5", "presence"] == "both" and table.loc["toy/n5", "status_other"] == "ok"
    assert table.loc["toy/n2", "presence"] == "baseline only" and table.loc["toy/n7", "presence"] == "other only"
    assert json.loads(table.loc["toy/n5", "measures"]) == {"n": 5}
