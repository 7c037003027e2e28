"""``sglang-domino``: install the real target, make drafters, generate, prepare data and train.

    sglang-domino install-model                      # SmolLM2-135M-Instruct -> models/
    sglang-domino generate --prompt "..."            # Transformers backend; prints text, tau, tok/s
    sglang-domino init-drafter --out drafters/random # a random drafter in the published format
    sglang-domino gen-data / train                   # see sglang_domino/train
"""

from __future__ import annotations

import argparse
import json
import sys

from .models import DEFAULT_MODEL_DIR

DEFAULT_DRAFTER = "drafters/smollm2-domino-b16"


def cmd_install_model(args) -> None:
    import torch

    from .models import install_smollm2

    print(json.dumps({"model": str(install_smollm2(args.out, getattr(torch, args.dtype)))}))


def cmd_init_drafter(args) -> None:
    from transformers import AutoConfig

    from .drafter import save_drafter
    from .models import init_drafter

    drafter = init_drafter(AutoConfig.from_pretrained(args.model), num_layers=args.num_layers,
                           num_context_layers=args.num_context_layers, block_size=args.block_size,
                           gru_hidden_dim=args.gru_hidden_dim, emb_dim=args.emb_dim, seed=args.seed)
    save_drafter(drafter, args.out)
    print(json.dumps({"drafter": args.out, "config": drafter.config.to_dict()["dflash_config"]}))


def cmd_generate(args) -> None:
    import os

    import torch

    from .drafter import load_drafter
    from .hf.generate import plain_generate, speculative_generate
    from .hf.target import chat_input_ids, load_target, stop_token_ids
    from .models import init_drafter
    from .sampling import SamplingParams

    torch.set_num_threads(args.threads)
    dtype = getattr(torch, args.dtype)
    target, tokenizer = load_target(args.model, dtype)
    params = SamplingParams(args.temperature, args.top_k, args.top_p)
    if args.chat:
        ids = chat_input_ids(tokenizer, args.prompt)
    else:
        ids = tokenizer(args.prompt, return_tensors="pt")["input_ids"]
    stops = stop_token_ids(target, tokenizer)
    if args.plain:
        out = plain_generate(target, ids, args.max_new_tokens, params, stops, args.seed)
    else:
        if args.drafter and os.path.exists(args.drafter):
            drafter = load_drafter(args.drafter, target.config, dtype=dtype)
        elif args.drafter == DEFAULT_DRAFTER:
            print(f"note: {DEFAULT_DRAFTER} not found; using a random (untrained) drafter", file=sys.stderr)
            drafter = init_drafter(target.config).to(dtype)
        else:
            raise SystemExit(f"error: drafter {args.drafter!r} not found")
        out = speculative_generate(target, drafter, ids, args.max_new_tokens, params, stops, args.seed,
                                   use_head=not args.no_head, block_size=args.block_size, policy=args.draft_policy)
    print(tokenizer.decode(out.tokens, skip_special_tokens=True))
    s = out.stats
    print(json.dumps({"new_tokens": s.new_tokens, "tau": round(s.tau, 3), "tokens_per_s": round(s.tokens_per_s, 2),
                      "steps": s.steps, "time_s": round(s.time_total, 3)}), file=sys.stderr)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="sglang-domino", description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", required=True)
    fmt = argparse.ArgumentDefaultsHelpFormatter

    p = sub.add_parser("install-model", help="convert the packaged SmolLM2-135M-Instruct GGUF to an HF folder",
                       formatter_class=fmt)
    p.add_argument("--out", default=str(DEFAULT_MODEL_DIR))
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.set_defaults(func=cmd_install_model)

    p = sub.add_parser("init-drafter", help="write a randomly initialised drafter for a target", formatter_class=fmt)
    p.add_argument("--model", default=str(DEFAULT_MODEL_DIR), help="target model folder")
    p.add_argument("--out", required=True)
    p.add_argument("--num-layers", type=int, default=1)
    p.add_argument("--num-context-layers", type=int, default=3)
    p.add_argument("--block-size", type=int, default=16)
    p.add_argument("--gru-hidden-dim", type=int, default=256)
    p.add_argument("--emb-dim", type=int, default=128)
    p.add_argument("--seed", type=int, default=0)
    p.set_defaults(func=cmd_init_drafter)

    p = sub.add_parser("generate", help="speculative generation with the Transformers backend", formatter_class=fmt)
    p.add_argument("--model", default=str(DEFAULT_MODEL_DIR))
    p.add_argument("--drafter", default=DEFAULT_DRAFTER)
    p.add_argument("--prompt", required=True)
    p.add_argument("--no-chat", dest="chat", action="store_false", help="send the prompt without the chat template")
    p.add_argument("--max-new-tokens", type=int, default=128)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--block-size", type=int, help="widest verify step (default: the drafter's block)")
    p.add_argument("--draft-policy", choices=["adaptive", "always"],
                   help="adaptive: each step's width is the one measured fastest (1 = a plain step); always: every "
                        "step verifies --block-size (default: $SGLANG_DOMINO_DRAFT_POLICY, else adaptive)")
    p.add_argument("--no-head", action="store_true", help="backbone only (plain DFlash drafting)")
    p.add_argument("--plain", action="store_true", help="plain decoding, no speculation")
    p.add_argument("--dtype", default="float32", choices=["float32", "bfloat16"])
    p.add_argument("--threads", type=int, default=2)
    p.set_defaults(func=cmd_generate)

    try:
        from .train.cli import add_parsers
    except ImportError:  # the trainer is optional at import time
        pass
    else:
        add_parsers(sub)
    return parser


def main(argv=None) -> None:
    args = build_parser().parse_args(argv)
    args.func(args)


if __name__ == "__main__":
    main()
