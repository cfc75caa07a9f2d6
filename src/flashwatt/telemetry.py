"""GPU telemetry through NVML: identity, energy counter, power, temperatures, clocks.

This is the only module in flashwatt that imports `pynvml` (package nvidia-ml-py).
Everything else talks to the small `Telemetry` interface below, which has two
implementations:

- `NvmlTelemetry`: real readings for a fixed list of GPUs, chosen by UUID. NVML
  enumerates GPUs in its own order and ignores CUDA_VISIBLE_DEVICES, so GPUs are
  always matched by UUID, never by index.
- `NullTelemetry`: no GPU, no NVML library, NVML init failed or was refused. Every
  reading is empty and `reason` says why. Nothing here raises for a missing NVML.

Facts the readings rest on (docs/measurement.md, with sources):

- power (`nvmlDeviceGetPowerUsage`, a 1 s average on Ampere and newer), instant power
  (field 186), average power (field 185) and the energy counter
  (`nvmlDeviceGetTotalEnergyConsumption`, mJ) all update every ~100 ms;
- under MIG every power and energy reading covers the whole GPU, shared with
  whatever else runs on the other slices.

Any single NVML query that a device does not support gives `None` for that field;
the field's name and NVML's error are kept in `unsupported` (per GPU) so a report
can say which readings were missing instead of silently showing blanks.
"""
from __future__ import annotations

import threading
import time
from typing import Any, Callable, Iterable

# NVML constants, fixed by the NVML ABI (nvml.h); kept here so a fake NVML module in
# tests does not have to define them.
FI_DEV_MEMORY_TEMP = 82
FI_DEV_POWER_AVERAGE = 185
FI_DEV_POWER_INSTANT = 186
_TEMPERATURE_GPU = 0
_CLOCK_SM = 1
_CLOCK_MEM = 2
_SAMPLE_FIELDS = (FI_DEV_POWER_INSTANT, FI_DEV_POWER_AVERAGE, FI_DEV_MEMORY_TEMP)
# c_nvmlValue_t member to read, by nvmlValueType_t
_VALUE_MEMBER = {0: "dVal", 1: "uiVal", 2: "ulVal", 3: "ullVal", 4: "sllVal", 5: "siVal", 6: "usVal"}

CLOCK_REASONS = (
    (0x1, "GpuIdle"),
    (0x2, "ApplicationsClocksSetting"),
    (0x4, "SwPowerCap"),
    (0x8, "HwSlowdown"),
    (0x10, "SyncBoost"),
    (0x20, "SwThermalSlowdown"),
    (0x40, "HwThermalSlowdown"),
    (0x80, "HwPowerBrakeSlowdown"),
    (0x100, "DisplayClockSetting"),
)
THERMAL_REASONS = frozenset({"SwThermalSlowdown", "HwThermalSlowdown"})
POWER_REASONS = frozenset({"SwPowerCap"})
HW_SLOWDOWN_REASONS = frozenset({"HwSlowdown", "HwPowerBrakeSlowdown"})

# nvmlPerfPolicyType_t, for nvmlDeviceGetViolationStatus
VIOLATION_POLICIES = (
    (0, "power"),
    (1, "thermal"),
    (2, "sync_boost"),
    (3, "board_limit"),
    (4, "low_utilization"),
    (5, "reliability"),
    (10, "total_app_clocks"),
    (11, "total_base_clocks"),
)

MIG_WARNING = (
    "MIG is enabled: NVML power and energy are whole-GPU readings, shared with every "
    "other tenant of this GPU; they are not the energy of this MIG slice"
)

# Errors that mean "this device or driver cannot answer this query", remembered so the
# query is not repeated every sample. Anything else (a timeout, a lost GPU) gives None
# for that one reading only.
_PERMANENT_ERRORS = frozenset({
    "NVMLError_NotSupported",
    "NVMLError_FunctionNotFound",
    "NVMLError_NoPermission",
    "NVMLError_InvalidArgument",
})

_INIT_REASONS = {
    "NVMLError_LibraryNotFound": "NVML library not found",
    "NVMLError_DriverNotLoaded": "NVIDIA driver not loaded",
    "NVMLError_NoPermission": "NVML permission denied",
    "NVMLError_LibRmVersionMismatch": "NVML/driver version mismatch",
}


