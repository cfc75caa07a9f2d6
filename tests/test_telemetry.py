"""flashwatt.telemetry against a fake NVML module (no GPU needed)."""
from __future__ import annotations

import time

import pytest

from support import wait_until
from fake_nvml import FakeGpu, FakeNvml, NVMLError_LibraryNotFound, NVMLError_NoPermission, uuid_for
from flashwatt.telemetry import (
    MIG_WARNING,
    NullTelemetry,
    NvmlTelemetry,
    Sampler,
    decode_clock_reasons,
    normalize_uuid,
    open_telemetry,
)


def _open(gpus, uuids=None, **kw):
    nvml = FakeNvml(gpus, **kw)
    return open_telemetry(uuids, nvml=nvml), nvml


# ---- clock event reasons ---------------------------------------------------------------
def test_decode_clock_reasons_each_bit():
    expected = {
        0x1: "GpuIdle", 0x2: "ApplicationsClocksSetting", 0x4: "SwPowerCap", 0x8: "HwSlowdown",
        0x10: "SyncBoost", 0x20: "SwThermalSlowdown", 0x40: "HwThermalSlowdown",
        0x80: "HwPowerBrakeSlowdown", 0x100: "DisplayClockSetting",
    }
    for bit, name in expected.items():
        assert decode_clock_reasons(bit) == [name]
    assert decode_clock_reasons(0x1FF) == list(expected.values())


def test_decode_clock_reasons_combinations_and_edges():
    assert decode_clock_reasons(0) == []
    assert decode_clock_reasons(None) == []
    assert decode_clock_reasons(0x4 | 0x40) == ["SwPowerCap", "HwThermalSlowdown"]
    assert decode_clock_reasons(0x4 | 0x1000) == ["SwPowerCap", "0x1000"]


# ---- opening ----------------------------------------------------------------------------
def test_normalize_uuid():
    assert normalize_uuid("GPU-ABCD-01") == "abcd-01"
    assert normalize_uuid(b"GPU-abcd-01") == "abcd-01"
    assert normalize_uuid("abcd-01") == "abcd-01"
    assert normalize_uuid("MIG-abcd-01") == "abcd-01"


def test_open_maps_by_uuid_not_index_and_accepts_torch_form():
    gpus = [FakeGpu(uuid_for(k), index=k, name=f"Fake {k}") for k in range(3)]
    # torch writes UUIDs without "GPU-"; ask for NVML's GPU 2 then GPU 0
    tel, _ = _open(gpus, [uuid_for(2)[4:], uuid_for(0)])
    assert isinstance(tel, NvmlTelemetry) and tel.available and tel.reason is None
    ident = tel.identity()
    assert [d["uuid"] for d in ident] == [uuid_for(2), uuid_for(0)]
    assert [d["nvml_index"] for d in ident] == [2, 0]
    assert [d["gpu"] for d in ident] == [0, 1]
    assert [r["gpu"] for r in tel.sample()] == [0, 1]


def test_open_all_gpus_when_none_given():
    gpus = [FakeGpu(uuid_for(k), index=k) for k in range(2)]
    tel, _ = _open(gpus, None)
    assert len(tel.devices) == 2


def test_unknown_uuid_gives_null_with_reason():
    tel, nvml = _open([FakeGpu(uuid_for(0))], ["deadbeef-0000"])
    assert isinstance(tel, NullTelemetry) and not tel.available
    assert "deadbeef-0000" in tel.reason
    assert nvml.shutdowns == 1


def test_library_not_found_gives_null_backend():
    tel, _ = _open([FakeGpu(uuid_for(0))], None, init_error=NVMLError_LibraryNotFound)
    assert not tel.available
    assert tel.reason.startswith("NVML library not found")
    assert tel.identity() == [] and tel.energy_mj() == [] and tel.sample() == [] and tel.violation_ns() == []
    tel.close()


def test_permission_denied_gives_null_backend():
    tel, _ = _open([FakeGpu(uuid_for(0))], None, init_error=NVMLError_NoPermission)
    assert not tel.available and tel.reason.startswith("NVML permission denied")


def test_no_gpu_gives_null_backend():
    tel, _ = _open([], None)
    assert not tel.available and "no NVIDIA GPU" in tel.reason


def _nvml_works_here() -> bool:
    """Independent oracle: does the real binding initialise and see a GPU on this machine?"""
    import pynvml

    try:
        pynvml.nvmlInit()
    except (pynvml.NVMLError, OSError):
        return False
    try:
        return pynvml.nvmlDeviceGetCount() > 0
    finally:
        pynvml.nvmlShutdown()


