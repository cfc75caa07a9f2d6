"""A fake NVML module for unit tests: simulated GPUs behind pynvml's function names.

Each `FakeGpu` draws a programmable power (W, piecewise constant in time). Its energy
counter (mJ) is the integral of that power, published only on an update period
(100 ms like real NVML unless told otherwise), so reads between updates are stale.
Instant power can be scaled or offset against the counter's power, fields can be
made unsupported (raising pynvml's own NVMLError_NotSupported), the counter can wrap
or jump backwards, MIG can be on.
"""
from __future__ import annotations

import math
import threading
import time
from types import SimpleNamespace
from typing import Callable

import pynvml

NVMLError = pynvml.NVMLError
NVMLError_NotSupported = pynvml.NVMLError_NotSupported
NVMLError_NotFound = pynvml.NVMLError_NotFound
NVMLError_LibraryNotFound = pynvml.NVMLError_LibraryNotFound
NVMLError_NoPermission = pynvml.NVMLError_NoPermission
NVMLError_Uninitialized = pynvml.NVMLError_Uninitialized


class FakeGpu:
    def __init__(
        self,
        uuid: str,
        *,
        name: str = "Fake H200",
        index: int = 0,
        power_w: float = 100.0,
        update_period_s: float = 0.1,
        instant_period_s: float = 0.0,
        clock: Callable[[], float] = time.monotonic,
        energy_start_mj: int = 5_000_000,
        wrap_mj: int | None = None,
        mig: bool = False,
        unsupported: set[str] | None = None,
        power_limit_w: float = 700.0,
    ):
        self.uuid = uuid
        self.name = name
        self.index = index
        self.update_period_s = update_period_s
        self.instant_period_s = instant_period_s
        self.clock = clock
        self.t0 = clock()
        self.energy_start_mj = energy_start_mj
        self.wrap_mj = wrap_mj
        self.counter_offset_mj = 0  # added to the published counter (a reset/jump)
        self.mig = mig
        self.unsupported = set(unsupported or ())
        self.power_limit_w = power_limit_w
        self.instant_scale = 1.0
        self.temp_c = 40
        self.mem_temp_c = 48
        self.sm_clock_mhz = 1980
        self.mem_clock_mhz = 3201
        self.util = (0, 0)
        self.reasons = 0x1
        self.violation_ns = {0: 0, 1: 0, 2: 0, 3: 0, 4: 0, 5: 0, 10: 0, 11: 0}
        self.calls: dict[str, int] = {}
        self._lock = threading.Lock()
        self._segments: list[tuple[float, float]] = [(self.t0, float(power_w))]

    # ---- physics --------------------------------------------------------------------
    def set_power(self, watts: float) -> None:
        with self._lock:
            if self._segments[-1][1] != watts:
                self._segments.append((self.clock(), float(watts)))

    def power_at(self, t: float) -> float:
        with self._lock:
            p = self._segments[0][1]
            for start, w in self._segments:
                if start > t:
                    break
                p = w
            return p

    def energy_j(self, t: float) -> float:
        """True energy drawn since creation up to time t."""
        with self._lock:
            total = 0.0
            segs = self._segments
            for k, (start, w) in enumerate(segs):
                end = segs[k + 1][0] if k + 1 < len(segs) else math.inf
                if start >= t:
                    break
                total += w * (min(end, t) - start)
            return total

    def _quantize(self, t: float, period: float) -> float:
        if period <= 0:
            return t
        return self.t0 + math.floor((t - self.t0) / period) * period

    def counter_mj(self) -> int:
        tq = self._quantize(self.clock(), self.update_period_s)
        value = self.energy_start_mj + int(round(1000.0 * self.energy_j(tq))) + self.counter_offset_mj
        if self.wrap_mj:
            value %= self.wrap_mj
        return value

    def instant_mw(self) -> int:
        tq = self._quantize(self.clock(), self.instant_period_s)
        return int(round(1000.0 * self.instant_scale * self.power_at(tq)))

    def average_mw(self) -> int:
        """Mean power over the last second, as published at the last update."""
        tq = self._quantize(self.clock(), self.update_period_s)
        a = max(self.t0, tq - 1.0)
        if tq <= a:
            return int(round(1000.0 * self.power_at(tq)))
        return int(round(1000.0 * (self.energy_j(tq) - self.energy_j(a)) / (tq - a)))