def decode_clock_reasons(mask: int | None) -> list[str]:
    """Names of the clock event reason bits set in `mask` (unknown bits as hex)."""
    if mask is None:
        return []
    mask = int(mask)
    names = [name for bit, name in CLOCK_REASONS if mask & bit]
    rest = mask & ~sum(bit for bit, _ in CLOCK_REASONS)
    if rest:
        names.append(f"0x{rest:x}")
    return names


def normalize_uuid(uuid: str | bytes) -> str:
    """Lower-case UUID without the "GPU-"/"MIG-" prefix, for comparisons."""
    if isinstance(uuid, bytes):
        uuid = uuid.decode()
    uuid = uuid.strip()
    for prefix in ("GPU-", "MIG-", "gpu-", "mig-"):
        if uuid.startswith(prefix):
            uuid = uuid[len(prefix):]
            break
    return uuid.lower()


def _text(value: Any) -> Any:
    return value.decode(errors="replace") if isinstance(value, bytes) else value


def _mw_to_w(value: Any) -> float | None:
    return None if value is None else float(value) / 1000.0


class Telemetry:
    """Interface shared by the real and the null backend."""

    available: bool = False
    reason: str | None = None
    devices: list[dict] = []

    def identity(self) -> list[dict]:
        raise NotImplementedError

    def energy_mj(self) -> list[int | None]:
        raise NotImplementedError

    def sample(self) -> list[dict]:
        raise NotImplementedError

    def violation_ns(self) -> list[dict[str, int | None]]:
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError

    def __enter__(self) -> "Telemetry":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class NullTelemetry(Telemetry):
    """No telemetry: every reading is empty, `reason` says why."""

    def __init__(self, reason: str):
        self.available = False
        self.reason = reason
        self.devices = []
        self.unsupported: list[dict[str, str]] = []

    def identity(self) -> list[dict]:
        return []

    def energy_mj(self) -> list[int | None]:
        return []

    def sample(self) -> list[dict]:
        return []

    def violation_ns(self) -> list[dict[str, int | None]]:
        return []

    def close(self) -> None:
        pass

    def __repr__(self) -> str:
        return f"NullTelemetry({self.reason!r})"


