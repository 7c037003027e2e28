"""Relabelled data: ShareGPT's own answers, each position labelled with the target's greedy next token.

``gen-data`` makes the target write every response (~55 response tokens/s on 2 CPU cores). This makes
data ~5x faster (~290 response tokens/s) from one teacher-forced target forward per conversation: the
sequence is the prompt and ShareGPT's first answer, ``labels[t]`` is the target's argmax after
``x_0 .. x_t``, and the same forward fills the feature cache that training reads.

``later_turns`` takes every later exchange instead: the prompt is the whole conversation before that human
turn (earlier answers as ShareGPT wrote them), the answer is the one to it; a record gives several examples.

The labels keep the objective exact. A block anchored at ``a`` must predict the target's greedy chain from
``x_0 .. x_a``; its i-th label ``labels[a+i]`` is that chain's i-th token as long as ``x_{a+1} .. x_{a+i}``
are the chain's earlier tokens (``x_{a+j} == labels[a+j-1]``), and ``anchors.build_blocks`` ignores every
position after the answer first leaves the chain. Position 1 is always exact; later positions count
where the human-written answer happens to follow the target.

Examples have the ``gen-data`` layout plus ``labels`` (int32, one per token), written in resumable shards.
The chosen exchanges are saved first (``exchanges.pt``), so a rerun resumes the same selection and loads
the target only for missing shards. ``exclude`` skips questions already answered in other data folders
(training uses a prompt once, so relabelling them again would be wasted).
"""

from __future__ import annotations

import random
import time
from dataclasses import dataclass, field
from pathlib import Path

import torch

from .data import (atomic_save, close_dataset, eos_token_ids, iter_sharegpt_records, load_examples, open_dataset,
                   prompt_key, settings_key, shard_path, sharegpt_path)

EXCHANGES = "exchanges.pt"


@dataclass
class RelabelConfig:
    target: str
    num_conversations: int = 4000
    max_prompt_tokens: int = 256
    max_response_tokens: int = 384
    shard_size: int = 32
    seed: int = 0
    dtype: str = "float32"
    exclude: list[str] = field(default_factory=list)  # data folders whose questions are skipped
    later_turns: bool = False  # every exchange after the first, with the conversation before it as prompt

    def key(self) -> dict:
        key = settings_key(self, "shard_size", "exclude", "later_turns")
        if self.exclude:  # absent when empty/False: folders made before the options existed still match
            key["exclude"] = [str(Path(d).resolve()) for d in self.exclude]
        if self.later_turns:
            key["later_turns"] = True
        return key


def exchanges(record: dict, later_turns: bool = False) -> list[tuple[list[dict], str]]:
    """(chat messages up to a human turn, the answer to it) for the first exchange, or with ``later_turns`` for
    every later one; the conversation must alternate human/gpt from its start with non-empty turns up to there."""
    out, messages = [], []
    for i, turn in enumerate(record.get("conversations") or []):
        who, text = turn.get("from"), (turn.get("value") or "").strip()
        if who != ("human", "gpt")[i % 2] or not text:
            break
        if who == "gpt" and (i > 1) == later_turns:
            out.append((list(messages), text))
        messages.append({"role": "user" if who == "human" else "assistant", "content": text})
        if not later_turns and i == 1:
            break
    return out


def tokenize_exchange(tokenizer, messages: list[dict], answer: str, eos_ids: list[int],
                      cfg: RelabelConfig) -> dict | None:
    """Templated prompt (``messages``, ending with a user turn) + answer (ending at the first EOS, cut at
    max_response_tokens) as one example."""
    prompt = tokenizer.apply_chat_template(messages, tokenize=False, add_generation_prompt=True)
    full = tokenizer.apply_chat_template(messages + [{"role": "assistant", "content": answer}], tokenize=False)
    if not full.startswith(prompt):
        raise ValueError("the chat template does not render the prompt as a prefix of the conversation")
    prompt_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
    answer_ids = tokenizer(full[len(prompt):], add_special_tokens=False)["input_ids"]
    if len(prompt_ids) > cfg.max_prompt_tokens:
        return None
    end = next((j + 1 for j, t in enumerate(answer_ids) if t in eos_ids), len(answer_ids))
    finished = end <= cfg.max_response_tokens
    answer_ids = answer_ids[:min(end, cfg.max_response_tokens)]
    if len(answer_ids) < 2:
        return None
    return {"prompt_len": len(prompt_ids), "input_ids": torch.tensor(prompt_ids + answer_ids, dtype=torch.int32),
            "finished": finished, "sampled": False}