class FakeNvml:
    """Stands in for the pynvml module (only what flashwatt.telemetry calls)."""

    NVMLError = NVMLError

    def __init__(self, gpus: list[FakeGpu], *, init_error: type[Exception] | None = None):
        self.gpus = gpus
        self.init_error = init_error
        self.initialized = 0
        self.shutdowns = 0
        self.setter_calls: list[tuple[str, tuple]] = []  # every NVML setter or reset asked for, with its arguments

    def __getattr__(self, name: str):
        # A device setting (power limit, clocks, modes) is never changed by flashwatt: any such
        # function asked for is recorded (and does nothing), so a test can assert there was none.
        if name.startswith(("nvmlDeviceSet", "nvmlDeviceReset", "nvmlSystemSet")):
            return lambda *args: self.setter_calls.append((name, args))
        raise AttributeError(name)

    # ---- plumbing ---------------------------------------------------------------------
    @staticmethod
    def _use(gpu: FakeGpu, what: str) -> None:
        gpu.calls[what] = gpu.calls.get(what, 0) + 1
        if what in gpu.unsupported:
            raise NVMLError_NotSupported()

    def nvmlInit(self) -> None:
        if self.init_error is not None:
            raise self.init_error()
        self.initialized += 1

    def nvmlShutdown(self) -> None:
        self.shutdowns += 1

    def nvmlSystemGetDriverVersion(self) -> str:
        return "580.00.00"

    def nvmlSystemGetNVMLVersion(self) -> str:
        return "13.580.00"

    def nvmlDeviceGetCount(self) -> int:
        return len(self.gpus)

    def nvmlDeviceGetHandleByIndex(self, index: int) -> FakeGpu:
        for g in self.gpus:
            if g.index == index:
                return g
        raise pynvml.NVMLError_InvalidArgument()

    def nvmlDeviceGetHandleByUUID(self, uuid: str | bytes) -> FakeGpu:
        if isinstance(uuid, bytes):
            uuid = uuid.decode()
        for g in self.gpus:
            if g.uuid == uuid:  # NVML wants the exact "GPU-..." form
                return g
        raise NVMLError_NotFound()

    def nvmlDeviceGetUUID(self, h: FakeGpu) -> str:
        return h.uuid

    def nvmlDeviceGetName(self, h: FakeGpu) -> str:
        return h.name

    def nvmlDeviceGetIndex(self, h: FakeGpu) -> int:
        return h.index

    def nvmlDeviceGetPciInfo(self, h: FakeGpu):
        return SimpleNamespace(busId=f"00000000:{0x18 + h.index:02X}:00.0".encode())

    def nvmlDeviceGetCudaComputeCapability(self, h: FakeGpu):
        return (9, 0)

    def nvmlDeviceGetEnforcedPowerLimit(self, h: FakeGpu) -> int:
        return int(h.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementDefaultLimit(self, h: FakeGpu) -> int:
        return int(h.power_limit_w * 1000)

    def nvmlDeviceGetPowerManagementLimitConstraints(self, h: FakeGpu):
        return [200_000, int(h.power_limit_w * 1000)]

    def nvmlDeviceGetMigMode(self, h: FakeGpu):
        self._use(h, "nvmlDeviceGetMigMode")
        return [1 if h.mig else 0, 1 if h.mig else 0]

    def nvmlDeviceGetPersistenceMode(self, h: FakeGpu) -> int:
        return 1

    def nvmlDeviceGetMaxClockInfo(self, h: FakeGpu, kind: int) -> int:
        return 1980 if kind == 1 else 3201

    # ---- readings -----------------------------------------------------------------------
    def nvmlDeviceGetTotalEnergyConsumption(self, h: FakeGpu) -> int:
        self._use(h, "nvmlDeviceGetTotalEnergyConsumption")
        return h.counter_mj()

    def nvmlDeviceGetPowerUsage(self, h: FakeGpu) -> int:
        self._use(h, "nvmlDeviceGetPowerUsage")
        return h.average_mw()

    def nvmlDeviceGetFieldValues(self, h: FakeGpu, field_ids: list[int]):
        self._use(h, "nvmlDeviceGetFieldValues")
        out = []
        for fid in field_ids:
            ret, value = 0, SimpleNamespace(uiVal=0, dVal=0.0, ullVal=0)
            if f"field:{fid}" in h.unsupported:
                ret = pynvml.NVML_ERROR_NOT_SUPPORTED
            elif fid == 186:
                value.uiVal = h.instant_mw()
            elif fid == 185:
                value.uiVal = h.average_mw()
            elif fid == 82:
                value.uiVal = h.mem_temp_c
            else:
                ret = pynvml.NVML_ERROR_NOT_SUPPORTED
            out.append(SimpleNamespace(fieldId=fid, scopeId=0, nvmlReturn=ret,
                                       valueType=pynvml.NVML_VALUE_TYPE_UNSIGNED_INT, value=value))
        return out

    def nvmlDeviceGetTemperature(self, h: FakeGpu, sensor: int) -> int:
        self._use(h, "nvmlDeviceGetTemperature")
        return h.temp_c

    def nvmlDeviceGetClockInfo(self, h: FakeGpu, kind: int) -> int:
        self._use(h, "nvmlDeviceGetClockInfo")
        return h.sm_clock_mhz if kind == 1 else h.mem_clock_mhz

    def nvmlDeviceGetUtilizationRates(self, h: FakeGpu):
        self._use(h, "nvmlDeviceGetUtilizationRates")
        return SimpleNamespace(gpu=h.util[0], memory=h.util[1])

    def nvmlDeviceGetCurrentClocksEventReasons(self, h: FakeGpu) -> int:
        self._use(h, "nvmlDeviceGetCurrentClocksEventReasons")
        return h.reasons

    def nvmlDeviceGetViolationStatus(self, h: FakeGpu, policy: int):
        self._use(h, "nvmlDeviceGetViolationStatus")
        return SimpleNamespace(referenceTime=0, violationTime=h.violation_ns[policy])


def uuid_for(k: int) -> str:
    return f"GPU-{k:08x}-1111-2222-3333-444455556666"


class FakeLoad:
    """`call`/`sync` pair for measure_energy: each call sets the GPUs to `busy_w` and
    takes `call_s` of wall time; `sync` does nothing (the fake GPU has no queue)."""

    def __init__(self, gpus: list[FakeGpu], busy_w: float | list[float], call_s: float = 0.0005,
                 util: tuple[int, int] = (97, 41)):
        self.gpus = gpus
        self.util = util  # NVML's (SM, memory) utilisation while busy; 0 while idle
        self.busy_w = busy_w if isinstance(busy_w, list) else [busy_w] * len(gpus)
        self.call_s = call_s
        self.n = 0

    def call(self) -> None:
        if self.n == 0:
            for g, w in zip(self.gpus, self.busy_w):
                g.set_power(w)
                g.util = self.util
        self.n += 1
        end = time.perf_counter() + self.call_s
        while time.perf_counter() < end:
            pass

    def sync(self) -> None:
        pass
