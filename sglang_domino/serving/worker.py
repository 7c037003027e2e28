"""The Domino speculative worker inside SGLang's scheduler (spec-v2 schema, synchronous).

One decode step for a batch of requests, each with committed length ``s`` (tokens whose KV is
cached) and an uncommitted last token ``bonus`` (the target's previous output):

1. Draft: the backbone runs once on ``[bonus, MASK x (B-1)]`` at positions ``s .. s+B-1``, attending
   to the drafter's context K/V of positions ``< s``; the Domino head rolls out ``n`` proposals
   (``sglang_domino.rollout``).
2. Verify: the target scores ``[bonus, y_1 .. y_n]`` in one TARGET_VERIFY forward that writes its KV
   into the request's reserved slots ``s .. s+n``; ``sglang_domino.verify`` keeps the longest
   accepted prefix and draws the next token (greedy or lossless sampling with SGLang's distribution).
3. Commit: ``accept + 1`` tokens (bonus + accepted drafts) become committed; the KV of the rejected
   tail lies beyond the new length, inside SGLang's over-allocated reservation, and is overwritten
   next step or freed with the request. The target hidden states captured by the verify pass are
   turned into the drafter's context K/V for the same slots.

Where the draft policy chooses width 1 (drafting does not pay at this batch size), or a request in the
batch has rules only SGLang can advance (a custom logit processor, a grammar of a backend other than
xgrammar: ``serving.rules.plain_only_reason``), the step is SGLang's ordinary DECODE forward of the bonus
token instead, sampled by SGLang, with its hidden states captured for the drafter's context. Penalties,
min_new_tokens and xgrammar grammars are applied exactly at every chain position
(``serving.rules.apply_chain_penalties`` / ``apply_chain_grammars``), so batches with them draft too; a
penalized batch's width-1 steps are 1-wide verifies, since SGLang's sampler would apply its own penalty
state, which counts only the last token of each speculative step.

The drafter's context K/V live in a pool indexed by the target's KV slot ids, so SGLang's
allocator, radix cache and request lifecycle manage them implicitly (a slot's entry is rewritten
whenever the target rewrites that slot); captured states are projected lazily, when a draft needs them
(``sglang_domino.serving.context``).
"""

from __future__ import annotations

import logging
import time
from contextlib import contextmanager
from typing import List, Optional

import torch

from ..drafter import draft_dtype, drafting_head, load_drafter, vocab_logits
from ..kernels.dispatch import rollout, verify_greedy, verify_sampled  # Triton on CUDA, torch reference on CPU
from ..linear import trial_calls
from ..policy import CPU_MAX_DRAFT_BATCH, DraftPolicy
from .context import ContextPool
from .rules import (apply_chain_grammars, apply_chain_penalties, apply_plain_step_rules, has_grammars, has_penalties,
                    plain_only_reason)
from .sampling import draft_batch_sampling, sglang_probs

from sglang.srt.managers.utils import GenerationBatchResult
from sglang.srt.model_executor.forward_batch_info import CaptureHiddenMode
from sglang.srt.runtime_context import get_spec
from sglang.srt.speculative.base_spec_worker import BaseSpecWorker
from sglang.srt.speculative.dflash_info import DFlashVerifyInput
from sglang.srt.speculative.spec_info import SpecInput, SpecInputType

logger = logging.getLogger(__name__)


@contextmanager
def _overridden(obj, **fields):
    """Set attributes of ``obj`` for the duration of the block, then restore them."""
    saved = {name: getattr(obj, name) for name in fields}
    for name, value in fields.items():
        setattr(obj, name, value)
    try:
        yield obj
    finally:
        for name, value in saved.items():
            setattr(obj, name, value)


class DominoDraftInput(SpecInput):
    """Carried on the running batch between steps. The worker keeps no per-request state here (the
    bonus token is the request's last output id; draft context lives in the slot-indexed pool), so
    filtering and merging are no-ops."""

    def __init__(self):
        super().__init__(SpecInputType.DFLASH_DRAFT)
        self.num_tokens_per_req = 1
        self.num_tokens_for_logprob_per_req = 1
        self.future_indices = None

    def filter_batch(self, new_indices: torch.Tensor, new_indices_cpu: Optional[List[int]] = None):
        return None

    def merge_batch(self, spec_info) -> None:
        return None


