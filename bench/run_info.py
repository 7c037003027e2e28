"""What every benchmark result records: the command, the commit, the machine and the date."""

from __future__ import annotations

import datetime
import json
import os
import platform
import shlex
import subprocess
import sys
from pathlib import Path

RESULTS = Path(__file__).resolve().parent / "results"


def _git(*args: str) -> str:
    try:
        return subprocess.check_output(["git", *args], cwd=RESULTS.parent, text=True,
                                       stderr=subprocess.DEVNULL).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


CPU_FLAGS = {"avx2", "avx512f", "avx512_bf16", "amx_bf16"}


def machine() -> dict:
    import torch

    cpu, flags = platform.processor(), set()
    try:
        lines = open("/proc/cpuinfo").read().splitlines()
        cpu = next(line.split(":", 1)[1].strip() for line in lines if line.startswith("model name"))
        flags = set(next(line.split(":", 1)[1].split() for line in lines if line.startswith("flags")))
    except (OSError, StopIteration):
        pass
    info = {"cpu": cpu, "cores": os.cpu_count(), "torch": torch.__version__, "python": platform.python_version()}
    # hosts of one CPU name differ in these, and with them in matmul speed and the draft dtype (bf16 or not)
    info["cpu_flags"] = sorted(flags & CPU_FLAGS)
    if torch.cuda.is_available():
        info["gpu"] = torch.cuda.get_device_name()
    return info


# environment that changes how fast a run is (threads); recorded when set
SPEED_ENV = ("OMP_NUM_THREADS", "MKL_NUM_THREADS", "OMP_WAIT_POLICY", "SGLANG_CPU_OMP_THREADS_BIND",
             "SGLANG_DOMINO_DRAFT_DTYPE", "SGLANG_DOMINO_GATE_TABLE")


def run_info() -> dict:
    commit = os.environ.get("SGLANG_DOMINO_COMMIT")  # a copy of the tree whose .git (if any) is not its own
    if not commit:
        commit = _git("rev-parse", "--short", "HEAD")
        if commit != "unknown" and _git("status", "--porcelain", "--untracked-files=no"):
            commit += "+dirty"
    return {
        "command": " ".join(shlex.quote(a) for a in [sys.executable.split("/")[-1], *sys.argv]),
        "commit": commit,
        "machine": machine(),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "env": {k: os.environ[k] for k in SPEED_ENV if k in os.environ},
    }


def write_result(name: str, payload: dict) -> Path:
    """Write ``bench/results/<name>.json`` with the run info first."""
    RESULTS.mkdir(parents=True, exist_ok=True)
    path = RESULTS / f"{name}.json"
    path.write_text(json.dumps({**run_info(), **payload}, indent=2) + "\n")
    return path
