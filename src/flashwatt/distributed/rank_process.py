"""One rank of a cell: the process the rank supervisor starts for each GPU (CPU process).

    python -m flashwatt.distributed.rank_process CALL_FILE OUT_DIR

CALL_FILE holds ("package.module:function", args), pickled; the function runs with the
rank, world size and rendezvous in the environment (RANK, WORLD_SIZE, LOCAL_RANK,
MASTER_ADDR, MASTER_PORT: flashwatt.distributed.rendezvous reads them). Its return value,
when not None (rank 0's result), is pickled to OUT_DIR/rank<R>.result.pkl.

An exception is written twice: to TORCHELASTIC_ERROR_FILE through PyTorch's ErrorHandler
(what torchrun's tooling reads), and to OUT_DIR/rank<R>.failure.json with what the cell's
record needs (exception type, message, traceback, whether it was an out-of-memory error,
the stage the rank was in where the function names it as `err.flashwatt_stage`). The
process then ends at once with os._exit(1): no interpreter teardown, so no process-group
destructor can wait on peers that will never answer, and the supervisor sees the failure
the moment it happens. A rank that succeeds ends with os._exit(0) for the same reason.

A fatal signal (SIGABRT from PyTorch's NCCL watchdog, SIGSEGV) first prints every thread's
Python stack to stderr (faulthandler), which the cell's log receives: a rank ended because
its peer stopped answering shows where that peer's Python was.

The process dies with its parent: PR_SET_PDEATHSIG sends it SIGKILL when the supervisor
that started it dies, even by SIGKILL, so a rank never outlives its cell.
"""
from __future__ import annotations

import ctypes
import faulthandler
import importlib
import json
import os
import pickle
import signal
import sys
import time
import traceback
from pathlib import Path

PR_SET_PDEATHSIG = 1
ENV_SUPERVISOR_PID = "FLASHWATT_SUPERVISOR_PID"
EXIT_RAISED = 1


def die_with_parent() -> None:
    """SIGKILL this process when its parent dies (Linux); exit now if it is already gone."""
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL, 0, 0, 0)
    except (OSError, AttributeError):  # not Linux: the supervisor's teardown still applies
        return
    expected = os.environ.get(ENV_SUPERVISOR_PID)
    if expected and os.getppid() != int(expected):  # the parent died before prctl took effect
        os._exit(EXIT_RAISED)


def result_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.result.pkl"


def failure_path(out_dir: str | Path, rank: int) -> Path:
    return Path(out_dir) / f"rank{rank}.failure.json"


def _write_atomically(path: Path, data: bytes) -> None:
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_bytes(data)
    os.replace(tmp, path)


def _record_failure(err: BaseException, out_dir: str, rank: int) -> None:
    from torch.distributed.elastic.multiprocessing.errors import ErrorHandler

    from flashwatt.measure import is_oom

    try:
        ErrorHandler().record_exception(err)
    except OSError:
        pass  # no error file for PyTorch's tooling; ours below is what the record reads
    failure = {"rank": rank, "pid": os.getpid(), "exception": type(err).__name__,
               "module": type(err).__module__, "message": str(err).strip(), "oom": is_oom(err),
               "stage": getattr(err, "flashwatt_stage", None), "traceback": traceback.format_exc(),
               "time": time.time()}
    _write_atomically(failure_path(out_dir, rank), json.dumps(failure, default=str).encode())


def _flush_and_exit(code: int) -> None:
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(code)


def main(argv: list[str]) -> None:
    die_with_parent()
    faulthandler.enable(all_threads=True)
    call_file, out_dir = argv
    rank = int(os.environ.get("RANK", "0"))
    try:
        with open(call_file, "rb") as fh:
            target, args = pickle.load(fh)
        module, _, name = target.partition(":")
        value = getattr(importlib.import_module(module), name)(*args)
        if value is not None:
            _write_atomically(result_path(out_dir, rank), pickle.dumps(value))
    except BaseException as err:  # an interrupt too: the supervisor must see this rank end badly
        _record_failure(err, out_dir, rank)
        traceback.print_exc()
        _flush_and_exit(EXIT_RAISED)
    _flush_and_exit(0)


if __name__ == "__main__":
    main(sys.argv[1:])