def select_exchanges(tokenizer, cfg: RelabelConfig, eos_ids: list[int], source: str | Path | None = None) -> list[dict]:
    """A seeded sample of ``num_conversations`` tokenized exchanges (distinct prompts, none whose templated
    prompt is in a ``cfg.exclude`` folder); first exchanges, or with ``cfg.later_turns`` the later ones."""
    skip = {prompt_key(ex) for d in cfg.exclude for ex in load_examples(d, min_response_tokens=0)}
    records = []
    seen = set()
    for record in iter_sharegpt_records(source or sharegpt_path()):
        for messages, answer in exchanges(record, cfg.later_turns):
            context = tuple(m["content"] for m in messages)
            if context not in seen:
                seen.add(context)
                records.append((str(record.get("id", len(records))), messages, answer))
    random.Random(cfg.seed).shuffle(records)
    chosen = []
    for rid, messages, answer in records:
        ex = tokenize_exchange(tokenizer, messages, answer, eos_ids, cfg)
        if ex is not None and prompt_key(ex) not in skip:
            chosen.append({"id": rid, **ex})
            if len(chosen) >= cfg.num_conversations:
                break
    return chosen


def relabel_dataset(cfg: RelabelConfig, out_dir: str | Path, features_dir: str | Path | None = None,
                    target_layer_ids: list[int] | None = None, source: str | Path | None = None,
                    progress: bool = True) -> Path:
    """Create or resume the relabelled dataset at ``out_dir``; with ``features_dir`` and ``target_layer_ids``
    the target features of every conversation land in that cache (as ``train --features-dir`` reads it)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    from .features import FeatureExtractor

    out = open_dataset(out_dir, cfg.key(), "relabelled")
    if (out / EXCHANGES).exists():
        examples = torch.load(out / EXCHANGES, weights_only=True)
    else:
        tokenizer = AutoTokenizer.from_pretrained(cfg.target)
        eos_ids = eos_token_ids(GenerationConfig.from_pretrained(cfg.target), tokenizer)
        examples = select_exchanges(tokenizer, cfg, eos_ids, source)
        atomic_save(examples, out / EXCHANGES)
    shards = [examples[i:i + cfg.shard_size] for i in range(0, len(examples), cfg.shard_size)]
    todo = [k for k in range(len(shards)) if not shard_path(out, k).exists()]
    if not todo:
        close_dataset(out, len(shards))
        return out
    model = AutoModelForCausalLM.from_pretrained(cfg.target, dtype=getattr(torch, cfg.dtype)).eval()
    use_cache = features_dir is not None and target_layer_ids
    extractor = FeatureExtractor(model, target_layer_ids or [0], cache_dir=features_dir if use_cache else None,
                                 compute_dtype=getattr(torch, cfg.dtype))
    from tqdm import tqdm

    bar = tqdm(todo, desc="relabel", unit="shard", disable=not progress, dynamic_ncols=True)
    tokens, start = 0, time.time()
    for k in bar:
        shard = [dict(ex, labels=extractor.labelled(ex["input_ids"])) for ex in shards[k]]
        atomic_save(shard, shard_path(out, k))
        tokens += sum(len(ex["input_ids"]) for ex in shard)
        bar.set_postfix(tok_s=f"{tokens / (time.time() - start):.0f}")
    close_dataset(out, len(shards))
    return out
