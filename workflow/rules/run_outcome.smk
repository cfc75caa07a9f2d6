# What a run says before its jobs start, and how it ends: the failed cells it measures
# again and the cells this host cannot run, up front; after every job has finished (the
# tables and figures made, nothing measured lost), exit status 3 when a cell of the suite
# failed, so that a run on a cluster (`snakemake --profile slurm`) that recorded only
# failures does not look like a success. `flashwatt run` builds the report on that status
# too, then exits 1 (flashwatt.cli).
import sys
from collections import Counter

from snakemake.logging import logger

from flashwatt.host_skips import notice


onstart:
    if FORCED_AGAIN:
        for cell in FORCED_AGAIN:  # before Snakemake removes the records it will write again
            failures.keep_before_rerun(cell.path)
        statuses = Counter(FORCED_AGAIN.values())
        logger.info(f"flashwatt: measuring {len(FORCED_AGAIN)} failed cell(s) of suite {SUITE} again ("
                    + ", ".join(f"{n} {s}" for s, n in sorted(statuses.items()))
                    + "; their earlier records are kept in <record>.failures.jsonl; --config retry_failed=false keeps them)")
    if REFUSED_HERE:
        logger.info(notice(len(REFUSED_HERE), len(suite_records(SUITE)), Host.here(), SUITE))


onsuccess:
    records = suite_records(SUITE)
    statuses = Counter(failures.status_on_disk(path) for path in records)
    failed = {s: n for s, n in statuses.items() if s is not None and failures.is_failure(s)}
    if failed:
        retried = failures.retried_statuses(config)
        logger.error(f"flashwatt: {sum(failed.values())} of {len(records)} cells of suite {SUITE} failed ("
                     + ", ".join(f"{n} {s}" for s, n in sorted(failed.items())) + "): `flashwatt failed` lists them, "
                     + ("the next run measures them again" if set(failed) <= retried else "each record says why")
                     + f"; exit status {failures.FAILED_CELLS_EXIT}")
        sys.exit(failures.FAILED_CELLS_EXIT)
