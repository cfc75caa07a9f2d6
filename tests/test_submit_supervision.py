"""The orphan watch of flashwatt.submit.supervision on real processes: a wait finds the
Snakemake above it and notices when that process is killed with SIGKILL."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap

from support import wait_until

from flashwatt.submit.supervision import first_gone, snakemake_ancestry

# Stands in for Snakemake (its command line names snakemake) and starts the watcher.
STANDIN = textwrap.dedent(
    """
    import subprocess, sys, time
    subprocess.Popen([sys.executable, "-c", sys.argv[1], sys.argv[2]])
    time.sleep(300)
    """
)
# Runs where run_job's wait runs: finds its Snakemake ancestry, then waits for it to end.
WATCHER = textwrap.dedent(
    """
    import json, sys, time
    from flashwatt.submit.supervision import first_gone, snakemake_ancestry
    chain = snakemake_ancestry()
    out = open(sys.argv[1], "a")
    out.write(json.dumps({"chain": [p.pid for p in chain]}) + "\\n"); out.flush()
    deadline = time.monotonic() + 60
    while first_gone(chain) is None and time.monotonic() < deadline:
        time.sleep(0.05)
    gone = first_gone(chain)
    out.write(json.dumps({"gone": gone.pid if gone else None}) + "\\n"); out.flush()
    """
)


def _lines(path) -> list[dict]:
    return [json.loads(line) for line in path.read_text().splitlines()] if path.exists() else []


def test_a_killed_snakemake_is_noticed_by_the_wait_below_it(tmp_path):
    report = tmp_path / "watcher.jsonl"
    standin = subprocess.Popen([sys.executable, "-c", STANDIN, WATCHER, str(report), "snakemake-standin"],
                               env=os.environ)
    try:
        first = wait_until(lambda: _lines(report), 30, "the watcher to find its ancestry")[0]
        assert first["chain"] == [standin.pid]
        standin.send_signal(signal.SIGKILL)
        # Not reaped yet: the stand-in is a zombie, which has ended all the same.
        lines = wait_until(lambda: _lines(report)[1:], 30, "the watcher to notice")
        assert lines[0]["gone"] == standin.pid
    finally:
        standin.kill()
        standin.wait()


def test_no_snakemake_above_means_nothing_to_watch():
    # pytest's ancestors are no Snakemake: a login shell ending must never cancel a job.
    assert snakemake_ancestry() == []
    assert first_gone([]) is None
