"""run_job(executor="slurm") against a real Slurm: results, failures, cancellation, tasks, requeue."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import textwrap
import threading
import time
import uuid
from pathlib import Path

import cloudpickle
import pytest

from slurm_jobs import join_waiter, release_requeued, wait_while_job_lives
from support import ci_log, wait_until

from flashwatt.submit.jobs import JobFailed, run_job

pytestmark = [pytest.mark.slurm, pytest.mark.usefixtures("slurm", "fast_wait")]
cloudpickle.register_pickle_by_value(sys.modules[__name__])  # jobs cannot import this test module


def sh(*cmd: str, timeout: float = 10) -> str:
    return subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True).stdout.strip()


def sacct(job_id: str, fields: str = "State") -> str:
    out = sh("sacct", "-n", "-X", "-P", "-j", job_id, "-o", fields)
    return out.splitlines()[0] if out else ""


def final_state(job_id: str, timeout: float = 20) -> str:
    """The job's state once accounting has caught up with its end (sacct lags slurmctld)."""
    unsettled = ("", "PENDING", "RUNNING", "REQUEUED", "COMPLETING")
    return wait_until(lambda: (lambda s: s if s not in unsettled else "")(sacct(job_id)), timeout, f"job {job_id} to end in sacct")


def queued(job_id: str) -> str:
    return sh("squeue", "-h", "-j", job_id, "-o", "%T") if job_id else ""


def ci_line(job_id: str, note: str = "") -> None:
    """One line per job for the CI log, from the controller's record (sacct fills in late)."""
    final_state(job_id)
    fields = dict(kv.split("=", 1) for kv in sh("scontrol", "show", "job", "-o", job_id).split() if "=" in kv)
    gpus = re.search(r"gres/gpu=(\d+)", fields.get("TRES", ""))
    ci_log(f"[slurm] job {job_id} name={fields.get('JobName')} partition={fields.get('Partition')}"
          f" state={fields.get('JobState')} exit={fields.get('ExitCode')} restarts={fields.get('Restarts')}"
          f" gpus={gpus.group(1) if gpus else 0}{'  ' + note if note else ''}")


def submitted_id(log: Path) -> str:
    text = log.read_text() if log.exists() else ""
    match = re.search(r"submitted slurm job (\d+)", text)
    return match.group(1) if match else ""


def unique(name: str) -> str:
    return f"fw-test-{name}-{uuid.uuid4().hex[:6]}"


# ---- functions the jobs run ---------------------------------------------------------------

def job_info(sleep_s: float = 0.0) -> dict:
    from flashwatt.submit.environment import current_job_info

    info = current_job_info()
    print(f"job start rank={info['rank']} restarts={info['restarts']}", flush=True)
    time.sleep(sleep_s)
    info["cuda"] = os.environ.get("CUDA_VISIBLE_DEVICES")
    info["node_list"] = os.environ.get("SLURM_JOB_NODELIST")
    return info


def job_sleeps_until_requeued() -> dict:
    """job_info, sleeping in its first run until Slurm stops it (the test's USR2 requeues it
    first) and returning at once when requeued: the signal cannot come after the run ended."""
    from flashwatt.submit.environment import current_job_info

    return job_info(240 if current_job_info()["restarts"] == 0 else 0)


def job_raises() -> None:
    raise RuntimeError("cell exploded on purpose")


# ---- tests ----------------------------------------------------------------------------------

def test_success_returns_result_with_job_id(tmp_path):
    log = tmp_path / "ok.log"
    info = run_job(job_info, job_name=unique("ok"), folder=tmp_path / "jobs", executor="slurm",
                   resources={"slurm_partition": "cpu", "runtime": 5, "mem_mb": 500, "_cores": 1, "tmpdir": "/tmp"},
                   log_path=log)
    job_id = info["job_id"]
    ci_line(job_id)
    assert job_id and job_id == submitted_id(log)
    assert info["executor"] == "slurm" and info["restarts"] == 0
    assert final_state(job_id) == "COMPLETED"
    assert "job start rank=0" in log.read_text()


def test_failure_raises_with_remote_traceback_in_log(tmp_path):
    log = tmp_path / "fail.log"
    with pytest.raises(JobFailed) as caught:
        run_job(job_raises, job_name=unique("fail"), folder=tmp_path / "jobs", executor="slurm",
                resources={"slurm_partition": "cpu", "runtime": 5}, log_path=log)
    failure = caught.value
    ci_line(failure.job_id, "(expected: the function raised)")
    assert failure.job_id == submitted_id(log)
    assert failure.state == "FAILED" == final_state(failure.job_id)
    assert "RuntimeError: cell exploded on purpose" in str(failure)
    text = log.read_text()
    assert "Traceback" in text and "RuntimeError: cell exploded on purpose" in text


_WAITER = """
import sys, time
from flashwatt.submit.jobs import run_job

def sleeper():
    time.sleep(300)

run_job(sleeper, job_name=sys.argv[1], folder="jobs", executor="slurm",
        resources={"slurm_partition": "cpu", "runtime": 10}, log_path="waiter.log")
"""


