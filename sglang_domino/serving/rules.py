"""Logit rules that change with every token, at every position of a verify chain.

Penalties: frequency, presence and repetition penalties and min_new_tokens (SGLang's ``penaltylib``).
SGLang's own speculative algorithms apply the state of a chain's first position to the whole chain and count
only the last committed token of each step ("relaxed"), and a worker gets only the summed state. Here
``apply_chain_penalties`` recomputes it from each request's output ids, exactly as SGLang's plain decoding
holds it, and advances it through the drafts, so position i of a verify chain sees the outputs so far plus
``y_1 .. y_i``: a chain with penalties verifies exactly, and SGLang's relaxed state is never used.

Grammars (regex, JSON schema, EBNF) compiled by xgrammar, SGLang's default backend, are advanced through the
drafts the same way (``apply_chain_grammars``: accept ``y_1 .. y_i`` on the request's matcher, read the mask,
roll back). Grammars of other backends and custom logit processors keep state that only SGLang can advance,
so a batch with one of them decodes plain steps (``plain_only_reason``).
"""

from __future__ import annotations

import torch


def plain_only_reason(batch) -> str | None:
    """Why a decode batch (SGLang's ScheduleBatch) must take plain one-token steps, or None: it has requests
    whose logit rules only SGLang can advance (see the module docstring)."""
    if any(g is not None and not _chain_grammar(g) for g in _grammars(batch.reqs)):
        return "a grammar of a backend other than xgrammar"
    info = batch.sampling_info
    if info is not None and info.has_custom_logit_processor:
        return "a custom logit processor"
    return None


def has_penalties(reqs) -> bool:
    """Whether any request has a penalty or min_new_tokens (what SGLang's penaltylib applies)."""
    return any(_penalties(r.sampling_params) != (0.0, 0.0, 1.0, 0) for r in reqs)


def _penalties(sp) -> tuple[float, float, float, int]:
    return (sp.frequency_penalty, sp.presence_penalty, sp.repetition_penalty, sp.min_new_tokens)


def _stop_tokens(req) -> set[int]:
    """The tokens min_new_tokens holds back (as SGLang's BatchedMinNewTokensPenalizer gathers them)."""
    tok = getattr(req, "tokenizer", None)
    ids = set(req.sampling_params.stop_token_ids or ()) | set(req.eos_token_ids or ())
    if tok is not None:
        ids |= set(getattr(tok, "additional_stop_token_ids", None) or ())
        ids.add(tok.eos_token_id)
    return {t for t in ids if t is not None}


def apply_chain_penalties(logits: torch.Tensor, reqs, drafts: torch.Tensor) -> None:
    """SGLang's penalties at every position of a verify chain, exactly, in place.

    logits: [b, n+1, V] for ``[bonus, y_1 .. y_n]``; drafts: [b, n]. Position i sees what SGLang's plain
    decoding would: the request's output ids so far (the bonus included) and ``y_1 .. y_i``: logits get
    ``- frequency x count - presence x seen`` (and -inf on stop tokens while fewer than min_new_tokens are
    out), then the repetition penalty scales the seen tokens' logits (x r below 0, / r above), in SGLang's
    order and float32 arithmetic."""
    b, width, vocab = logits.shape
    device = logits.device
    params = torch.tensor([_penalties(r.sampling_params) for r in reqs], dtype=torch.float32, device=device)
    freq, pres, rep, min_new = (params[:, j:j + 1] for j in range(4))
    seen_f = torch.zeros(b, vocab, dtype=torch.float32, device=device)  # frequency x count
    seen = torch.zeros(b, vocab, dtype=torch.bool, device=device)
    for row, req in enumerate(reqs):
        ids = torch.tensor(req.output_ids, dtype=torch.long, device=device)
        seen_f[row].scatter_add_(0, ids, freq[row].expand(len(ids)))
        seen[row, ids] = True
    stop = None
    if bool((min_new > 0).any()):
        stop = torch.zeros(b, vocab, dtype=torch.bool, device=device)
        for row, req in enumerate(reqs):
            stop[row, sorted(_stop_tokens(req))] = True
        n_out = torch.tensor([len(r.output_ids) for r in reqs], device=device)[:, None]
    use_rep = bool((rep != 1).any())
    for i in range(width):
        if i > 0:
            y = drafts[:, i - 1:i]
            seen_f.scatter_add_(1, y, freq)
            seen.scatter_(1, y, True)
        additive = -seen_f - torch.where(seen, pres, 0.0)
        if stop is not None:
            additive.masked_fill_(stop & (n_out + i < min_new), float("-inf"))
        pos = logits[:, i]
        pos.add_(additive.to(pos.dtype))
        if use_rep:
            scale = torch.where(seen, rep, 1.0).to(pos.dtype)
            pos.copy_(torch.where(pos < 0, pos * scale, pos / scale))