def test_real_pynvml_matches_what_this_machine_has():
    expected = _nvml_works_here()
    tel = open_telemetry(None)
    try:
        assert tel.available is expected, tel.reason
        if expected:
            assert len(tel.energy_mj()) == len(tel.devices) > 0 and tel.reason is None
        else:
            assert isinstance(tel, NullTelemetry) and tel.reason and tel.energy_mj() == []
    finally:
        tel.close()


@pytest.mark.parametrize("error_name, reason", [
    ("NVMLError_LibraryNotFound", "NVML library not found"),
    ("NVMLError_DriverNotLoaded", "NVIDIA driver not loaded"),
    ("NVMLError_NoPermission", "NVML permission denied"),
])
def test_real_pynvml_init_failures_become_a_reason(monkeypatch, error_name, reason):
    import pynvml

    def fail():
        raise getattr(pynvml, error_name)()

    monkeypatch.setattr(pynvml, "nvmlInit", fail)
    tel = open_telemetry(None)
    assert isinstance(tel, NullTelemetry) and tel.reason.startswith(reason + ": " + error_name)
    assert tel.energy_mj() == [] and tel.sample() == []


# ---- identity ---------------------------------------------------------------------------
def test_identity_fields():
    tel, _ = _open([FakeGpu(uuid_for(0), name="Fake H200", power_limit_w=700.0)])
    (d,) = tel.identity()
    assert d["name"] == "Fake H200"
    assert d["pci_bus_id"] == "00000000:18:00.0"  # bytes from NVML, decoded
    assert d["compute_capability"] == "9.0"
    assert d["driver_version"] == "580.00.00" and d["nvml_version"] == "13.580.00"
    assert d["power_limit_enforced_w"] == 700.0 and d["power_limit_default_w"] == 700.0
    assert d["power_limit_min_w"] == 200.0 and d["power_limit_max_w"] == 700.0
    assert d["mig_mode_current"] == 0 and d["mig_enabled"] is False and d["mig_warning"] is None
    assert d["persistence_mode"] is True
    assert d["max_sm_clock_mhz"] == 1980 and d["max_mem_clock_mhz"] == 3201
    assert d["energy_counter_supported"] is True and d["instant_power_supported"] is True
    assert d["unsupported"] == []


def test_mig_is_detected_and_warned():
    tel, _ = _open([FakeGpu(uuid_for(0), mig=True)])
    (d,) = tel.identity()
    assert d["mig_enabled"] is True and d["mig_mode_current"] == 1
    assert d["mig_warning"] == MIG_WARNING and "whole-GPU" in d["mig_warning"]


# ---- readings ----------------------------------------------------------------------------
def test_sample_reads_every_field():
    g = FakeGpu(uuid_for(0), power_w=250.0, update_period_s=0.0)
    g.temp_c, g.mem_temp_c, g.sm_clock_mhz, g.mem_clock_mhz = 61, 70, 1755, 2619
    g.util, g.reasons = (97, 40), 0x4 | 0x20
    tel, _ = _open([g])
    t_before = time.monotonic()
    (s,) = tel.sample()
    assert t_before <= s["t"] <= time.monotonic()
    assert s["power_instant_w"] == pytest.approx(250.0)
    assert s["power_instant_fallback"] is False
    assert s["power_average_w"] == pytest.approx(250.0)
    assert s["energy_mj"] >= g.energy_start_mj
    assert (s["gpu_temp_c"], s["mem_temp_c"], s["sm_clock_mhz"], s["mem_clock_mhz"]) == (61, 70, 1755, 2619)
    assert (s["gpu_util_pct"], s["mem_util_pct"]) == (97, 40)
    assert decode_clock_reasons(s["clock_reasons"]) == ["SwPowerCap", "SwThermalSlowdown"]


def test_energy_counter_is_stale_between_updates():
    # The GPU's own clock, stepped by hand: what is read between two updates cannot depend
    # on how long this process waited for a CPU.
    now = [1000.0]
    g = FakeGpu(uuid_for(0), power_w=300.0, update_period_s=0.1, clock=lambda: now[0])
    tel, _ = _open([g])
    first = tel.energy_mj()[0]
    for t in (0.03, 0.06, 0.099):
        now[0] = 1000.0 + t
        assert tel.energy_mj()[0] == first  # stale until the next update
    now[0] = 1000.1
    changed = tel.energy_mj()[0]
    # one update of 100 ms at 300 W is 30 J (30000 mJ)
    assert changed - first == pytest.approx(30_000, rel=0.01)
    now[0] = 1000.15
    assert tel.energy_mj()[0] == changed
    now[0] = 1000.2
    assert tel.energy_mj()[0] - changed == pytest.approx(30_000, rel=0.01)


