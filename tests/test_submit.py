"""flashwatt.submit without Slurm: resource mapping, local and in-process runs, GPU slots."""
from __future__ import annotations

import os
import sys
import threading
import time
from pathlib import Path

import cloudpickle
import pytest

from flashwatt.devices import visible_gpu_ids
from flashwatt.submit.jobs import JobFailed, run_job
from flashwatt.submit.resources import runtime_minutes, slurm_parameters
from flashwatt.submit.slots import gpu_slots

# The job functions below live in this test module, which a job's subprocess cannot
# import; pickle them by value instead.
cloudpickle.register_pickle_by_value(sys.modules[__name__])


def job_info(tag: str, sleep_s: float = 0.0) -> dict:
    from flashwatt.submit.environment import current_job_id

    start = time.time()
    time.sleep(sleep_s)
    print(f"job {tag} running", flush=True)
    return {
        "tag": tag,
        "pid": os.getpid(),
        "job_id": current_job_id(),
        "cuda": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "start": start,
        "end": time.time(),
    }


def job_meets(tag: str, other: str, folder: str) -> dict:
    """job_info of a job that says it runs (a file named `tag`) and waits up to a minute for
    job `other` to say so too: two jobs that run at the same time meet whatever the load,
    two that run one after the other cannot."""
    from pathlib import Path

    Path(folder, tag).touch()
    deadline = time.monotonic() + 60
    while not Path(folder, other).exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return {**job_info(tag), "met": Path(folder, other).exists()}


def job_raises(message: str) -> None:
    raise ValueError(message)


@pytest.fixture(autouse=True)
def _fast_and_isolated(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHWATT_SLOT_DIR", str(tmp_path / "slots"))
    monkeypatch.setenv("FLASHWATT_POLL_S", "0.1")
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "")  # no GPU: one "cpu" slot
    monkeypatch.chdir(tmp_path)


# ---- resources ----------------------------------------------------------------------------

def test_slurm_parameters_maps_every_resource():
    params = slurm_parameters(
        {
            "slurm_partition": "gpu", "slurm_account": "proj42", "gpus": 2, "gres": "gpu:h100:2",
            "cpus_per_task": "8", "mem_mb": 32000, "runtime": 90, "qos": "high", "constraint": "h100",
            "slurm_extra": "--exclusive --mail-type=END -w node7 --comment 'flash watt'", "tasks": 2, "nodes": 1,
            # added by Snakemake to every job: ignored
            "_cores": 1, "_nodes": 1, "tmpdir": "/tmp", "mem_mib": 30518, "disk_mb": 1000, "disk_mib": 954,
            "mem": "32 GB", "disk": "1000 MB",
        }
    )
    assert params == {
        "slurm_partition": "gpu",
        "slurm_account": "proj42",
        "gpus_per_node": 2,
        "slurm_gres": "gpu:h100:2",
        "cpus_per_task": 8,
        "slurm_mem": "32000M",
        "timeout_min": 90,
        "slurm_qos": "high",
        "slurm_constraint": "h100",
        "slurm_additional_parameters": {"exclusive": True, "mail_type": "END", "nodelist": "node7", "comment": "flash watt"},
        "tasks_per_node": 2,
        "nodes": 1,
    }


def test_slurm_parameters_unknown_key_is_named():
    with pytest.raises(ValueError, match="'gpu_model'"):
        slurm_parameters({"slurm_partition": "gpu", "gpu_model": "h100"})


@pytest.mark.parametrize("value, minutes", [(30, 30), (0.2, 1), ("45", 45), ("2h", 120), ("90min", 90),
                                            ("1.5 hours", 90), ("2 days", 2880), ("30s", 1)])
def test_runtime_forms(value, minutes):
    assert slurm_parameters({"runtime": value})["timeout_min"] == minutes


@pytest.mark.parametrize("value", ["2h", "90min", "1.5 hours", "45"])
def test_runtime_means_what_snakemake_makes_of_it(value):
    from snakemake.resources import Resource

    assert runtime_minutes(value) == Resource.parse_human_friendly("runtime", value)


def test_defaults_and_bad_values():
    assert slurm_parameters(None) == {"timeout_min": 60}
    with pytest.raises(ValueError, match="runtime"):
        slurm_parameters({"runtime": "soon"})
    with pytest.raises(ValueError, match="gpus"):
        slurm_parameters({"gpus": "two"})
    with pytest.raises(ValueError, match="cannot read"):
        slurm_parameters({"slurm_extra": "exclusive"})
    with pytest.raises(ValueError, match="executor"):
        run_job(job_info, "x", job_name="fw-x", folder="jobs", executor="debug")


# ---- local and in-process runs --------------------------------------------------------------

def test_local_runs_in_a_subprocess_and_returns(tmp_path):
    log = tmp_path / "logs" / "ok.log"
    result = run_job(job_info, "a", job_name="fw-ok", folder="jobs", resources={"runtime": 1, "_cores": 1}, log_path=log)
    assert result["tag"] == "a"
    assert result["pid"] != os.getpid()
    assert result["job_id"]  # the job knows its own id
    text = log.read_text()
    assert f"submitted local job {result['job_id']}" in text
    assert "job a running" in text  # the job's stdout was appended to the log
    assert (tmp_path / "jobs" / "fw-ok").is_dir()