def _grammars(reqs) -> list:
    return [getattr(req, "grammar", None) for req in reqs]


def _chain_grammar(grammar) -> bool:
    """Whether a grammar can be advanced through drafts and rolled back (xgrammar's matcher)."""
    from sglang.srt.constrained.xgrammar_backend import XGrammarGrammar

    return type(grammar) is XGrammarGrammar


def has_grammars(reqs) -> bool:
    return any(g is not None for g in _grammars(reqs))


def apply_chain_grammars(logits: torch.Tensor, reqs, drafts: torch.Tensor, vocab_size: int) -> None:
    """Grammar masks at every position of a verify chain, in place.

    logits: [b*(n+1), >= vocab_size] for the chains ``[bonus, y_1 .. y_n]`` of b requests, row-major; drafts:
    [b, n]; vocab_size: the model's (the masks' width, as in SGLang's sampler).
    Position i allows what the request's grammar allows after its output so far and ``y_1 .. y_i``: the
    drafts are accepted on its matcher one by one while the mask allows them, and rolled back afterwards.
    Positions after a draft the grammar refuses stay unmasked: that draft is rejected, so they are never
    used."""
    b, n = drafts.shape
    width = n + 1
    rows = [(r, g) for r, g in enumerate(_grammars(reqs)) if g is not None and not g.finished and not g.is_terminated()]
    if not rows:
        return
    first = rows[0][1]
    mask = first.allocate_vocab_mask(vocab_size=vocab_size, batch_size=b * width, device=logits.device)
    proposals = drafts.tolist()
    for r, grammar in rows:
        accepted = 0
        for i in range(width):
            row = r * width + i
            grammar.fill_vocab_mask(mask, row)
            if i == n:
                break
            y = proposals[r][i]
            if not (int(mask[row, y >> 5]) >> (y & 31)) & 1:
                break
            grammar.accept_token(y)
            accepted += 1
            if grammar.is_terminated():
                break
        if accepted:
            grammar.rollback(accepted)
    first.apply_vocab_mask(logits, first.move_vocab_mask(mask, logits.device))


def apply_plain_step_rules(logits: torch.Tensor, batch) -> None:
    """What SGLang's sampler does to one decode position's logits ([b, V], in place) before sampling:
    penalties (exact, ``apply_chain_penalties``), grammar mask, logit bias, custom logit processors."""
    from sglang.srt.layers.sampler import apply_custom_logit_processor

    info = batch.sampling_info
    if has_penalties(batch.reqs):
        apply_chain_penalties(logits[:, None], batch.reqs, logits.new_empty(len(batch.reqs), 0, dtype=torch.long))
    info.acc_additive_penalties = info.acc_scaling_penalties = None  # SGLang's relaxed state: applied above
    info.grammars = _grammars(batch.reqs) if has_grammars(batch.reqs) else None
    info.update_regex_vocab_mask()
    info.apply_logits_bias(logits)
    info.grammar_mask = None
    if info.has_custom_logit_processor:
        apply_custom_logit_processor(logits, info)
