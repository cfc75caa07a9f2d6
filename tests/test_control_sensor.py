"""The controller's sensor tick (flashwatt.control.sensor.read): one reading of the first GPU,
its failures as data; and NVML's utilization carried into the trace beside the duty the pacer
counts, never acted on."""
from __future__ import annotations

import pytest

from control_plant import PROFILES, Plant, SimStepGpu, StepProfile, run_steps, sim_controller
from flashwatt.control.sensor import read


class RowsTelemetry:
    """Telemetry that answers with given rows (or raises)."""

    def __init__(self, rows, reason: str | None = None):
        self.rows, self.reason = rows, reason

    def sample(self):
        if isinstance(self.rows, Exception):
            raise self.rows
        return self.rows


ROW = {"gpu": 0, "power_instant_w": 412.5, "energy_mj": 123456, "gpu_temp_c": 61, "sm_clock_mhz": 1755,
       "clock_reasons": 4, "gpu_util_pct": 63}


def test_a_reading_carries_the_first_gpus_power_energy_temperature_clocks_and_utilization():
    other = {**ROW, "gpu": 1, "power_instant_w": 99.0, "gpu_util_pct": 0}
    reading = read(RowsTelemetry([ROW, other]), clock=lambda: 7.0)
    assert (reading.t, reading.power_w, reading.energy_mj, reading.temp_c) == (7.0, 412.5, 123456, 61)
    assert (reading.sm_clock_mhz, reading.clock_reasons, reading.gpu_util_pct, reading.error) == (1755, 4, 63, None)


@pytest.mark.parametrize("telemetry, error", [
    (RowsTelemetry(RuntimeError("NVML gone")), "RuntimeError: NVML gone"),
    (RowsTelemetry([], reason="no NVIDIA driver"), "no NVIDIA driver"),
    (RowsTelemetry([{**ROW, "power_instant_w": None}]), "NVML returned no power value"),
])
def test_a_failed_reading_is_data_that_names_its_cause(telemetry, error):
    reading = read(telemetry, clock=lambda: 1.0)
    assert reading.power_w is None and reading.error == error


@pytest.mark.parametrize("duty", [0.3, 0.65])
def test_the_trace_records_what_the_board_says_it_was_busy_beside_the_duty_counted(duty):
    """On the simulated board its utilization is the share of each sensor period a step's work
    ran: averaged over the run it is the duty the pacer realized (and the trace keeps it)."""
    gpu = SimStepGpu(Plant(PROFILES), {"unchanged": StepProfile(0.2, 650.0)}, blocks=16)
    ctl = sim_controller(gpu, "static", None, configuration="unchanged", duty=duty)
    trace = run_steps(ctl, gpu, 8.0)
    late = trace[trace["t"] > 2.0]
    assert late["gpu_util_pct"].notna().all()
    assert late["gpu_util_pct"].mean() / 100.0 == pytest.approx(gpu.busy_share(since=2.0), abs=0.02)
    assert late["gpu_util_pct"].mean() / 100.0 == pytest.approx(duty, abs=0.03)
