"""Cells this host cannot run are known from the plan (flashwatt.host_skips), in the very
words each kind's job records when it starts on such a host, and never under Slurm."""
import pytest

from flashwatt.config import load_config
from flashwatt.host_skips import Host, notice, refusal, refused_here, runs_here
from flashwatt.kinds import kind_named, plan_suite
from flashwatt.submit.slots import TOO_FEW_GPUS_REASON, TooFewGpus, gpu_slots

CPU_HOST = Host(())


def planned(suite: str, kind: str) -> dict:
    return plan_suite(load_config(overrides={"suite": suite}), suite)[kind]


def first(cells: dict, **wanted):
    return next((cell, spec) for cell, spec in cells.items()
                if all(getattr(cell, key) == value for key, value in wanted.items()))


def test_an_attention_cell_says_what_its_job_says_on_a_cpu(monkeypatch):
    from flashwatt.attention.job import run_cell

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cells = planned("seed", "attention")
    flash, settings = first(cells, kernel="sdpa_flash", precision="fp16")
    expected = run_cell(flash, settings).record
    assert expected["status"] == "skipped"
    assert refusal(kind_named("attention"), flash, CPU_HOST) == expected["reason"]
    naive, _ = first(cells, kernel="naive", precision="fp32")
    assert refusal(kind_named("attention"), naive, CPU_HOST) is None  # runs on a CPU
    half, _ = first(cells, kernel="naive", precision="fp16")
    assert refusal(kind_named("attention"), half, CPU_HOST) == "naive on CPU runs fp32 only (asked for fp16)"


def test_a_control_cell_says_what_its_job_says_on_a_cpu(monkeypatch):
    from flashwatt.control.job import run_control_cell

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cell, spec = first(planned("control", "control"), mode="energy")
    expected = run_control_cell(cell, spec).record
    assert expected["status"] == "skipped"
    assert refusal(kind_named("control"), cell, CPU_HOST) == expected["reason"]


def test_a_distributed_cell_says_what_its_job_says_on_a_cpu(monkeypatch):
    from flashwatt.distributed.job import job

    from support import free_ports

    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")
    cells = planned("distributed", "distributed")
    bf16, spec = first(cells, precision="bf16", gpus=2)
    [port] = free_ports()
    expected = job(spec, rank=0, world=2, local_rank=0, addr="127.0.0.1", port=port)
    assert expected["status"] == "skipped"
    assert refusal(kind_named("distributed"), bf16, CPU_HOST) == expected["reason"]
    fp32, _ = first(cells, precision="fp32")
    assert refusal(kind_named("distributed"), fp32, CPU_HOST).startswith("no CUDA device for a fp32 cell")


def test_model_and_training_cells_say_what_their_jobs_check_first_on_a_cpu():
    import torch

    from flashwatt.models.preflight import why_not
    from flashwatt.models.presets import build_config, shape_of
    from flashwatt.training import job as training_job

    cell, spec = first(planned("models", "model"), precision="bf16", gpus=1)
    shape = shape_of(build_config(spec["model"]))
    assert refusal(kind_named("model"), cell, CPU_HOST) == why_not(cell, shape, torch.device("cpu"))
    tiny, _ = first(planned("models_smoke", "model"), gpus=1)
    assert refusal(kind_named("model"), tiny, CPU_HOST) is None  # fp32: the job runs it on the CPU
    run, run_spec = next(iter(planned("training", "train").items()))
    config = build_config(run_spec["model"], run.dropout, vocab_size=512)
    assert refusal(kind_named("train"), run, CPU_HOST) == training_job.why_not(
        run, run_spec, shape_of(config), config.model_type, torch.device("cpu"))


def test_a_cell_asking_for_more_gpus_than_the_host_shows_says_what_the_submitting_side_says(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    cell, _ = first(planned("distributed", "distributed"), gpus=4)
    with pytest.raises(TooFewGpus) as shortage, gpu_slots(4):
        pass
    host = Host.here()
    assert host.gpus == ("0", "1")
    assert refusal(kind_named("distributed"), cell, host) == TOO_FEW_GPUS_REASON.format(shortage.value)
    two, _ = first(planned("distributed", "distributed"), gpus=2, precision="bf16")
    assert refusal(kind_named("distributed"), two, host) is None


def test_the_cells_refused_here_and_the_line_said_up_front():
    plans = plan_suite(load_config(overrides={"suite": "seed"}), "seed")
    refused = refused_here(plans, CPU_HOST)
    planned = sum(len(cells) for cells in plans.values())
    assert planned == 58 and len(refused) == 54  # naive and sdpa_math at fp32 run on a CPU
    assert {kind.name for kind, _spec, _why in refused.values()} == {"attention"}
    line = notice(len(refused), planned, CPU_HOST, "seed")
    assert line == ("flashwatt: 54 of 58 cells cannot run here: no CUDA device is visible on this host; "
                    "they are recorded as skipped without a job")
    everything = notice(15, 15, CPU_HOST, "control")
    assert everything.endswith("(suite control needs GPUs: run it where they are, e.g. snakemake --profile slurm "
                               "--config suite=control)")
    assert "more than the 2 GPU(s) this host shows" in notice(3, 10, Host(("0", "1")), "distributed")


def test_nothing_is_decided_here_under_slurm():
    assert runs_here({"executor": "local"}) and runs_here({"executor": "inprocess"})
    assert not runs_here({"executor": "slurm"})
