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


@pytest.fixture
def checkout(tmp_path, monkeypatch):
    """A copy of the workflow as the working directory, no GPU visible (a login node)."""
    from support import copy_workflow

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    monkeypatch.delenv("SNAKEMAKE_PROFILE", raising=False)
    monkeypatch.chdir(copy_workflow(tmp_path))
    return tmp_path


def test_every_subcommand_reads_the_slurm_profile_as_snakemake_does(checkout, capsys, monkeypatch):
    """Under the Slurm profile `auto` is the GPU suite, even on a login node without a GPU."""
    from flashwatt.attention.suite import suite_cells
    from flashwatt.config import load_config
    from flashwatt.kinds import envelope_of
    from flashwatt.records import write_record

    assert main(["suite"]) == 0 and capsys.readouterr().out.split() == ["smoke"]
    assert main(["suite", "--profile", "slurm"]) == 0 and capsys.readouterr().out.split() == ["seed"]
    monkeypatch.setenv("SNAKEMAKE_PROFILE", "slurm")  # how a cluster's shell often names it
    assert main(["suite"]) == 0 and capsys.readouterr().out.split() == ["seed"]
    monkeypatch.delenv("SNAKEMAKE_PROFILE")
    # --configfile on the command line replaces the profile's list, as in Snakemake: executor local again
    assert main(["suite", "--profile", "slurm", "--configfile", "config/config.yaml"]) == 0
    assert capsys.readouterr().out.split() == ["smoke"]
    seed = suite_cells(load_config(overrides={"suite": "seed"}), "seed")
    for cell, status in ((seed[0], "job_failed"), (seed[1], "ok")):
        record = envelope_of(cell, {})
        record["status"] = status
        write_record(cell.path, record)
    assert main(["failed", "--profile", "slurm"]) == 0
    assert capsys.readouterr().out.split() == [seed[0].path]
    assert main(["failed"]) == 0 and capsys.readouterr().out.split() == []  # smoke has no failed cell


@pytest.mark.parametrize("command", ["suite", "failed", "run"])
def test_config_without_a_value_is_refused_in_one_line(checkout, capsys, command):
    assert main([command, "--config", "suite"]) == 2
    captured = capsys.readouterr()
    assert captured.err.splitlines() == ["flashwatt: --config 'suite': expected KEY=VALUE, e.g. --config suite=smoke "
                                         "(a file to build goes before --config, which takes every word after it)"]
    assert captured.out == ""  # nothing planned, nothing run


def test_a_malformed_overlay_is_named_with_its_line(checkout, capsys):
    (checkout / "overlay.yaml").write_text("suites:\n  mini: {measure: [\n")
    assert main(["run", "--configfile", "config/config.yaml", "overlay.yaml"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("flashwatt: config file overlay.yaml, line 3, column 1: not valid YAML")


def test_an_unknown_profile_is_refused_in_snakemakes_words(checkout, capsys):
    assert main(["failed", "--profile", "nope"]) == 2
    [line] = capsys.readouterr().err.splitlines()
    assert line.startswith("flashwatt: snakemake options '--profile nope': Error: profile directory given (nope)")