class NvmlTelemetry(Telemetry):
    """Readings from NVML for a fixed list of GPU handles (one per owned GPU)."""

    def __init__(self, nvml: Any, handles: list[Any], mig_flags: list[bool] | None = None,
                 clock: Callable[[], float] = time.monotonic):
        self._nvml = nvml
        self._handles = list(handles)
        self._clock = clock
        self._closed = False
        self.available = True
        self.reason = None
        self.unsupported: list[dict[str, str]] = [{} for _ in self._handles]
        self._mig_from_uuid = list(mig_flags) if mig_flags else [False] * len(self._handles)
        self.devices = [self._identify(i) for i in range(len(self._handles))]
        # one probe so `unsupported` is known before the first window
        self.sample()
        for dev, unsup in zip(self.devices, self.unsupported):
            dev["energy_counter_supported"] = "energy_mj" not in unsup
            dev["instant_power_supported"] = "power_instant_w" not in unsup

    # ---- safe NVML access ----------------------------------------------------------
    def _q(self, gpu: int, key: str, fn_name: str, *args: Any) -> Any:
        """Call nvml.<fn_name>(*args); None (and remembered) if unsupported."""
        unsup = self.unsupported[gpu]
        if key in unsup:
            return None
        fn = getattr(self._nvml, fn_name, None)
        if fn is None:
            unsup[key] = f"{fn_name} not in this NVML binding"
            return None
        try:
            return fn(*args)
        except self._nvml.NVMLError as err:
            if type(err).__name__ in _PERMANENT_ERRORS:
                unsup[key] = f"{fn_name}: {err}"
            return None

    def _fields(self, gpu: int, field_ids: Iterable[int]) -> dict[int, Any]:
        """Field values by id; None for each field NVML could not return."""
        field_ids = list(field_ids)
        out: dict[int, Any] = {f: None for f in field_ids}
        wanted = [f for f in field_ids if f"field_{f}" not in self.unsupported[gpu]]
        if not wanted or "field_values" in self.unsupported[gpu]:
            return out
        values = self._q(gpu, "field_values", "nvmlDeviceGetFieldValues", self._handles[gpu], wanted)
        if values is None:
            return out
        for fid, val in zip(wanted, values):
            ret = getattr(val, "nvmlReturn", 0)
            if ret != 0:
                if ret in (3, 2):  # NVML_ERROR_NOT_SUPPORTED, NVML_ERROR_INVALID_ARGUMENT
                    self.unsupported[gpu][f"field_{fid}"] = f"field {fid}: NVML return code {ret}"
                continue
            member = _VALUE_MEMBER.get(int(getattr(val, "valueType", 1)), "uiVal")
            out[fid] = getattr(val.value, member)
        return out

    # ---- identity ------------------------------------------------------------------
    def _identify(self, i: int) -> dict:
        h = self._handles[i]
        q = self._q
        pci = q(i, "pci", "nvmlDeviceGetPciInfo", h)
        cc = q(i, "compute_capability", "nvmlDeviceGetCudaComputeCapability", h)
        constraints = q(i, "power_limit_constraints", "nvmlDeviceGetPowerManagementLimitConstraints", h)
        mig = q(i, "mig_mode", "nvmlDeviceGetMigMode", h)
        mig_current = None if mig is None else int(mig[0])
        mig_pending = None if mig is None else int(mig[1])
        mig_enabled = bool(mig_current) or self._mig_from_uuid[i]
        uuid = _text(q(i, "uuid", "nvmlDeviceGetUUID", h))
        persistence = q(i, "persistence_mode", "nvmlDeviceGetPersistenceMode", h)
        return {
            "gpu": i,
            "name": _text(q(i, "name", "nvmlDeviceGetName", h)),
            "uuid": uuid,
            "nvml_index": q(i, "nvml_index", "nvmlDeviceGetIndex", h),
            "pci_bus_id": None if pci is None else _text(getattr(pci, "busId", None)),
            "compute_capability": None if cc is None else f"{cc[0]}.{cc[1]}",
            "driver_version": _text(q(i, "driver_version", "nvmlSystemGetDriverVersion")),
            "nvml_version": _text(q(i, "nvml_version", "nvmlSystemGetNVMLVersion")),
            "power_limit_enforced_w": _mw_to_w(q(i, "power_limit_enforced", "nvmlDeviceGetEnforcedPowerLimit", h)),
            "power_limit_default_w": _mw_to_w(q(i, "power_limit_default", "nvmlDeviceGetPowerManagementDefaultLimit", h)),
            "power_limit_min_w": None if constraints is None else _mw_to_w(constraints[0]),
            "power_limit_max_w": None if constraints is None else _mw_to_w(constraints[1]),
            "mig_mode_current": mig_current,
            "mig_mode_pending": mig_pending,
            "mig_enabled": mig_enabled,
            "mig_warning": MIG_WARNING if mig_enabled else None,
            "persistence_mode": None if persistence is None else bool(persistence),
            "max_sm_clock_mhz": q(i, "max_sm_clock", "nvmlDeviceGetMaxClockInfo", h, _CLOCK_SM),
            "max_mem_clock_mhz": q(i, "max_mem_clock", "nvmlDeviceGetMaxClockInfo", h, _CLOCK_MEM),
        }

    def identity(self) -> list[dict]:
        out = []
        for dev, unsup in zip(self.devices, self.unsupported):
            row = dict(dev)
            row["unsupported"] = sorted(unsup)
            out.append(row)
        return out

    # ---- readings ------------------------------------------------------------------
    def energy_mj(self) -> list[int | None]:
        return [self._q(i, "energy_mj", "nvmlDeviceGetTotalEnergyConsumption", h)
                for i, h in enumerate(self._handles)]

    def sample(self) -> list[dict]:
        """One reading per GPU. `t` is taken just before each GPU's power read."""
        rows = []
        for i, h in enumerate(self._handles):
            t = self._clock()
            f = self._fields(i, _SAMPLE_FIELDS)
            instant = f[FI_DEV_POWER_INSTANT]
            average = f[FI_DEV_POWER_AVERAGE]
            fallback = False
            if instant is None or average is None:
                usage = self._q(i, "power_usage", "nvmlDeviceGetPowerUsage", h)
                if instant is None and usage is not None:
                    instant, fallback = usage, True
                if average is None:
                    average = usage
            energy = self._q(i, "energy_mj", "nvmlDeviceGetTotalEnergyConsumption", h)
            util = self._q(i, "utilization", "nvmlDeviceGetUtilizationRates", h)
            reasons = self._q(i, "clock_reasons", "nvmlDeviceGetCurrentClocksEventReasons", h)
            if reasons is None and "clock_reasons" in self.unsupported[i]:
                reasons = self._q(i, "clock_reasons_legacy", "nvmlDeviceGetCurrentClocksThrottleReasons", h)
            rows.append({
                "gpu": i,
                "t": t,
                "power_instant_w": _mw_to_w(instant),
                "power_instant_fallback": fallback,
                "power_average_w": _mw_to_w(average),
                "energy_mj": energy,
                "gpu_temp_c": self._q(i, "gpu_temp_c", "nvmlDeviceGetTemperature", h, _TEMPERATURE_GPU),
                "mem_temp_c": f[FI_DEV_MEMORY_TEMP],
                "sm_clock_mhz": self._q(i, "sm_clock_mhz", "nvmlDeviceGetClockInfo", h, _CLOCK_SM),
                "mem_clock_mhz": self._q(i, "mem_clock_mhz", "nvmlDeviceGetClockInfo", h, _CLOCK_MEM),
                "gpu_util_pct": None if util is None else util.gpu,
                "mem_util_pct": None if util is None else util.memory,
                "clock_reasons": None if reasons is None else int(reasons),
            })
        # names for the unsupported-field report, as the row keys read
        for i, unsup in enumerate(self.unsupported):
            for fid, key in ((FI_DEV_POWER_INSTANT, "power_instant_w"), (FI_DEV_POWER_AVERAGE, "power_average_w"),
                             (FI_DEV_MEMORY_TEMP, "mem_temp_c")):
                if f"field_{fid}" in unsup and key not in unsup:
                    unsup[key] = unsup[f"field_{fid}"]
        return rows

    def violation_ns(self) -> list[dict[str, int | None]]:
        """Cumulative time (ns) each performance policy held clocks down, per GPU."""
        out = []
        for i, h in enumerate(self._handles):
            row: dict[str, int | None] = {}
            for policy, name in VIOLATION_POLICIES:
                v = self._q(i, f"violation_{name}", "nvmlDeviceGetViolationStatus", h, policy)
                row[name] = None if v is None else int(v.violationTime)
            out.append(row)
        return out

    def close(self) -> None:
        if self._closed:
            return
        self._closed = True
        try:
            self._nvml.nvmlShutdown()
        except Exception:  # noqa: BLE001 - closing must never fail a measurement
            pass

    def __repr__(self) -> str:
        names = ", ".join(f"{d['name']} ({d['uuid']})" for d in self.devices)
        return f"NvmlTelemetry([{names}])"


