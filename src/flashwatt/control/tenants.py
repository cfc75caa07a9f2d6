"""Co-located tenants: another process on the same GPU, which the controller does not control.

    tenant = Tenant("gemm", intensity=0.9, start_s=3.0, seconds=5.0)
    process = TenantProcess(tenant, "cuda:0")   # imports torch and warms up while we set up
    process.wait_ready()
    alone_w = process.calibrate(telemetry)      # its power alone, before the run
    process.schedule(t0)                        # its load from t0 + start_s, on the monotonic clock
    ...
    process.finish()

Kinds: `gemm`, bf16 matrix products (8192^2, compute-bound: most watts per busy second);
`copy`, device-to-device copies of 1 GiB (memory-bound). `intensity` is the share of the
time the tenant keeps the GPU busy: after each operation it sleeps (1 - intensity) /
intensity times as long as the operation took (1.0: back to back).

The process is started early and talks over its pipes (one line per message): it says
`ready` once torch is imported and its first operation ran; `load S` runs the load for S
seconds at once (the calibration: its power alone is read from the energy counter around
it); `run T S` runs it from monotonic time T for S seconds (the monotonic clock is
system-wide on Linux, so the seconds it spent starting do not delay the disturbance).
"""
from __future__ import annotations

import selectors
import subprocess
import sys
import time
from dataclasses import dataclass

TENANT_KINDS = ("gemm", "copy")
CALIBRATION_S = 1.0

_CHILD = r"""
import sys, time
import torch
kind, intensity, size, device = sys.argv[1], float(sys.argv[2]), int(sys.argv[3]), torch.device(sys.argv[4])
cuda = device.type == "cuda"
if cuda:
    torch.cuda.set_device(device)
if kind == "gemm":
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16 if cuda else torch.float32)
    op = lambda: a @ a
else:
    src = torch.empty(size, dtype=torch.uint8, device=device)
    dst = torch.empty_like(src)
    op = lambda: dst.copy_(src)
sync = torch.cuda.synchronize if cuda else (lambda: None)
op(); sync()
print("ready", flush=True)

def load(until):
    while time.monotonic() < until:
        t0 = time.perf_counter(); op(); sync(); busy = time.perf_counter() - t0
        if intensity < 1.0:
            time.sleep(busy * (1.0 - intensity) / intensity)

for line in sys.stdin:
    words = line.split()
    if not words or words[0] == "quit":
        break
    if words[0] == "load":
        load(time.monotonic() + float(words[1]))
        print("done", flush=True)
    elif words[0] == "run":
        begin, seconds = float(words[1]), float(words[2])
        time.sleep(max(0.0, begin - time.monotonic()))
        load(begin + seconds)
        print("done", flush=True)
        break
"""


@dataclass(frozen=True)
class Tenant:
    kind: str = "gemm"
    intensity: float = 0.3
    start_s: float = 0.0
    seconds: float = 7.0
    size: int | None = None  # gemm: matrix side; copy: bytes (defaults by kind)

    def __post_init__(self) -> None:
        if self.kind not in TENANT_KINDS:
            raise ValueError(f"tenant kind {self.kind!r}: allowed {', '.join(TENANT_KINDS)}")
        if not 0 < self.intensity <= 1:
            raise ValueError(f"tenant intensity {self.intensity!r}: a share of the time in (0, 1]")

    @property
    def operation_size(self) -> int:
        if self.size is not None:
            return self.size
        return 8192 if self.kind == "gemm" else 1 << 30

    @classmethod
    def from_spec(cls, spec: dict) -> "Tenant":
        return cls(spec["kind"], float(spec["intensity"]), float(spec["start_s"]), float(spec["seconds"]),
                   spec.get("size"))

    def as_spec(self) -> dict:
        return {"kind": self.kind, "intensity": self.intensity, "start_s": self.start_s, "seconds": self.seconds}


class TenantProcess:
    """One tenant's process (module docstring)."""

    def __init__(self, tenant: Tenant, device: str):
        self.tenant = tenant
        self.proc = subprocess.Popen(
            [sys.executable, "-c", _CHILD, tenant.kind, str(tenant.intensity), str(tenant.operation_size), device],
            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, bufsize=1)

    def _expect(self, word: str, timeout: float) -> None:
        selector = selectors.DefaultSelector()
        selector.register(self.proc.stdout, selectors.EVENT_READ)
        try:
            end = time.monotonic() + timeout
            while time.monotonic() < end:
                if not selector.select(timeout=max(0.0, end - time.monotonic())):
                    break
                line = self.proc.stdout.readline()
                if not line:
                    raise RuntimeError(f"tenant {self.tenant.kind} exited (status {self.proc.poll()}) "
                                       f"before saying {word!r}")
                if line.strip() == word:
                    return
            raise TimeoutError(f"tenant {self.tenant.kind} did not say {word!r} within {timeout:g} s")
        finally:
            selector.close()

    def _send(self, line: str) -> None:
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()

    def wait_ready(self, timeout: float = 180.0) -> None:
        self._expect("ready", timeout)

    def calibrate(self, telemetry, seconds: float = CALIBRATION_S) -> float | None:
        """Its average power alone over `seconds` of its load, from the energy counter (None
        without one)."""
        read = (lambda: (telemetry.energy_mj() or [None])[0]) if telemetry is not None else (lambda: None)
        e0, t0 = read(), time.monotonic()
        self._send(f"load {seconds}")
        self._expect("done", seconds + 60.0)
        e1, t1 = read(), time.monotonic()
        if e0 is None or e1 is None or t1 <= t0:
            return None
        return (e1 - e0) / 1e3 / (t1 - t0)

    def schedule(self, run_start: float) -> None:
        """Its load from `run_start + start_s` (monotonic clock) for its seconds."""
        self._send(f"run {run_start + self.tenant.start_s!r} {self.tenant.seconds!r}")

    def finish(self, timeout: float = 30.0) -> None:
        try:
            if self.proc.poll() is None and not self.proc.stdin.closed:
                try:
                    self._send("quit")
                except (BrokenPipeError, OSError):
                    pass
            self.proc.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        finally:
            for stream in (self.proc.stdin, self.proc.stdout):
                if stream is not None and not stream.closed:
                    try:
                        stream.close()
                    except (BrokenPipeError, OSError):
                        # Closing flushes what is buffered for a tenant that is gone (a run
                        # interrupted by SIGINT ends it too); raised here, it replaced the run's
                        # own outcome in the cell's record.
                        pass
