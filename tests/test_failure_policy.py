"""The failure policy of cells of several processes: from the config key `ranks` to the job's
environment and back, the timeouts PyTorch is given, and the srun options that end a step."""
from __future__ import annotations

import datetime

import pytest

from flashwatt.config import load_config
from flashwatt.submit.failure_policy import (ENV_FAILURE_TIMEOUT, ENV_STOP_GRACE, MONITOR_SLACK_S, FailurePolicy)
from flashwatt.submit.jobs import step_ending_srun_args


def test_the_shipped_default_ends_a_failed_cell_within_a_minute():
    policy = FailurePolicy.from_config(load_config("config/config.yaml"))
    assert policy.failure_timeout_s == 60 and policy.stop_grace_s == 5
    # a collective may wait this long; then the ranks are noticed, stopped, and killed within the bound
    assert policy.detect_s + MONITOR_SLACK_S + policy.stop_grace_s == 60
    # a collective's timeout, then an abort that hangs until the heartbeat monitor's second look
    assert policy.collective_timeout_s + 2 * policy.heartbeat_timeout_s <= policy.detect_s
    assert policy.collective_timeout == datetime.timedelta(seconds=37) and policy.heartbeat_timeout_s == 5
    # rank 0 working alone (a float64 check, the one-GPU baseline) may take far longer than a collective
    assert policy.solo_phase_timeout_s == 600


def test_the_config_reaches_the_job_through_its_environment(monkeypatch):
    policy = FailurePolicy.from_config({"ranks": {"failure_timeout_s": 30, "stop_grace_s": 2,
                                                  "solo_phase_timeout_s": 900}})
    for name, value in policy.submission_environment().items():
        monkeypatch.setenv(name, value)
    assert FailurePolicy.from_environment() == policy and policy.solo_phase_timeout_s == 900
    assert step_ending_srun_args() == ["--kill-on-bad-exit=1", "--wait=31"]


def test_the_ranks_get_pytorchs_watchdog_and_keep_a_users_own_settings(monkeypatch):
    monkeypatch.delenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", raising=False)
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "0")  # off is never kept
    env = FailurePolicy(40, 4).rank_environment()
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "3" and env["TORCH_NCCL_ENABLE_MONITORING"] == "1"
    assert env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "5" and "TORCH_NCCL_BLOCKING_WAIT" not in env
    assert (env[ENV_FAILURE_TIMEOUT], env[ENV_STOP_GRACE]) == ("40", "4")
    monkeypatch.setenv("TORCH_NCCL_ASYNC_ERROR_HANDLING", "1")
    monkeypatch.setenv("TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC", "900")
    env = FailurePolicy(40, 4).rank_environment()
    assert env["TORCH_NCCL_ASYNC_ERROR_HANDLING"] == "1" and env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"] == "900"


@pytest.mark.parametrize("timeout, grace, message", [
    (16, 5, r"ranks.failure_timeout_s=16: must be at least 17"),
    (60, 0, r"ranks.stop_grace_s=0: must be positive"),
])
def test_a_policy_that_leaves_no_time_for_a_collective_names_its_key(timeout, grace, message):
    with pytest.raises(ValueError, match=message):
        FailurePolicy(timeout, grace)


def test_a_bad_environment_value_names_the_variable(monkeypatch):
    monkeypatch.setenv(ENV_FAILURE_TIMEOUT, "a minute")
    with pytest.raises(ValueError, match=f"{ENV_FAILURE_TIMEOUT}='a minute'"):
        FailurePolicy.from_environment()