def _init_reason(err: BaseException) -> str:
    prefix = _INIT_REASONS.get(type(err).__name__, "NVML init failed")
    return f"{prefix}: {type(err).__name__}: {err}"


def _handle_for_uuid(nvml: Any, uuid: str) -> tuple[Any, bool] | None:
    """(whole-GPU handle, is MIG) for a UUID as torch or nvidia-smi writes it."""
    want = normalize_uuid(uuid)
    is_mig = uuid.strip().upper().startswith("MIG-")
    candidates = [uuid.strip()] if uuid.strip()[:4].upper() in ("GPU-", "MIG-") else []
    candidates += [f"GPU-{want}", f"MIG-{want}"]
    for cand in candidates:
        try:
            handle = nvml.nvmlDeviceGetHandleByUUID(cand)
        except nvml.NVMLError:
            continue
        if cand.upper().startswith("MIG-"):
            parent = nvml.nvmlDeviceGetDeviceHandleFromMigDeviceHandle(handle)
            return parent, True
        return handle, is_mig
    # Walk every GPU (and its MIG devices): some UUID forms are not accepted above.
    for index in range(nvml.nvmlDeviceGetCount()):
        handle = nvml.nvmlDeviceGetHandleByIndex(index)
        try:
            if normalize_uuid(nvml.nvmlDeviceGetUUID(handle)) == want:
                return handle, False
        except nvml.NVMLError:
            continue
        try:
            n_mig = nvml.nvmlDeviceGetMaxMigDeviceCount(handle)
        except (nvml.NVMLError, AttributeError):
            continue
        for j in range(n_mig):
            try:
                mig = nvml.nvmlDeviceGetMigDeviceHandleByIndex(handle, j)
                if normalize_uuid(nvml.nvmlDeviceGetUUID(mig)) == want:
                    return handle, True
            except nvml.NVMLError:
                continue
    return None


