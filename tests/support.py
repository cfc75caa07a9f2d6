"""Helpers shared by the test folders (on sys.path through pytest's `pythonpath`)."""
from __future__ import annotations

import os
import random
import shutil
import socket
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
WORKFLOW_FILES = ["Snakefile", "workflow", "config", "scripts", "profiles", "envs", "kernels", "slurm"]


def copy_workflow(dest: Path) -> Path:
    """The files a user runs Snakemake with, copied into `dest` (./slurm stays a link)."""
    for name in WORKFLOW_FILES:
        src = REPO / name
        if src.is_symlink():
            (dest / name).symlink_to(src.readlink())
        elif src.is_dir():
            shutil.copytree(src, dest / name, symlinks=True)
        elif src.exists():
            shutil.copy2(src, dest / name)
    return dest


def find_nvcc() -> str | None:
    """nvcc where torch's extension builder looks for it too: PATH, $CUDA_HOME/bin, /usr/local/cuda/bin."""
    cuda_home = os.environ.get("CUDA_HOME") or os.environ.get("CUDA_PATH")
    for candidate in (shutil.which("nvcc"), cuda_home and f"{cuda_home}/bin/nvcc", "/usr/local/cuda/bin/nvcc"):
        if candidate and Path(candidate).is_file():
            return candidate
    return None


def wait_until(predicate, timeout: float, what: str, step: float = 0.2):
    """Poll `predicate` until it returns something truthy; fail naming `what` after `timeout`."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(step)
    raise AssertionError(f"timed out after {timeout:.0f} s waiting for {what}")


# Lines for the CI log (job ids, states), printed in the terminal summary by
# tests/slurm/conftest.py: pytest captures what tests print, CI must still show these.
CI_LINES: list[str] = []


def ci_log(line: str) -> None:
    CI_LINES.append(line)


def synthetic_corpus(folder: Path, documents: int = 400, seed: int = 0) -> Path:
    """A plain-text corpus with structure a small model learns in a few dozen steps
    (sentences from a tiny grammar), fixed by `seed`: training tests must not depend on
    the text of a file that changes with the project."""
    import random

    rng = random.Random(seed)
    subjects = ["the cat", "a dog", "the old man", "my sister", "the kernel", "a student", "the GPU"]
    verbs = ["sees", "likes", "reads", "computes", "holds", "writes", "measures"]
    objects = ["the mat", "a book", "the power", "an answer", "the softmax", "a tile", "the budget"]
    folder.mkdir(parents=True, exist_ok=True)
    paragraphs = []
    for _ in range(documents):
        sentences = [f"{rng.choice(subjects)} {rng.choice(verbs)} {rng.choice(objects)}." for _ in range(rng.randint(3, 8))]
        paragraphs.append(" ".join(s.capitalize() for s in sentences))
    path = folder / "corpus.txt"
    path.write_text("\n\n".join(paragraphs) + "\n")
    return path


def _ephemeral_range() -> tuple[int, int]:
    try:
        low, high = Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()
        return int(low), int(high)
    except (OSError, ValueError):
        return 32768, 60999  # Linux's default


def free_ports(n: int = 1) -> list[int]:
    """n distinct free TCP ports on the loopback, for process groups started by a test, each
    with the port after it free too (a cell's node supervisors listen there). Drawn below the
    kernel's ephemeral range: a port from inside it can be handed to another test's outgoing
    connection (a rank's TCPStore client) before the process group listens on it, which
    ended a two-node test in EADDRINUSE while other tests ran beside it."""
    low = min(_ephemeral_range()[0], 32768)
    rng = random.Random(os.getpid() ^ time.monotonic_ns())
    ports: list[int] = []
    while len(ports) < n:
        port = rng.randrange(10000, low - 1)
        if any(abs(port - p) <= 1 for p in ports):
            continue
        socks = []
        try:
            for candidate in (port, port + 1):
                sock = socket.socket()
                socks.append(sock)
                sock.bind(("127.0.0.1", candidate))
        except OSError:
            continue
        finally:
            for sock in socks:
                sock.close()
        ports.append(port)
    return ports


def model_cell_spec(name: str = "llama_tiny", **steps) -> dict:
    """A model cell's job spec for a quick CPU run: one warm-up step, two timed, energy off;
    `steps` adds to or overrides the steps."""
    from flashwatt.models.presets import model_spec

    return {"model": model_spec(name), "seed": 0, "steps": {"warmup_steps": 1, "timed_steps": 2, **steps},
            "measure": {"energy": False}}