def test_sigterm_of_the_waiting_process_cancels_the_job(tmp_path):
    script = tmp_path / "waiter.py"
    script.write_text(textwrap.dedent(_WAITER))
    env = dict(os.environ, FLASHWATT_POLL_S="0.2")
    waiter = subprocess.Popen([sys.executable, str(script), unique("sigterm")], cwd=tmp_path, env=env,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        job_id = wait_until(lambda: submitted_id(tmp_path / "waiter.log"), 30, "the submission")
        wait_until(lambda: queued(job_id) == "RUNNING", 30, f"job {job_id} to run")
        waiter.send_signal(signal.SIGTERM)
        waiter.wait(timeout=20)
    finally:
        if waiter.poll() is None:
            waiter.kill()
    assert waiter.returncode == 128 + signal.SIGTERM
    wait_until(lambda: not queued(job_id), 20, f"job {job_id} to leave the queue")
    ci_line(job_id, "(expected: cancelled when its waiting process got SIGTERM)")
    assert final_state(job_id).startswith("CANCELLED")
    assert "interrupted (SIGTERM)" in (tmp_path / "waiter.log").read_text()


def test_external_scancel_is_reported_long_before_the_job_would_end(tmp_path):
    log = tmp_path / "scancel.log"
    outcome: dict = {}
    sleep_s = 300

    def wait() -> None:
        try:
            run_job(job_info, sleep_s, job_name=unique("scancel"), folder=tmp_path / "jobs", executor="slurm",
                    resources={"slurm_partition": "cpu", "runtime": 10}, log_path=log)
        except JobFailed as failure:
            outcome["failure"] = failure
            outcome["at"] = time.monotonic()

    thread = threading.Thread(target=wait)
    thread.start()
    job_id = wait_until(lambda: submitted_id(log), 120, "the submission")
    wait_while_job_lives(job_id, lambda: queued(job_id) == "RUNNING", "the job to run")
    cancelled_at = time.monotonic()
    sh("scancel", job_id)
    join_waiter(thread, job_id)
    ci_line(job_id, "(expected: cancelled from outside)")
    assert "failure" in outcome, "run_job did not raise after scancel"
    assert outcome["failure"].state.startswith("CANCELLED")
    # No result file ever comes: run_job learns of the scancel from Slurm's state (polled every
    # FLASHWATT_STATUS_INTERVAL_S, 2 s here), not from the job's end, which is minutes away.
    assert outcome["at"] - cancelled_at < sleep_s / 2


def test_two_tasks_on_the_gpu_partition(tmp_path):
    log = tmp_path / "tasks.log"
    info = run_job(job_info, job_name=unique("tasks"), folder=tmp_path / "jobs", executor="slurm",
                   resources={"slurm_partition": "gpu", "gres": "gpu:2", "tasks": 2, "runtime": 5}, log_path=log)
    ci_line(info["job_id"], "(2 tasks, gres gpu:2)")
    assert info["rank"] == 0 and info["ntasks"] == 2  # rank 0's result
    assert info["cuda"] == "0,1"  # both fake GPUs allocated to the job
    assert "gres/gpu=2" in sacct(info["job_id"], "AllocTRES")
    text = log.read_text()
    assert "job start rank=0" in text and "job start rank=1" in text  # the function ran once per task


def test_usr2_before_time_limit_requeues_and_returns_once(tmp_path):
    log = tmp_path / "requeue.log"
    job_name = unique("requeue")
    outcome: dict = {}

    def wait() -> None:
        try:
            outcome["result"] = run_job(job_sleeps_until_requeued, job_name=job_name, folder=tmp_path / "jobs",
                                        executor="slurm", resources={"slurm_partition": "cpu", "runtime": 5},
                                        log_path=log)
        except BaseException as error:  # surfaced by the asserts
            outcome["error"] = error

    thread = threading.Thread(target=wait)
    thread.start()
    job_id = wait_until(lambda: submitted_id(log), 120, "the submission")
    # USR2 only once the function runs: before submitit's handler is in place it would kill the job.
    stdout = tmp_path / "jobs" / job_name / f"{job_id}_0_log.out"
    wait_while_job_lives(job_id, lambda: stdout.is_file() and "job start rank=0" in stdout.read_text(),
                         "the function to start")
    # What Slurm sends `signal_delay_s` before the time limit; then skip the hold of a requeued job.
    sh("scancel", "--signal=USR2", job_id)
    release_requeued(job_id)
    join_waiter(thread, job_id)
    ci_line(job_id, "(expected: requeued once by USR2, then completed)")
    assert "error" not in outcome, outcome.get("error")
    result = outcome["result"]
    assert result["job_id"] == job_id  # same job id after the requeue
    assert result["restarts"] == 1
    assert final_state(job_id) == "COMPLETED"
    text = log.read_text()
    assert text.count("job start rank=0") == 2  # ran twice, from the beginning
    assert "Requeued job" in text
    assert text.count(f"slurm job {job_id}") == 1 + 1  # one "submitted" line, one end header: returned once