def test_inprocess_calls_directly(tmp_path):
    result = run_job(job_info, "b", job_name="fw-in", folder="jobs", executor="inprocess", log_path=tmp_path / "in.log")
    assert result["pid"] == os.getpid()
    assert result["job_id"] is None
    with pytest.raises(JobFailed, match="ValueError: in-process boom"):
        run_job(job_raises, "in-process boom", job_name="fw-in", folder="jobs", executor="inprocess")


def test_failing_job_raises_with_traceback(tmp_path):
    log = tmp_path / "fail.log"
    with pytest.raises(JobFailed) as caught:
        run_job(job_raises, "kaboom 42", job_name="fw-fail", folder="jobs", log_path=log)
    failure = caught.value
    assert failure.job_id and failure.job_id in str(failure)
    assert failure.state == "FAILED"
    assert "Traceback" in str(failure) and "ValueError: kaboom 42" in str(failure)
    assert "ValueError: kaboom 42" in log.read_text()  # Snakemake's log shows the remote traceback


# ---- GPU slots ---------------------------------------------------------------------------------

def _run_concurrently(fn, *tags: str, args=lambda tag: ()) -> list[dict]:
    results: dict[str, dict] = {}
    errors: list[BaseException] = []

    def one(tag: str) -> None:
        try:
            results[tag] = run_job(fn, tag, *args(tag), job_name=f"fw-{tag}", folder="jobs")
        except BaseException as error:  # surfaced below
            errors.append(error)

    threads = [threading.Thread(target=one, args=(tag,)) for tag in tags]
    for t in threads:
        t.start()
    for t in threads:
        t.join(timeout=600)  # far past any job here; a hang fails naming it instead of waiting forever
        assert not t.is_alive(), "a local job did not return in 10 minutes"
    assert not errors, errors
    return [results[tag] for tag in tags]


def _overlap(a: dict, b: dict) -> bool:
    return a["start"] < b["end"] and b["start"] < a["end"]


def test_one_slot_runs_jobs_one_after_the_other():
    first, second = _run_concurrently(job_info, "s1", "s2", args=lambda tag: (1.0,))
    assert not _overlap(first, second)
    assert first["cuda"] == second["cuda"] == ""  # no GPU on this machine, none shown


@pytest.mark.parametrize("devices", ["3,5", "GPU-8f2a,MIG-77c1"])
def test_each_gpu_takes_one_job_and_the_job_sees_only_it(monkeypatch, devices):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", devices)
    assert visible_gpu_ids() == devices.split(",")
    meeting = str(Path.cwd() / "meeting")
    os.makedirs(meeting)
    other = {"g1": "g2", "g2": "g1"}
    first, second = _run_concurrently(job_meets, "g1", "g2", args=lambda tag: (other[tag], meeting))
    assert first["met"] and second["met"]  # two GPUs, two jobs at once: each saw the other run
    assert sorted([first["cuda"], second["cuda"]]) == sorted(devices.split(","))


def job_rank() -> dict:
    from flashwatt.submit.environment import current_job_info

    return current_job_info()


def test_local_multi_task_returns_rank_zero(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    info = run_job(job_rank, job_name="fw-mt", folder="jobs", resources={"tasks": 2, "gpus": 2})
    assert info["rank"] == 0 and info["ntasks"] == 2


def test_slots_are_taken_all_or_nothing(monkeypatch):
    monkeypatch.setenv("CUDA_VISIBLE_DEVICES", "0,1")
    with gpu_slots(1) as held:
        assert held == ["0"]
        with gpu_slots(1) as other:
            assert other == ["1"]
        got: list[list[str]] = []
        waiter = threading.Thread(target=lambda: got.append(_take(2)))
        waiter.start()
        time.sleep(0.5)
        assert not got  # two slots wanted, one free: waits without holding the free one
        with gpu_slots(1) as free:
            assert free == ["1"]
    waiter.join(timeout=10)
    assert got == [["0", "1"]]
    with pytest.raises(ValueError, match="3 GPUs"):
        with gpu_slots(3):
            pass


def _take(count: int) -> list[str]:
    with gpu_slots(count, poll_s=0.1) as held:
        return held


# ---- the package's boundaries ------------------------------------------------------------

def _modules_after_import(statement: str) -> set[str]:
    import subprocess

    out = subprocess.run([sys.executable, "-c", f"{statement}; import sys; print(' '.join(sys.modules))"],
                         capture_output=True, text=True, check=True, env=os.environ).stdout
    return set(out.split())


@pytest.mark.parametrize("statement", ["import flashwatt.provenance",
                                       "from flashwatt.submit.resources import refuse_unknown_resources",
                                       "from flashwatt.submit import current_job_info, slurm_parameters"])
def test_reading_the_job_or_checking_resources_does_not_load_submitit(statement):
    assert "submitit" not in _modules_after_import(statement)


def test_every_public_name_is_importable_from_the_package():
    import flashwatt.submit as submit

    for name in submit.__all__:
        assert getattr(submit, name) is not None
    assert "submitit" in _modules_after_import("from flashwatt.submit import run_job")
    with pytest.raises(AttributeError, match="no attribute 'run_jobs'"):
        submit.run_jobs


def job_parent_pid() -> dict:
    from flashwatt.submit.environment import current_job_id

    return {"job_id": current_job_id(), "parent": os.getppid()}


def test_local_job_id_is_its_controllers_pid():
    # flashwatt.submit.cancel kills a local controller that ignores SIGINT by this pid
    # (the reason pyproject.toml pins submitit's version): this fails if submitit changes it.
    info = run_job(job_parent_pid, job_name="fw-pid", folder="jobs")
    assert info["job_id"] == str(info["parent"])