def open_telemetry(cuda_uuids: list[str] | None, *, nvml: Any = None,
                   clock: Callable[[], float] = time.monotonic) -> Telemetry:
    """Telemetry for the GPUs with these UUIDs (all NVML GPUs when None).

    UUIDs may carry the "GPU-"/"MIG-" prefix or not (torch's
    `get_device_properties(i).uuid` has none). A MIG UUID selects its parent GPU,
    flagged MIG. `nvml` replaces the pynvml module (tests inject a fake one).
    Returns `NullTelemetry(reason)` instead of raising when NVML cannot be used.
    """
    if nvml is None:
        try:
            import pynvml as nvml  # the one import of pynvml in flashwatt
        except ImportError as err:
            return NullTelemetry(f"NVML Python binding (nvidia-ml-py) not installed: {err}")
    try:
        nvml.nvmlInit()
    except nvml.NVMLError as err:
        return NullTelemetry(_init_reason(err))
    except OSError as err:
        return NullTelemetry(f"NVML library not found: {err}")
    try:
        count = nvml.nvmlDeviceGetCount()
        if count == 0:
            raise LookupError("no NVIDIA GPU visible to NVML")
        handles: list[Any] = []
        migs: list[bool] = []
        seen: set[str] = set()
        if cuda_uuids is None:
            for index in range(count):
                handles.append(nvml.nvmlDeviceGetHandleByIndex(index))
                migs.append(False)
        else:
            if not cuda_uuids:
                raise LookupError("no GPU UUIDs given")
            for uuid in cuda_uuids:
                found = _handle_for_uuid(nvml, str(uuid))
                if found is None:
                    raise LookupError(f"GPU UUID {uuid!r} not found among the {count} GPUs NVML sees")
                handle, is_mig = found
                key = normalize_uuid(nvml.nvmlDeviceGetUUID(handle))
                if key in seen:  # two MIG slices of one GPU: one whole-GPU reading
                    continue
                seen.add(key)
                handles.append(handle)
                migs.append(is_mig)
        return NvmlTelemetry(nvml, handles, migs, clock=clock)
    except LookupError as err:
        _shutdown(nvml)
        return NullTelemetry(str(err))
    except nvml.NVMLError as err:
        _shutdown(nvml)
        return NullTelemetry(_init_reason(err))


def _shutdown(nvml: Any) -> None:
    try:
        nvml.nvmlShutdown()
    except Exception:  # noqa: BLE001
        pass


class Sampler:
    """Background thread that records `telemetry.sample()` every `period_s`.

    Default 100 ms, NVML's own update period: sampling faster only repeats values.
    One sample is taken as the thread starts and one as it stops, so the rows
    cover [start(), stop()] at both ends. Each row is the flat dict `sample()`
    returns (with its `gpu` column) plus `sample`, the round number.
    """

    def __init__(self, telemetry: Telemetry, period_s: float = 0.1):
        if period_s <= 0:
            raise ValueError(f"period_s={period_s}: must be positive")
        self.telemetry = telemetry
        self.period_s = float(period_s)
        self.rows: list[dict] = []
        self.error: BaseException | None = None
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def start(self) -> "Sampler":
        if self._thread is not None:
            raise RuntimeError("Sampler already started")
        self._stop.clear()
        if self.telemetry.available:
            self._thread = threading.Thread(target=self._run, name="flashwatt-sampler", daemon=True)
            self._thread.start()
        return self

    def _take(self, round_: int) -> None:
        for row in self.telemetry.sample():
            row["sample"] = round_
            self.rows.append(row)

    def _run(self) -> None:
        round_ = 0
        wait = self._stop.wait
        now = time.monotonic
        try:
            next_t = now()
            while True:
                self._take(round_)
                round_ += 1
                next_t += self.period_s
                delay = next_t - now()
                if delay < 0:  # fell behind (slow NVML): skip, don't burst
                    next_t = now()
                    delay = 0.0
                if wait(delay):
                    break
            self._take(round_)
        except Exception as err:  # noqa: BLE001 - surfaced through .error
            self.error = err

    def stop(self) -> list[dict]:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout=max(5.0, 10 * self.period_s))
        return self.rows

    @property
    def running(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    def __enter__(self) -> "Sampler":
        return self.start()

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def to_frame(self):
        import pandas as pd

        return pd.DataFrame(self.rows)
