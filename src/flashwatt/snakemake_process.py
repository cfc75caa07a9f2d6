"""Snakemake run as a child of `flashwatt run`: its output relayed, an interrupt forwarded,
and what the interrupted processes print afterwards left out.

Snakemake runs in a session of its own, so a Ctrl-C reaches this process only; it is
forwarded to Snakemake's process group (Snakemake and its jobs, as a terminal would) and
then Snakemake is waited for: it cancels its jobs and removes its locks before it exits.
Killing it in the middle of that shutdown is what leaves stale locks.

Every process of that group answers an interrupt with its own traceback (Snakemake's
job scripts, submitit's controllers, the jobs, Snakemake's report of each failed job
with its log): about a hundred lines that say only "interrupted". So Snakemake's output
reaches the terminal through this process (through a pseudo-terminal where the output is
one, so colours stay), and from the interrupt on it is dropped: the run ends with one line
naming the signal and Snakemake's own log, which keeps its account of the shutdown.
"""
from __future__ import annotations

import os
import pty
import signal
import subprocess
import sys
import termios
import threading
from pathlib import Path
from typing import IO

FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)
# How long the relays may still drain once Snakemake has exited (a job process that
# outlives it, still holding the output open, must not hold up the exit).
DRAIN_S = 2.0


class _Relay:
    """Copies what a child writes to one of its outputs onto ours, until silenced."""

    def __init__(self, ours: IO[str]):
        self.ours = ours
        self.tty = ours.isatty()
        self.silenced = threading.Event()
        if self.tty:
            self.read_fd, self.child_fd = pty.openpty()
            # Pass newlines through as written: our own terminal turns them into line ends.
            attrs = termios.tcgetattr(self.child_fd)
            attrs[1] &= ~termios.ONLCR
            termios.tcsetattr(self.child_fd, termios.TCSANOW, attrs)
        else:
            self.read_fd, self.child_fd = os.pipe()
        self.thread = threading.Thread(target=self._copy, daemon=True)

    def _copy(self) -> None:
        target = self.ours.buffer if hasattr(self.ours, "buffer") else None
        while True:
            try:
                chunk = os.read(self.read_fd, 65536)
            except OSError:  # a pseudo-terminal whose every writer has closed it
                break
            if not chunk:
                break
            if self.silenced.is_set():
                continue
            if target is not None:
                target.write(chunk)
                target.flush()
            else:
                self.ours.write(chunk.decode(errors="replace"))
                self.ours.flush()

    def started(self) -> "_Relay":
        self.thread.start()
        return self

    def close_child_side(self) -> None:
        os.close(self.child_fd)

    def finish(self) -> None:
        self.thread.join(DRAIN_S)
        if not self.thread.is_alive():
            os.close(self.read_fd)


def latest_log(workdir: Path = Path(".")) -> Path | None:
    """The log file of Snakemake's latest run in `workdir`."""
    logs = sorted((workdir / ".snakemake" / "log").glob("*.snakemake.log"), key=lambda p: p.stat().st_mtime)
    return logs[-1] if logs else None


def run_snakemake(args: list[str]) -> int:
    """Run `snakemake args`, wait for it also when interrupted; its exit status, or 128 +
    the signal when this process was interrupted."""
    sys.stdout.flush()
    sys.stderr.flush()
    out, err = _Relay(sys.stdout), _Relay(sys.stderr)
    proc = subprocess.Popen([sys.executable, "-m", "snakemake", *args], start_new_session=True,
                            stdout=out.child_fd, stderr=err.child_fd)
    for relay in (out, err):
        relay.close_child_side()
        relay.started()
    received: list[int] = []

    def forward(signum, _frame):
        received.append(signum)
        out.silenced.set()
        err.silenced.set()
        try:
            os.killpg(proc.pid, signum)
        except ProcessLookupError:
            pass

    previous = {s: signal.signal(s, forward) for s in FORWARDED}
    try:
        status = proc.wait()  # PEP 475: the wait resumes after each forwarded signal
    finally:
        for s, handler in previous.items():
            signal.signal(s, handler)
        out.finish()
        err.finish()
    if received:
        log = latest_log()
        print(f"flashwatt: interrupted ({signal.Signals(received[0]).name}); Snakemake stopped its jobs and "
              f"released its lock" + (f" (its account: {log})" if log else ""), file=sys.stderr, flush=True)
        return 128 + received[0]
    return status
