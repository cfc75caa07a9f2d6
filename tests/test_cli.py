import pytest

from flashwatt.cli import main
from flashwatt.command_line import config_pairs as _config_pairs, overrides as _overrides
from flashwatt.config import ConfigError


def test_config_pairs_are_read_from_a_snakemake_command_line():
    args = ["--cores", "2", "--config", "suite=seed", "filter=seq_len > 4", "-n", "--forcerun", "x.json"]
    assert _config_pairs(args) == ["suite=seed", "filter=seq_len > 4"]
    assert _overrides(["suite=seed", "measure={energy: false}"]) == {"suite": "seed", "measure": {"energy": False}}
    with pytest.raises(ConfigError, match="expected KEY=VALUE"):
        _overrides(["suite"])


def test_suite_and_bad_suite(capsys, monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    assert main(["suite"]) == 0 and capsys.readouterr().out.strip() == "smoke"
    assert main(["suite", "--config", "suite=seed"]) == 0 and capsys.readouterr().out.strip() == "seed"
    assert main(["suite", "--config", "suite=nope"]) == 2
    assert "unknown suite 'nope'" in capsys.readouterr().err


def test_failed_lists_only_cells_that_are_not_ok(tmp_path, monkeypatch, capsys):
    import shutil

    from flashwatt.attention.suite import suite_cells
    from flashwatt.config import load_config
    from flashwatt.records import write_record
    from flashwatt.kinds import envelope_of

    shutil.copytree("config", tmp_path / "config")
    monkeypatch.chdir(tmp_path)
    cells = suite_cells(load_config(overrides={"suite": "smoke"}), "smoke")
    for i, cell in enumerate(cells[:3]):
        record = envelope_of(cell, {})
        record["status"] = "ok" if i else "oom"
        write_record(cell.path, record)
    assert main(["failed", "--config", "suite=smoke"]) == 0
    assert capsys.readouterr().out.split() == [cells[0].path]
