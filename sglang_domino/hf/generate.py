"""Speculative generation with any Hugging Face causal LM as the target (batch size 1).

One step, in the style of gpt-fast:

    w      = policy.width(1)                                       # verify width: bonus + w-1 drafts
    z      = drafter.backbone([bonus, MASK...], context K/V)      # one parallel pass
    draft  = rollout(z, lm_head(z), bonus, head)                   # causal Domino head
    logits = target([bonus, draft])                                # one verify pass
    accept_len, bonus = verify(draft, logits)                      # lossless accept/reject
    crop the target KV of rejected drafts; append accepted hidden states to the drafter's context

A width-1 step drafts nothing: the target decodes the bonus token alone (its hidden states still feed the
drafter's context). The draft policy (``sglang_domino.policy``, the SGLang worker's) picks the width that
commits the most tokens per second, so speculation never costs more than it measurably gains.

``plain_generate`` is the reference decoder with the same sampling procedure, so greedy outputs and
sampled distributions can be compared one to one.
"""

from __future__ import annotations

import dataclasses
import time

import torch

from ..drafter import DominoDrafter, draft_dtype, drafting_head, vocab_logits
from ..kernels import dispatch
from ..linear import few_row_linears, trial_calls
from ..policy import DraftPolicy
from ..sampling import BatchSampling, SamplingParams, exponential_like, sample_from, sampling_probs


@dataclasses.dataclass
class GenerateStats:
    new_tokens: int = 0
    accept_lens: list[int] = dataclasses.field(default_factory=list)  # drafts accepted per verify step
    widths: list[int] = dataclasses.field(default_factory=list)  # verify width per step (1 = plain step)
    time_prefill: float = 0.0
    time_backbone: float = 0.0  # drafter backbone + base logits
    time_head: float = 0.0  # Domino head rollout
    time_verify: float = 0.0  # target verify pass + accept/reject + cache bookkeeping
    time_total: float = 0.0

    @property
    def steps(self) -> int:
        return len(self.accept_lens)

    @property
    def tau(self) -> float:
        """Mean tokens committed per verify step (bonus included)."""
        return sum(a + 1 for a in self.accept_lens) / max(1, self.steps)

    @property
    def tokens_per_s(self) -> float:
        return self.new_tokens / self.time_total if self.time_total else 0.0

    def to_dict(self) -> dict:
        d = dataclasses.asdict(self)
        d.update(steps=self.steps, tau=self.tau, tokens_per_s=self.tokens_per_s)
        return d


@dataclasses.dataclass
class GenerateOutput:
    tokens: list[int]  # new tokens only
    stats: GenerateStats


def target_features(hidden_states: tuple[torch.Tensor, ...], layer_ids: list[int]) -> torch.Tensor:
    """Concatenate the outputs of the chosen target layers: -> [b, T, K*H] (HF index = layer id + 1)."""
    return torch.cat([hidden_states[i + 1] for i in layer_ids], dim=-1)


def _stop_index(tokens: list[int], stop_ids: set[int], limit: int) -> int | None:
    """Length to keep if generation must end within ``tokens`` (first stop token kept), else None."""
    for i, t in enumerate(tokens[:limit]):
        if t in stop_ids:
            return i + 1
    return limit if len(tokens) >= limit else None


class _Sampler:
    """Turns target/draft logits into tokens with one generator, for greedy or sampled decoding."""

    def __init__(self, params: SamplingParams, vocab: int, device, seed: int):
        self.batch = None if params.greedy else BatchSampling.of([params], device)
        self.vocab, self.device = vocab, device
        self.gen = torch.Generator(device=device).manual_seed(seed)

    def noise(self, *shape) -> torch.Tensor:
        return exponential_like((1, *shape, self.vocab), self.gen, self.device)

    def uniform(self, n: int) -> torch.Tensor:
        return torch.rand((1, n), generator=self.gen, device=self.device)

    def next_token(self, logits: torch.Tensor) -> torch.Tensor:
        """logits [1, V] -> token [1]."""
        if self.batch is None:
            return logits.argmax(-1)
        return sample_from(sampling_probs(logits, self.batch), self.noise())


@torch.inference_mode()
def plain_generate(target, input_ids: torch.Tensor, max_new_tokens: int,
                   sampling: SamplingParams = SamplingParams(), stop_token_ids=(), seed: int = 0) -> GenerateOutput:
    """Reference decoding, one target step per token. input_ids: [1, T]."""
    from transformers import DynamicCache

    with few_row_linears(target):  # the target's 1-64-row forwards in the faster form on a CPU
        stats, t0 = GenerateStats(), time.perf_counter()
        sampler = _Sampler(sampling, target.config.get_text_config().vocab_size, input_ids.device, seed)
        cache, tokens, step_input = DynamicCache(), [], input_ids
        stop = set(stop_token_ids)
        while len(tokens) < max_new_tokens:
            logits = target(input_ids=step_input, past_key_values=cache, use_cache=True).logits[:, -1]
            token = sampler.next_token(logits)
            tokens.append(int(token))
            if tokens[-1] in stop:
                break
            step_input = token[:, None]
        stats.new_tokens, stats.time_total = len(tokens), time.perf_counter() - t0
        return GenerateOutput(tokens, stats)