class DominoWorker(BaseSpecWorker):
    def __init__(self, server_args, gpu_id: int, nccl_port: int, target_worker):
        super().__init__()
        self.server_args = server_args
        self._target_worker = target_worker
        self._draft_worker = None
        self.model_runner = target_worker.model_runner
        self.device = torch.device(self.model_runner.device)
        spec = get_spec()
        target = self.model_runner.model
        hf_config = self.model_runner.model_config.hf_config

        embed_module = target.get_input_embeddings() if hasattr(target, "get_input_embeddings") else None
        if embed_module is None:
            embed_module = target.model.embed_tokens
        self.vocab_size = int(self.model_runner.model_config.vocab_size)
        self.embed = embed_module.weight[: self.vocab_size]
        lm_head = getattr(target, "lm_head", None)
        if lm_head is None or not isinstance(getattr(lm_head, "weight", None), torch.Tensor):
            raise RuntimeError("DOMINO needs a target model with a plain lm_head weight")
        self.lm_head = lm_head.weight[: self.vocab_size]
        self.dtype = self.embed.dtype

        path = spec.speculative_draft_model_path
        self.drafter = load_drafter(path, hf_config, dtype=self.dtype, device=self.device)
        self.cfg = self.drafter.config
        self.draft_dtype = draft_dtype(self.device, self.dtype)  # base logits and head correction
        self.draft_lm_head = self.lm_head.to(self.draft_dtype)
        self.head = drafting_head(self.drafter, self.embed, self.draft_dtype)
        if not hasattr(target, "set_dflash_layers_to_capture"):
            raise RuntimeError(
                f"DOMINO: target model {type(target).__name__} cannot capture hidden states "
                "(no set_dflash_layers_to_capture)")
        target.set_dflash_layers_to_capture(list(self.cfg.target_layer_ids))

        self.block_size = int(self.cfg.block_size)
        self.num_draft_tokens = int(spec.speculative_num_draft_tokens or self.block_size)
        self.policy = DraftPolicy.from_env(self.num_draft_tokens,
                                           CPU_MAX_DRAFT_BATCH if self.device.type == "cpu" else 0)
        self.context = None
        self.steps = 0
        self._trials_seen = 0  # linear.trial_calls() after the last step
        self._plain_reasons: set[str] = set()  # reasons for plain steps already logged
        logger.info(
            "DOMINO worker: drafter %s (%d layers, block %d, %d drafts/step, context layers %s), "
            "draft dtype %s, gate table %s, draft policy %s", path, self.cfg.num_hidden_layers, self.block_size,
            self.num_draft_tokens - 1, self.cfg.target_layer_ids, str(self.draft_dtype).removeprefix("torch."),
            "off" if self.head.gate_table is None else f"{self.head.gate_table.nbytes / 2**20:.0f} MiB",
            self.policy.describe())

    # -- SGLang worker protocol ---------------------------------------------------------------------
    @property
    def draft_worker(self):
        return None

    def alloc_memory_pool(self, memory_pool_config=None, req_to_token_pool=None,
                          token_to_kv_pool_allocator=None, **kwargs):
        self.req_to_token_pool = req_to_token_pool or self.model_runner.req_to_token_pool
        self.token_to_kv_pool_allocator = token_to_kv_pool_allocator or self.model_runner.token_to_kv_pool_allocator
        num_slots = int(self.model_runner.token_to_kv_pool.get_key_buffer(0).shape[0])
        self.context = ContextPool(self.drafter, num_slots, self.dtype, self.device)
        logger.info("DOMINO draft context pool: %d slots, %.1f MB", num_slots, self.context.nbytes / 2**20)

    def init_attention_backends(self):
        pass

    def init_cuda_graphs(self):
        pass

    def clear_cache_pool(self):
        pass

    # -- drafter context ------------------------------------------------------------------------------
    def _write_context(self, logits_output, positions: torch.Tensor, slots: torch.Tensor, what: str) -> None:
        """Queue the target states captured by a forward (``logits_output.hidden_states``, [N, K*H]) as the
        drafter's context at ``slots`` ([N], positions [N]), then drop them from the output."""
        hidden = logits_output.hidden_states
        if hidden is None:
            raise RuntimeError(f"DOMINO: the target returned no captured hidden states for {what}")
        logits_output.hidden_states = None
        self.context.write(hidden, positions, slots)

    # -- one step ------------------------------------------------------------------------------------
    @torch.no_grad()
    def forward_batch_generation(self, batch, on_publish=None, pp_proxy_tensors=None, **kwargs):
        if batch.forward_mode.is_extend():
            return self._forward_extend(batch, on_publish)
        if batch.forward_mode.is_idle() or len(batch.reqs) == 0:
            raise RuntimeError("DOMINO: idle batches (DP attention) are not supported")
        return self._forward_decode(batch, on_publish)

    def _forward_extend(self, batch, on_publish):
        result = self.target_worker.forward_batch_generation(
            batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        positions = torch.cat([
            torch.arange(p, p + n, device=self.device) for p, n in zip(batch.prefix_lens, batch.extend_lens)
        ]) if batch.extend_lens else torch.empty(0, dtype=torch.long, device=self.device)
        self._write_context(result.logits_output, positions, batch.out_cache_loc, "prefill")
        result.new_seq_lens = batch.seq_lens
        result.next_draft_input = DominoDraftInput()
        if on_publish is not None:
            on_publish(batch.seq_lens)
        return result

    def _draft(self, batch, seq_lens, seq_lens_cpu, bonus, n, sampling_info, all_greedy):
        bs = bonus.shape[0]
        slot_rows = self.req_to_token_pool.req_to_token[batch.req_pool_indices.long()][:, : int(seq_lens_cpu.max())]
        ctx, ctx_mask = self.context.gather(slot_rows, seq_lens)
        block_ids = torch.full((bs, self.block_size), self.cfg.mask_token_id, dtype=torch.long, device=self.device)
        block_ids[:, 0] = bonus
        positions = seq_lens[:, None] + torch.arange(self.block_size, device=self.device)
        z = self.drafter.backbone(self.embed[block_ids], positions, ctx, ctx_mask)[:, :n].to(self.draft_dtype)
        base = vocab_logits(z, self.draft_lm_head)
        if all_greedy:
            tokens, _ = rollout(z, base, bonus, self.embed, self.head, self.cfg.pure_draft_prefix_len)
            return tokens, None
        noise = torch.empty(bs, n, self.vocab_size, device=self.device).exponential_()
        return rollout(z, base, bonus, self.embed, self.head, self.cfg.pure_draft_prefix_len,
                       draft_batch_sampling(sampling_info), noise)

    def _plain_step(self, batch, seq_lens, seq_lens_cpu, bonus, on_publish, t_start):
        """Width 1 (the policy found drafting does not pay at this batch size): one ordinary DECODE
        forward of the target, sampled by SGLang itself, so the step costs what plain decoding costs;
        the captured hidden states still become the drafter's context for the bonus token's slot."""
        slots = self.req_to_token_pool.req_to_token[batch.req_pool_indices.long(), seq_lens].to(torch.int64)
        # decode: the length includes the token being fed
        with _overridden(batch, input_ids=bonus, out_cache_loc=slots, seq_lens=batch.seq_lens + 1,
                         seq_lens_cpu=seq_lens_cpu + 1, seq_lens_sum=int(seq_lens_cpu.sum()) + len(batch.reqs)):
            out = self.target_worker.forward_batch_generation(batch, capture_hidden_mode=CaptureHiddenMode.FULL)
        self._write_context(out.logits_output, seq_lens, slots, "decode")
        new_seq_lens = (seq_lens + 1).to(batch.seq_lens.dtype)
        return self._result(out.logits_output, out.next_token_ids, torch.ones_like(seq_lens), 1, new_seq_lens,
                            on_publish, t_start)

    def _result(self, logits_output, next_token_ids, commit, width, new_seq_lens, on_publish,
                t_start) -> GenerationBatchResult:
        """Publish the new lengths, tell the draft policy what the step took, and hand SGLang the result."""
        if on_publish is not None:
            on_publish(new_seq_lens)
        bs = commit.shape[0]
        # a step's time, less the one-off costs its width did not cause: the flush of rows queued by earlier
        # plain steps or prefills, and few-row linear trials (such a step is not recorded)
        seconds = time.perf_counter() - t_start - self.context.backlog_seconds(bs * width)
        trials, self._trials_seen = self._trials_seen, trial_calls()
        if trials == self._trials_seen:
            self.policy.record(bs, width, commit.tolist(), seconds)
        self.steps += 1
        if self.policy.pop_news() or self.steps % 2000 == 0:
            logger.info("DOMINO draft policy: %s", self.policy.describe())
        return GenerationBatchResult(
            logits_output=logits_output,
            next_token_ids=next_token_ids,
            accept_lens=commit.to(torch.int32),
            can_run_cuda_graph=False,
            next_draft_input=DominoDraftInput(),
            speculative_num_draft_tokens=width,
            new_seq_lens=new_seq_lens,
        )

    def _forward_decode(self, batch, on_publish):
        from sglang.srt.speculative.dflash_utils import apply_dflash_verify_logits_adjustments

        bs = len(batch.reqs)
        device = self.device
        seq_lens = batch.seq_lens.long()
        seq_lens_cpu = batch.seq_lens_cpu if batch.seq_lens_cpu is not None else seq_lens.cpu()
        bonus = torch.tensor([req.output_ids[-1] for req in batch.reqs], dtype=torch.long, device=device)
        sampling_info = batch.sampling_info
        all_greedy = sampling_info is None or sampling_info.is_all_greedy
        t_start = time.perf_counter()
        plain_reason = plain_only_reason(batch)
        if plain_reason is not None and plain_reason not in self._plain_reasons:
            self._plain_reasons.add(plain_reason)
            logger.info("DOMINO: batches with %s decode without drafting (plain steps apply them exactly)",
                        plain_reason)
        width = 1 if plain_reason is not None else self.policy.width(bs)
        n = width - 1
        penalized = has_penalties(batch.reqs)
        if width == 1 and not batch.return_logprob and not penalized:
            return self._plain_step(batch, seq_lens, seq_lens_cpu, bonus, on_publish, t_start)

        if n > 0:
            tokens, q = self._draft(batch, seq_lens, seq_lens_cpu, bonus, n, sampling_info, all_greedy)
        else:
            tokens = torch.empty(bs, 0, dtype=torch.long, device=device)
            q = None if all_greedy else torch.empty(bs, 0, self.vocab_size, device=device)

        # --- verify [bonus, y_1 .. y_n] in one target pass
        chain = torch.cat([bonus[:, None], tokens], 1)
        offsets = torch.arange(width, device=device)
        positions = seq_lens[:, None] + offsets
        slots = self.req_to_token_pool.req_to_token[batch.req_pool_indices.long()[:, None], positions]
        verify_input = DFlashVerifyInput(
            draft_token=chain.reshape(-1), positions=positions.reshape(-1), draft_token_num=width,
            custom_mask=None, capture_hidden_mode=CaptureHiddenMode.FULL)
        batch.out_cache_loc = slots.reshape(-1).to(torch.int64)
        # host upper bound of what attention reads
        with _overridden(batch, seq_lens_cpu=seq_lens_cpu + width, seq_lens_sum=int(seq_lens_cpu.sum()) + bs * width):
            verify_batch, _ = verify_input.prepare_for_verify(batch, self.target_worker)
        out = self.target_worker.forward_batch_generation(batch=None, forward_batch=verify_batch, is_verify=True)
        logits_output = out.logits_output
        logits = logits_output.next_token_logits
        logits3 = logits.view(bs, width, -1)[..., : self.vocab_size]
        if sampling_info is not None and width == 1:  # a plain step as SGLang's sampler takes it
            apply_plain_step_rules(logits, batch)
        elif sampling_info is not None:  # no logit processor here (plain_only_reason); SGLang's order:
            if penalized:  # penalties, grammar mask, logit bias
                apply_chain_penalties(logits3, batch.reqs, tokens)
            if has_grammars(batch.reqs):
                apply_chain_grammars(logits, batch.reqs, tokens, self.vocab_size)
            sampling_info.grammar_mask = None
            apply_dflash_verify_logits_adjustments(  # the logit bias; it leaves SGLang's penalty state alone
                next_token_logits=logits, sampling_info=sampling_info, draft_token_num=width)
        if all_greedy:
            accept, new_bonus = verify_greedy(tokens, logits3)
        else:
            p = sglang_probs(logits3, sampling_info.temperatures.view(-1), sampling_info.top_ks.view(-1),
                             sampling_info.top_ps.view(-1),
                             sampling_info.min_ps.view(-1) if sampling_info.need_min_p_sampling else None)
            uniform = torch.rand(bs, n, device=device)
            noise = torch.empty(bs, self.vocab_size, device=device).exponential_()
            accept, new_bonus = verify_sampled(tokens, q, p, uniform, noise)

        rows = torch.arange(bs, device=device)
        out_tokens = torch.zeros(bs, width, dtype=torch.long, device=device)
        out_tokens[:, :n] = tokens
        out_tokens[rows, accept] = new_bonus
        commit = accept + 1
        new_seq_lens = (seq_lens + commit).to(batch.seq_lens.dtype)

        # --- drafter context for the verified positions (all of them; the tail is rewritten later)
        self._write_context(logits_output, positions.reshape(-1), slots.reshape(-1), "verify")

        if batch.return_logprob:
            from sglang.srt.layers.logprob_processor import compute_spec_logprobs

            compute_spec_logprobs(batch, logits_output, out_tokens.reshape(-1), chain_stride=width)
        return self._result(logits_output, out_tokens.reshape(-1), commit, width, new_seq_lens, on_publish, t_start)