def test_instant_power_falls_back_to_power_usage_with_flag():
    g = FakeGpu(uuid_for(0), power_w=180.0, update_period_s=0.0, unsupported={"field:186", "field:82"})
    tel, _ = _open([g])
    (s,) = tel.sample()
    assert s["power_instant_w"] == pytest.approx(180.0)
    assert s["power_instant_fallback"] is True
    assert s["mem_temp_c"] is None
    (d,) = tel.identity()
    assert d["instant_power_supported"] is False
    assert "power_instant_w" in d["unsupported"] and "mem_temp_c" in d["unsupported"]


def test_unsupported_calls_give_none_and_are_not_repeated():
    g = FakeGpu(uuid_for(0), unsupported={"nvmlDeviceGetTemperature", "nvmlDeviceGetViolationStatus",
                                          "nvmlDeviceGetTotalEnergyConsumption", "nvmlDeviceGetMigMode"})
    tel, _ = _open([g])
    for _ in range(3):
        (s,) = tel.sample()
        assert s["gpu_temp_c"] is None and s["energy_mj"] is None
        assert s["power_instant_w"] is not None
    assert tel.energy_mj() == [None]
    assert g.calls["nvmlDeviceGetTemperature"] == 1  # remembered as unsupported
    (v,) = tel.violation_ns()
    assert set(v) >= {"power", "thermal"} and all(x is None for x in v.values())
    (d,) = tel.identity()
    assert d["energy_counter_supported"] is False and d["mig_mode_current"] is None
    assert "gpu_temp_c" in d["unsupported"] and "energy_mj" in d["unsupported"]


def test_violation_status_in_ns_per_policy():
    g = FakeGpu(uuid_for(0))
    g.violation_ns[0] = 123_000
    g.violation_ns[1] = 7
    tel, _ = _open([g])
    (v,) = tel.violation_ns()
    assert v["power"] == 123_000 and v["thermal"] == 7 and v["board_limit"] == 0


def test_close_shuts_nvml_down_once():
    tel, nvml = _open([FakeGpu(uuid_for(0))])
    tel.close()
    tel.close()
    assert nvml.shutdowns == 1


# ---- sampler ------------------------------------------------------------------------------
def test_sampler_start_stop_rows_and_frame():
    gpus = [FakeGpu(uuid_for(k), index=k, power_w=100.0 + k) for k in range(2)]
    tel, _ = _open(gpus)
    s = Sampler(tel, period_s=0.02)
    started = time.monotonic()
    s.start()
    assert s.running
    # Ten rounds whatever the machine's load (a starved thread takes longer, not fewer).
    wait_until(lambda: len({r["sample"] for r in s.rows}) >= 10, 60, "ten rounds of samples")
    rows = s.stop()
    stopped = time.monotonic()
    assert not s.running and s.error is None
    rounds = sorted({r["sample"] for r in rows})
    assert rounds == list(range(len(rounds))) and len(rows) == 2 * len(rounds)
    ts = [r["t"] for r in rows if r["gpu"] == 0]
    assert ts == sorted(ts) and started <= ts[0] and ts[-1] <= stopped
    # Paced by the period, never faster: the rounds between the first and the final one
    # (taken at stop) are at least 20 ms apart on average; skipped, never bursting, when late.
    assert ts[-2] - ts[0] >= 0.02 * (len(ts) - 2) * 0.9
    df = s.to_frame()
    assert {"gpu", "t", "sample", "power_instant_w", "energy_mj", "clock_reasons"} <= set(df.columns)
    assert sorted(df["gpu"].unique()) == [0, 1]
    assert df[df.gpu == 1]["power_instant_w"].iloc[0] == pytest.approx(101.0)
    n = len(rows)
    time.sleep(0.05)
    assert len(s.rows) == n  # stopped means stopped


def test_sampler_stop_is_prompt_with_long_period():
    tel, _ = _open([FakeGpu(uuid_for(0))])
    with Sampler(tel, period_s=30.0) as s:
        wait_until(lambda: s.rows, 60, "the start sample")
        t0 = time.monotonic()
    # stop() wakes the thread: it does not sit out the rest of the 30 s period
    assert time.monotonic() - t0 < 30.0 / 3
    assert {r["sample"] for r in s.rows} == {0, 1}  # the start sample and the final one


def test_sampler_on_null_telemetry_records_nothing():
    s = Sampler(NullTelemetry("no NVML"), period_s=0.01)
    with s:
        time.sleep(0.03)
    assert s.rows == [] and not s.running


def test_sampler_rejects_bad_period():
    with pytest.raises(ValueError):
        Sampler(NullTelemetry("x"), period_s=0)