@torch.inference_mode()
def speculative_generate(
    target,
    drafter: DominoDrafter,
    input_ids: torch.Tensor,
    max_new_tokens: int,
    sampling: SamplingParams = SamplingParams(),
    stop_token_ids=(),
    seed: int = 0,
    use_head: bool = True,
    block_size: int | None = None,
    policy: DraftPolicy | str | None = None,
) -> GenerateOutput:
    """Domino speculative decoding. input_ids: [1, T]. ``use_head=False`` is backbone-only (DFlash).

    block_size: the widest verify step (bonus + drafts), at most the drafter's block; default the drafter's.
    policy: how wide each step is. ``"adaptive"`` measures the widths 1, 2, 4, 8 and ``block_size``
    (``SGLANG_DOMINO_DRAFT_WIDTHS``) and runs the fastest; ``"always"`` verifies ``block_size`` at every step
    (what a tau measurement wants); a ``DraftPolicy`` carries its measurements across calls. Default:
    ``SGLANG_DOMINO_DRAFT_POLICY``, else adaptive.
    """
    from transformers import DynamicCache

    cfg = drafter.config
    block = min(block_size or cfg.block_size, cfg.block_size)
    if block < 2:
        raise ValueError(f"block_size={block_size}: must be >= 2")
    if not isinstance(policy, DraftPolicy):
        policy = DraftPolicy.from_env(block, mode=policy)
    device = input_ids.device
    embed = target.get_input_embeddings().weight
    lm_head = target.get_output_embeddings().weight
    draft_as = draft_dtype(device, lm_head.dtype)  # base logits and head correction
    draft_lm_head = lm_head.to(draft_as)
    head = drafting_head(drafter, embed, draft_as) if use_head else None
    sampler = _Sampler(sampling, lm_head.shape[0], device, seed)
    stop = set(stop_token_ids)
    stats, t_start = GenerateStats(), time.perf_counter()

    # Prefill: target KV and features for the prompt; the first token comes from the target.
    with few_row_linears(target):  # the target's 1-64-row forwards in the faster form on a CPU
        cache = DynamicCache()
        out = target(input_ids=input_ids, past_key_values=cache, use_cache=True, output_hidden_states=True)
        positions = torch.arange(input_ids.shape[1], device=device)[None]
        ctx_kv = drafter.context_kv(target_features(out.hidden_states, cfg.target_layer_ids).to(lm_head.dtype),
                                    positions)
        bonus = sampler.next_token(out.logits[:, -1])
        tokens = [int(bonus)]
        pos = input_ids.shape[1]  # position of the bonus token, which has no KV yet
        stats.time_prefill = time.perf_counter() - t_start
        mask_ids = torch.full((1, cfg.block_size - 1), cfg.mask_token_id, device=device)

        while _stop_index(tokens, stop, max_new_tokens) is None:
            width = min(policy.width(1), block)
            n = min(width - 1, max_new_tokens - len(tokens) - 1)  # drafts this step
            t0, trials = time.perf_counter(), trial_calls()
            draft = bonus.new_empty(1, 0)
            if n > 0:
                block_ids = torch.cat([bonus[:, None], mask_ids], 1)
                block_pos = torch.arange(pos, pos + cfg.block_size, device=device)[None]
                z = drafter.backbone(embed[block_ids], block_pos, ctx_kv)[:, :n].to(draft_as)
                base = vocab_logits(z, draft_lm_head)
                t1 = time.perf_counter()
                noise = sampler.noise(n) if sampler.batch is not None else None
                draft, q = dispatch.rollout(z, base, bonus, embed, head, cfg.pure_draft_prefix_len, sampler.batch,
                                            noise)
            t2 = time.perf_counter()

            out = target(input_ids=torch.cat([bonus[:, None], draft], 1), past_key_values=cache, use_cache=True,
                         output_hidden_states=True)
            if n == 0:  # a plain step
                accept_len, bonus = bonus.new_zeros(1), sampler.next_token(out.logits[:, -1])
            elif sampler.batch is None:
                accept_len, bonus = dispatch.verify_greedy(draft, out.logits)
            else:
                p = sampling_probs(out.logits, sampler.batch)
                accept_len, bonus = dispatch.verify_sampled(draft, q, p, sampler.uniform(n), sampler.noise())
            a = int(accept_len)
            if n > a:
                cache.crop(a - n)  # drop the rejected drafts' KV
            feats = target_features(out.hidden_states, cfg.target_layer_ids)[:, : a + 1].to(lm_head.dtype)
            new_kv = drafter.context_kv(feats, torch.arange(pos, pos + a + 1, device=device)[None])
            ctx_kv = [(torch.cat([k, nk], 2), torch.cat([v, nv], 2)) for (k, v), (nk, nv) in zip(ctx_kv, new_kv)]
            pos += a + 1
            tokens += draft[0, :a].tolist() + [int(bonus)]
            stats.accept_lens.append(a)
            t3 = time.perf_counter()
            # a step cut short by max_new_tokens, or one that paid for few-row linear trials, says little
            # about its width
            if n == width - 1 and trial_calls() == trials:
                policy.record(1, width, [a + 1], t3 - t0)
            if n > 0:
                stats.time_backbone += t1 - t0
                stats.time_head += t2 - t1
            stats.time_verify += t3 - t2
            stats.widths.append(n + 1)

        tokens = tokens[: _stop_index(tokens, stop, max_new_tokens)]
        stats.new_tokens, stats.time_total = len(tokens), time.perf_counter() - t_start
        return GenerateOutput(tokens, stats)
