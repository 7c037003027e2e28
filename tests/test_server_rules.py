"""Per-position logit rules of a verify chain (``serving.rules``) against SGLang's own implementations
(no server needed)."""

from __future__ import annotations

import pytest
import torch

from sglang_domino.serving.rules import apply_chain_penalties, has_penalties

penaltylib = pytest.importorskip("sglang.srt.sampling.penaltylib")


def _penalized_reqs():
    from types import SimpleNamespace as NS

    tok = NS(additional_stop_token_ids={7}, eos_token_id=2)

    def req(freq=0.0, pres=0.0, rep=1.0, min_new=0, stop=None):
        params = NS(frequency_penalty=freq, presence_penalty=pres, repetition_penalty=rep, min_new_tokens=min_new,
                    stop_token_ids=stop)
        return NS(sampling_params=params, eos_token_ids={3}, tokenizer=tok, output_ids=[])

    return [req(freq=0.7), req(pres=1.3), req(rep=1.4), req(min_new=5, stop={11}),
            req(freq=0.3, pres=0.2, rep=1.2, min_new=6), req()]


@pytest.mark.parametrize("seed", [0, 1])
def test_chain_penalties_are_sglang_penalizers_advanced_token_by_token(seed):
    """Position i of a verify chain gets exactly what SGLang's own penalizers (penaltylib) give once they have
    counted the outputs so far and the drafts y_1 .. y_i (the summed state that plain decoding applies)."""
    from sglang.srt.sampling.penaltylib.repetition_penalty import apply_scaling_penalties

    class Batch:  # what the orchestrator reads of SGLang's ScheduleBatch
        device = "cpu"

        def __init__(self, reqs):
            self.reqs = reqs

    g = torch.Generator().manual_seed(seed)
    vocab, n_out, n = 40, 3, 4
    reqs = _penalized_reqs()
    b = len(reqs)
    outputs = torch.randint(0, 12, (b, n_out), generator=g)  # small ids: repeats and stop tokens
    drafts = torch.randint(0, 12, (b, n), generator=g)
    logits = torch.randn(b, n + 1, vocab, generator=g) * 3
    batch = Batch(reqs)
    orchestrator = penaltylib.BatchedPenalizerOrchestrator(vocab, batch, {
        penaltylib.BatchedFrequencyPenalizer, penaltylib.BatchedMinNewTokensPenalizer,
        penaltylib.BatchedPresencePenalizer, penaltylib.BatchedRepetitionPenalizer})
    want = logits.clone()
    for t in range(n_out + n + 1):
        if t >= n_out:  # chain position t - n_out: the state after the outputs and the drafts before it
            pos = want[:, t - n_out]
            additive = torch.zeros(b, vocab)
            orchestrator.accumulate_additive_penalties(additive)
            pos.add_(additive)
            apply_scaling_penalties(pos, orchestrator.accumulate_scaling_penalties())
        if t < n_out + n:
            orchestrator.cumulate_output_tokens(outputs[:, t] if t < n_out else drafts[:, t - n_out])

    for r, ids in zip(reqs, outputs.tolist()):
        r.output_ids = ids
    got = logits.clone()
    assert has_penalties(reqs) and not has_penalties(reqs[-1:])
    apply_chain_penalties(got, reqs, drafts)
    assert torch.equal(got, want)
    assert not torch.equal(got, logits)
    # min_new_tokens = 5 holds the stop tokens (3 = EOS, 2, 7, 11) back for two chain positions, then lets go
    assert torch.isinf(got[3, :2, [2, 3, 7, 11]]).all() and torch.isfinite(got[3, 2:]).all()


def test_chain_grammar_masks_follow_the_drafts_and_leave_the_grammar_as_it_was():
    """Position i of a chain gets the mask of the request's grammar after its output so far and y_1 .. y_i,
    as a fresh matcher fed the same tokens gives it; positions after a refused draft stay unmasked, and the
    request's matcher is back where it was."""
    from pathlib import Path
    from types import SimpleNamespace as NS

    from transformers import AutoTokenizer

    from sglang_domino.serving.rules import apply_chain_grammars, has_grammars

    backend_mod = pytest.importorskip("sglang.srt.constrained.xgrammar_backend")
    model = Path(__file__).resolve().parents[1] / "models" / "SmolLM2-135M-Instruct"
    if not (model / "config.json").exists():
        pytest.skip(f"{model} missing")
    tok = AutoTokenizer.from_pretrained(model)
    vocab = 49152
    backend = backend_mod.XGrammarGrammarBackend(tok, vocab_size=vocab, model_eos_token_ids=[tok.eos_token_id])
    ha, done = tok(" ha")["input_ids"], tok(" done")["input_ids"]
    assert len(ha) == len(done) == 1
    first = tok("ha")["input_ids"]
    grammars = [backend.dispatch_regex("ha( ha){2} done( ha)*"), None, backend.dispatch_regex("ha( ha)*")]
    drafts = torch.tensor([ha + ha + done + ha, ha + ha + ha + ha, ha + done + ha + ha])  # row 2: " done" refused
    reqs = [NS(grammar=g) for g in grammars]
    for g in grammars[::2]:
        for t in first:
            g.accept_token(t)
    b, n = drafts.shape
    logits = torch.randn(b * (n + 1), vocab, generator=torch.Generator().manual_seed(0))
    got = logits.clone()
    assert has_grammars(reqs)
    apply_chain_grammars(got, reqs, drafts, vocab)

    def allowed(grammar):
        mask = grammar.allocate_vocab_mask(vocab, 1, "cpu")
        grammar.fill_vocab_mask(mask, 0)
        row = torch.zeros(1, vocab)
        grammar.apply_vocab_mask(row, mask)
        return torch.isfinite(row[0])

    def allowed_after(grammar, tokens):
        fresh = grammar.copy()
        for t in first + tokens:
            fresh.accept_token(t)
        return allowed(fresh)

    got = got.view(b, n + 1, vocab)
    assert torch.equal(got[1], logits.view(b, n + 1, vocab)[1])  # no grammar: untouched
    for i in range(n + 1):
        want = allowed_after(grammars[0], drafts[0, :i].tolist())
        assert torch.equal(torch.isfinite(got[0, i]), want), i
    assert torch.isfinite(got[0, 2, done[0]]) and not torch.isfinite(got[0, 2, ha[0]])  # "ha ha ha": " done" due
    assert torch.isfinite(got[0, 3, ha[0]]) and not torch.isfinite(got[0, 3, done[0]])
    for i in range(2):
        assert torch.equal(torch.isfinite(got[2, i]), allowed_after(grammars[2], drafts[2, :i].tolist())), i
    assert not torch.isfinite(got[2, 1, done[0]])  # y_2 = " done" is refused at position 1 ...
    assert torch.isfinite(got[2, 2:]).all()  # ... so the positions after it are never used: left unmasked
    for g in grammars[::2]:  # rolled back: the matcher allows what it allowed before
        assert torch.equal(allowed(g), allowed_after(g, []))
        assert g.accepted_tokens == first
