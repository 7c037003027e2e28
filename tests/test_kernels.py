"""The Triton kernels (kernels/rollout.py, kernels/verify.py) held to their torch references.

Without CUDA the kernels run in Triton's interpreter: TRITON_INTERPRET=1 is set below, before Triton and
the kernel modules are imported, since ``triton.jit`` (Triton's own ``tl.max``, ``tl.sigmoid`` ... too)
picks interpreter or compiler at import. When another test module imported Triton first, this process
cannot interpret, and ``test_in_fresh_process`` runs this module in a new Python instead. With CUDA the
same tests run the compiled kernels.
``test_compiles_for_sm90`` additionally compiles every kernel variant for an H100-class GPU on a CPU-only
machine, which the (more lenient) interpreter does not check.

Greedy tokens and accept lengths must be identical. Where the two sides round differently (accumulation
order, exp/sigmoid ulps) a token may legitimately differ only at a near-tie of the reference's own scores;
``_assert_chain`` allows exactly that and nothing else, and probabilities are compared with the reference
teacher-forced along the kernel's tokens.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap

import pytest
import torch

CUDA = torch.cuda.is_available()
_saved_env = os.environ.get("TRITON_INTERPRET")
if not CUDA:
    os.environ["TRITON_INTERPRET"] = "1"
triton = pytest.importorskip("triton")

from sglang_domino.drafter import HeadWeights  # noqa: E402
from sglang_domino.kernels import dispatch  # noqa: E402
from sglang_domino.kernels import rollout as kr  # noqa: E402
from sglang_domino.kernels import verify as kv  # noqa: E402

if _saved_env is None:  # other test modules (server subprocesses ...) keep their environment;
    os.environ.pop("TRITON_INTERPRET", None)  # the fixture below sets it again around each test here
else:
    os.environ["TRITON_INTERPRET"] = _saved_env
from sglang_domino.rollout import correction, gru_cell, input_gates  # noqa: E402
from sglang_domino.rollout import rollout as rollout_ref  # noqa: E402
from sglang_domino.sampling import BatchSampling, SamplingParams, draft_probs, sample_from  # noqa: E402
from sglang_domino.verify import verify_greedy, verify_sampled  # noqa: E402

torch.set_num_threads(2)
DEVICE = "cuda" if CUDA else "cpu"
SEED = int(os.environ.get("SGLANG_DOMINO_TEST_SEED", "0"))  # another value re-draws every random input
RUNS_HERE = CUDA
if not CUDA:
    from triton.runtime.interpreter import InterpretedFunction

    RUNS_HERE = all(isinstance(f, InterpretedFunction)
                    for f in (triton.language.standard.sigmoid, kr._logits_kernel, kv._argmax_partial_kernel))


@pytest.fixture(autouse=True)
def _where_to_run(request, monkeypatch):
    if not RUNS_HERE and request.node.originalname != "test_in_fresh_process":
        pytest.skip("Triton was imported before TRITON_INTERPRET=1: covered by test_in_fresh_process")
    if not CUDA:  # Triton reads it again at launch time
        monkeypatch.setenv("TRITON_INTERPRET", "1")


@pytest.mark.skipif(RUNS_HERE, reason="this process runs the kernel tests itself")
def test_in_fresh_process():
    env = {**os.environ, "TRITON_INTERPRET": "1"}
    proc = subprocess.run([sys.executable, "-m", "pytest", __file__, "-q", "-p", "no:cacheprovider"], env=env,
                          capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, (proc.stdout + proc.stderr)[-6000:]


# -- fixtures -----------------------------------------------------------------------------------------
def _case(b, n, hidden, gru, emb, vocab, dtype, seed=0):
    """Random inputs of a rollout whose correction is large enough to move the argmax."""
    g = torch.Generator().manual_seed(seed + 7919 * SEED)

    def r(*shape, scale=1.0):
        return (torch.randn(*shape, generator=g) * scale).to(dtype).to(DEVICE)

    head = HeadWeights(r(3 * gru, hidden, scale=hidden ** -0.5), r(3 * gru, gru, scale=gru ** -0.5),
                       r(emb, hidden + gru, scale=(hidden + gru) ** -0.5), r(vocab, emb, scale=3 * emb ** -0.5))
    return dict(z=r(b, n, hidden), base_logits=r(b, n, vocab, scale=2.0),
                bonus=torch.randint(0, vocab, (b,), generator=g).to(DEVICE), embed=r(vocab, hidden), head=head)


def _teacher_forced_logits(case, tokens, pure_prefix_len):
    """The reference's step logits [b, n, V] with the GRU reading ``tokens`` (the kernel's chain)."""
    z, base, head, embed = case["z"], case["base_logits"], case["head"], case["embed"]
    b, n, _ = z.shape
    out = base.float().clone()
    if head is None:
        return out
    w_hh = head.w_hh.float()
    s = gru_cell(input_gates(head, embed, case["bonus"]), z.new_zeros(b, w_hh.shape[1], dtype=torch.float32), w_hh)
    for i in range(n):
        if i >= pure_prefix_len:
            out[:, i] += correction(z[:, i], s, head.w1, head.w2).float()
        s = gru_cell(input_gates(head, embed, tokens[:, i]), s, w_hh)
    return out


def _assert_chain(tok, ref, scores, rel_tol, floor=1.0):
    """tok == ref, except that from a row's first difference on, the kernel may have taken a near-tie:
    there ``scores`` (the reference's, along the kernel's chain) of the kernel's token must be within
    rel_tol * max(|best|, floor) of the best (rel_tol: a couple of ulps of the head's dtype). At most one
    row in four may take such a branch."""
    assert tok.shape == ref.shape and tok.dtype == torch.long
    bad = (tok != ref).any(1).nonzero().flatten().tolist()
    assert len(bad) <= max(1, tok.shape[0] // 4), f"rows {bad} differ:\n{tok[bad]}\n{ref[bad]}"
    for r in bad:
        j = int((tok[r] != ref[r]).nonzero()[0])
        best = scores[r, j].max()
        got = scores[r, j, tok[r, j]]
        assert best - got <= rel_tol * best.abs().clamp_min(floor), f"row {r} step {j}: {got} vs best {best}"


# -- rollout ------------------------------------------------------------------------------------------
ROLLOUT_SHAPES = [  # b, n (= block - 1), H, G, E, V, dtype
    (1, 1, 32, 16, 16, 77, torch.float32),
    (3, 6, 40, 24, 20, 300, torch.bfloat16),
    (5, 15, 48, 32, 24, 257, torch.float32),
    (2, 15, 40, 24, 20, 129, torch.bfloat16),
    (17, 4, 72, 16, 16, 200, torch.bfloat16),
    (64, 3, 32, 16, 16, 131, torch.float32),
    (2, 4, 32, 16, 16, 100, torch.float16),
]


@pytest.mark.parametrize("b,n,hidden,gru,emb,vocab,dtype", ROLLOUT_SHAPES)
def test_rollout_greedy(b, n, hidden, gru, emb, vocab, dtype):
    case = _case(b, n, hidden, gru, emb, vocab, dtype)
    tok, q = kr.rollout(**case)
    ref, _ = rollout_ref(**case)
    assert q is None
    _assert_chain(tok, ref, _teacher_forced_logits(case, tok, 1), 1e-5 if dtype == torch.float32 else 2e-2)


def test_rollout_correction_matters():
    """Guard against a vacuous comparison: the head changes the chain of these fixtures."""
    case = _case(4, 8, 40, 24, 20, 300, torch.float32, seed=1)
    with_head, _ = kr.rollout(**case)
    without, _ = kr.rollout(**{**case, "head": None})
    assert (with_head != without).any()
    assert torch.equal(without, case["base_logits"].float().argmax(-1))


@pytest.mark.parametrize("pure_prefix_len,head", [(0, True), (3, True), (1, False)])
def test_rollout_prefix_and_backbone_only(pure_prefix_len, head):
    case = _case(3, 7, 40, 24, 20, 150, torch.bfloat16, seed=2)
    if not head:
        case["head"] = None
    tok, _ = kr.rollout(**case, pure_prefix_len=pure_prefix_len)
    ref, _ = rollout_ref(**case, pure_prefix_len=pure_prefix_len)
    _assert_chain(tok, ref, _teacher_forced_logits(case, tok, pure_prefix_len), 2e-2)


def test_rollout_many_tiles(monkeypatch):
    """Small tiles: several chunks of per-tile partials, several split-K chunks (shorter than a K tile),
    G and E tiles, all ragged, and b > 64 (two row blocks)."""
    tiles = dict(BLOCK_V=16, BLOCK_T=16, K_CHUNK=32, BLOCK_K=64, BLOCK_N=16, BLOCK_G=16, BLOCK_E=16)
    for name, value in tiles.items():
        monkeypatch.setattr(kr, name, value)
    case = _case(70, 3, 72, 24, 20, 301, torch.bfloat16, seed=3)
    tok, _ = kr.rollout(**case)
    ref, _ = rollout_ref(**case)
    _assert_chain(tok, ref, _teacher_forced_logits(case, tok, 1), 2e-2)
    params = [SamplingParams(0.0 if r % 3 == 0 else 0.5 + r / 70) for r in range(70)]
    sampling = BatchSampling.of(params, device=DEVICE)
    noise = torch.empty(70, 3, 301).exponential_(generator=torch.Generator().manual_seed(SEED)).to(DEVICE)
    tok, q = kr.rollout(**case, sampling=sampling, exponential=noise)
    ref, _ = rollout_ref(**case, sampling=sampling, exponential=noise)
    _check_sampled(case, tok, q, ref, sampling, noise, 1)


GATE_TABLE_CASES = [  # a rollout shape, small tiles
    (*ROLLOUT_SHAPES[0], False), (*ROLLOUT_SHAPES[1], False), (*ROLLOUT_SHAPES[2], True),
    (70, 3, 72, 24, 20, 301, torch.bfloat16, True),
]


@pytest.mark.parametrize("b,n,hidden,gru,emb,vocab,dtype,small_tiles", GATE_TABLE_CASES)
def test_rollout_gate_table(b, n, hidden, gru, emb, vocab, dtype, small_tiles, monkeypatch):
    """With the head's gate table the kernel reads E[y] @ w_ih^T from it (no w_ih products): held to the
    reference with the same table, greedy and sampled, and the reference with it to the one without."""
    if small_tiles:
        for name, value in dict(K_CHUNK=32, BLOCK_K=64, BLOCK_N=16, BLOCK_G=16, BLOCK_E=16).items():
            monkeypatch.setattr(kr, name, value)
    plain = _case(b, n, hidden, gru, emb, vocab, dtype, seed=6)
    case = {**plain, "head": plain["head"].with_gate_table(plain["embed"])}
    tol = 1e-5 if dtype == torch.float32 else 2e-2
    tok, _ = kr.rollout(**case)
    ref, _ = rollout_ref(**case)
    _assert_chain(tok, ref, _teacher_forced_logits(case, tok, 1), tol)
    ref_plain, _ = rollout_ref(**plain)
    _assert_chain(ref, ref_plain, _teacher_forced_logits(plain, ref, 1), tol)
    sampling = BatchSampling.of((SAMPLING_MIXES["temperature"] * b)[:b], device=DEVICE)
    noise = torch.empty(b, n, vocab).exponential_(generator=torch.Generator().manual_seed(8 + 7919 * SEED)).to(DEVICE)
    tok, q = kr.rollout(**case, sampling=sampling, exponential=noise)
    ref, _ = rollout_ref(**case, sampling=sampling, exponential=noise)
    _check_sampled(case, tok, q, ref, sampling, noise, 1)


def test_rollout_gate_table_shape_is_checked():
    case = _case(2, 3, 32, 16, 16, 77, torch.float32)
    bad = case["head"]._replace(gate_table=torch.zeros(77, 47, device=DEVICE))
    with pytest.raises(ValueError, match="gate table"):
        kr.rollout(**{**case, "head": bad})


def _assert_probs_close(q, q_ref, dtype):
    """fp32 heads: every probability within 2e-5 + 1e-3 relative. 16-bit heads round the correction to
    their dtype, and a value the two sides accumulate in a different order can round to the neighbouring
    bf16/fp16 value (a few percent of a probability): allow that for one element in a thousand."""
    assert q.shape == q_ref.shape and q.dtype == torch.float32
    off = ~torch.isclose(q, q_ref, atol=2e-5, rtol=1e-3)
    if dtype == torch.float32:
        torch.testing.assert_close(q, q_ref, atol=2e-5, rtol=1e-3)
    else:
        assert int(off.sum()) <= max(1, q.numel() // 1000), f"{int(off.sum())} of {q.numel()} probabilities off"
        torch.testing.assert_close(q, q_ref, atol=1e-3, rtol=5e-2)


def _check_sampled(case, tok, q, ref, sampling, noise, pure_prefix_len):
    q_tf = draft_probs(_teacher_forced_logits(case, tok, pure_prefix_len), sampling)
    _assert_probs_close(q, q_tf, case["z"].dtype)
    rel_tol = 1e-4 if case["z"].dtype == torch.float32 else 5e-2  # see _assert_probs_close
    _assert_chain(tok, ref, q_tf / noise.clamp_min(1e-20), rel_tol, floor=0.0)
    assert torch.equal(tok, sample_from(q, noise))  # the kernel's draw is the race on its own q


SAMPLING_MIXES = {
    "temperature": [SamplingParams(0.7), SamplingParams(0.0), SamplingParams(1.3)],
    "top_k_top_p": [SamplingParams(0.7, top_k=5), SamplingParams(0.0), SamplingParams(1.3, top_p=0.8)],
}


@pytest.mark.parametrize("mix", SAMPLING_MIXES)
@pytest.mark.parametrize("b,n,hidden,gru,emb,vocab,dtype", [ROLLOUT_SHAPES[1], ROLLOUT_SHAPES[2]])
def test_rollout_sampled(b, n, hidden, gru, emb, vocab, dtype, mix):
    case = _case(b, n, hidden, gru, emb, vocab, dtype, seed=4)
    params = (SAMPLING_MIXES[mix] * b)[:b]
    sampling = BatchSampling.of(params, device=DEVICE)
    noise = torch.empty(b, n, vocab).exponential_(generator=torch.Generator().manual_seed(5 + 7919 * SEED)).to(DEVICE)
    tok, q = kr.rollout(**case, sampling=sampling, exponential=noise)
    ref, q_ref = rollout_ref(**case, sampling=sampling, exponential=noise)
    assert q.dtype == torch.float32 and q.shape == q_ref.shape
    _check_sampled(case, tok, q, ref, sampling, noise, 1)


# -- verify -------------------------------------------------------------------------------------------
def _drafts_near(target, g, vocab):
    """Drafts that follow the target's argmax for a random number of steps, then deviate."""
    b, n = target.shape
    draft = target.clone()
    stop = torch.randint(0, n + 1, (b,), generator=g)
    for r in range(b):
        if stop[r] < n:
            draft[r, stop[r]:] = torch.randint(0, vocab, (n - int(stop[r]),), generator=g)
            draft[r, stop[r]] = (target[r, stop[r]] + 1) % vocab
    return draft


@pytest.mark.parametrize("b,n,vocab,dtype,small_tiles", [
    (1, 1, 77, torch.float32, False), (6, 7, 3000, torch.bfloat16, False), (33, 15, 1025, torch.float32, False),
    (4, 15, 5000, torch.float16, False), (1, 1, 77, torch.float32, True), (6, 7, 1000, torch.bfloat16, True),
])
def test_verify_greedy(b, n, vocab, dtype, small_tiles, monkeypatch):
    if small_tiles:
        monkeypatch.setattr(kv, "BLOCK_V", 64)
        monkeypatch.setattr(kv, "CHUNK_TILES", 2)
    g = torch.Generator().manual_seed(b * 100 + n + 7919 * SEED)
    # integer-valued logits in a small range: many exact ties, which must go to the first index
    logits = torch.randint(-20, 20, (b, n + 1, vocab), generator=g).to(dtype)
    draft = _drafts_near(logits.float().argmax(-1)[:, :n], g, vocab)
    logits, draft = logits.to(DEVICE), draft.to(DEVICE)
    got = kv.verify_greedy_commit(draft, logits)
    accept, bonus = verify_greedy(draft, logits)
    assert torch.equal(got.accept_len, accept) and torch.equal(got.bonus, bonus)
    want = dispatch.commit_reference(draft, accept, bonus)
    assert torch.equal(got.commit_len, want.commit_len) and torch.equal(got.tokens, want.tokens)
    assert torch.equal(got.commit_len, accept + 1)
    assert 0 < int(accept.sum()) < b * n or b == 1  # both outcomes are exercised


def _sampled_inputs(b, n, vocab, g, kind):
    q = torch.softmax(torch.randn(b, n, vocab, generator=g) * 2, -1)
    p = torch.softmax(torch.randn(b, n + 1, vocab, generator=g) * 2, -1)
    if kind == "close":  # p near q: long accepted runs, all-accepted rows
        p[:, :n] = 0.8 * q + 0.2 * p[:, :n]
    if kind == "sparse":  # top-k-like supports with exact zeros
        q = q * (q > q.median(-1, keepdim=True).values)
        q = q / q.sum(-1, keepdim=True)
        p = p * (p > p.median(-1, keepdim=True).values)
        p = p / p.sum(-1, keepdim=True)
    if kind == "rounding":  # rejection with an all-zero residual: the p fallback
        p[:, :n] = 0.5 * q
    draft = torch.multinomial(q.reshape(-1, vocab), 1, generator=g).view(b, n)
    if kind == "greedy":  # one-hot p and q
        q = torch.nn.functional.one_hot(q.argmax(-1), vocab).float()
        p = torch.nn.functional.one_hot(p.argmax(-1), vocab).float()
        draft = q.argmax(-1)
        draft[:, 1:] = torch.where(torch.rand(b, n - 1, generator=g) < 0.5, p[:, 1:n].argmax(-1), draft[:, 1:])
    u = torch.rand(b, n, generator=g)
    e = torch.empty(b, vocab).exponential_(generator=g)
    return [t.to(DEVICE) for t in (draft, q, p, u, e)]


@pytest.mark.parametrize("kind", ["random", "close", "sparse", "rounding", "greedy"])
@pytest.mark.parametrize("b,n,vocab", [(5, 7, 3000), (16, 15, 1000), (2, 2, 4097)])
def test_verify_sampled(b, n, vocab, kind, monkeypatch):
    monkeypatch.setattr(kv, "BLOCK_V", 256)
    g = torch.Generator().manual_seed(vocab + n + 7919 * SEED)
    draft, q, p, u, e = _sampled_inputs(b, n, vocab, g, kind)
    got = kv.verify_sampled_commit(draft, q, p, u, e)
    accept, bonus = verify_sampled(draft, q, p, u, e)
    assert torch.equal(got.accept_len, accept), (got.accept_len, accept)
    assert torch.equal(got.bonus, bonus), (got.bonus, bonus)
    want = dispatch.commit_reference(draft, accept, bonus)
    assert torch.equal(got.commit_len, want.commit_len) and torch.equal(got.tokens, want.tokens)


# -- dispatch -----------------------------------------------------------------------------------------
def test_dispatch_routes(monkeypatch):
    case = _case(2, 3, 32, 16, 16, 60, torch.float32, seed=6)
    logits = torch.randn(2, 4, 60, device=DEVICE)
    draft = logits.argmax(-1)[:, :3]
    calls = []

    def spy(fn):
        def wrapped(*args, **kwargs):
            calls.append(fn.__name__)
            return fn(*args, **kwargs)
        return wrapped

    monkeypatch.setattr(kr, "rollout", spy(kr.rollout))
    monkeypatch.setattr(kv, "verify_greedy", spy(kv.verify_greedy))

    monkeypatch.setenv(dispatch.ENV, "torch")
    ref_tok, _ = dispatch.rollout(**case)
    ref_ver = dispatch.verify_greedy(draft, logits)
    ref_commit = dispatch.verify_greedy_commit(draft, logits)
    assert calls == []
    assert not dispatch.use_triton(logits)

    monkeypatch.setenv(dispatch.ENV, "auto")
    assert dispatch.use_triton(logits) == CUDA

    monkeypatch.setenv(dispatch.ENV, "triton")
    tok, _ = dispatch.rollout(**case)
    ver = dispatch.verify_greedy(draft, logits)
    commit = dispatch.verify_greedy_commit(draft, logits)
    assert calls == ["rollout", "verify_greedy"]
    assert torch.equal(tok, ref_tok) and all(torch.equal(a, b) for a, b in zip(ver, ref_ver))
    assert all(torch.equal(a, b) for a, b in zip(commit, ref_commit))

    monkeypatch.setenv(dispatch.ENV, "cuda-please")
    with pytest.raises(ValueError):
        dispatch.use_triton(logits)


# -- compile check (CPU-only machines) ------------------------------------------------------------------
_COMPILE_SCRIPT = textwrap.dedent("""
    import torch
    from triton.backends.compiler import GPUTarget
    from triton.runtime import driver
    from triton.runtime.jit import JITFunction

    class _NoGPU:  # just enough of a driver to compile (never launch) for sm_90
        def get_current_target(self): return GPUTarget("cuda", 90, 32)
        def get_current_device(self): return 0
        def get_current_stream(self, device=None): return 0

    try:
        driver.set_active(_NoGPU())
        _run = JITFunction.run
        JITFunction.run = lambda self, *a, grid, warmup, **k: _run(self, *a, grid=grid, warmup=True, **k)
    except Exception as exc:  # a Triton whose internals moved: nothing to check here
        print("SKIP", exc); raise SystemExit(0)

    from sglang_domino.drafter import HeadWeights
    from sglang_domino.kernels import rollout as kr, verify as kv
    from sglang_domino.sampling import BatchSampling, SamplingParams
    b, n, H, G, E, V = 20, 3, 40, 24, 20, 300
    for dt in (torch.float32, torch.bfloat16):  # fp32 and 16-bit weights differ in their dot precisions
        r = lambda *s: torch.randn(*s).to(dt)
        args = (r(b, n, H), r(b, n, V), torch.zeros(b, dtype=torch.long), r(V, H))
        head = HeadWeights(r(3 * G, H), r(3 * G, G), r(E, H + G), r(V, E))
        kr.rollout(*args, head)
        kr.rollout(*args, head.with_gate_table(args[3]))  # the gate-table variants
    e = torch.ones(b, n, V)
    for sp in (SamplingParams(0.7), SamplingParams(0.7, top_k=3)):  # fused softmax, torch probs
        kr.rollout(*args, head, sampling=BatchSampling.of([sp] * b), exponential=e)
    d = torch.zeros(b, n, dtype=torch.long)
    kv.verify_greedy_commit(d, torch.randn(b, n + 1, V))
    kv.verify_sampled_commit(d, torch.rand(b, n, V), torch.rand(b, n + 1, V), torch.rand(b, n), torch.ones(b, V))
    print("OK")
""")


@pytest.mark.skipif(CUDA, reason="with a GPU the other tests compile and run every kernel")
def test_compiles_for_sm90():
    env = {k: v for k, v in os.environ.items() if k != "TRITON_INTERPRET"}
    proc = subprocess.run([sys.executable, "-c", _COMPILE_SCRIPT], env=env, capture_output=True, text=True,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]
    if proc.stdout.startswith("SKIP"):
        pytest.skip(proc.stdout.strip())
    assert proc.stdout.strip().endswith("OK"), proc.stdout[-2000:]


# -- the benchmark script -------------------------------------------------------------------------------
def test_bench_script_runs(tmp_path):
    """bench/kernels.py end to end at a tiny shape (CPU: reference paths only, labelled as such)."""
    import importlib.util
    import json
    from pathlib import Path

    path = Path(__file__).resolve().parents[1] / "bench" / "kernels.py"
    spec = importlib.util.spec_from_file_location("bench_kernels", path)
    bench = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(bench)
    out = bench.main(["--device", DEVICE, "--models", "tiny", "--batches", "2", "--block", "4",
                      "--warmup", "0", "--iters", "1", "--out", str(tmp_path / "k.json")])
    data = json.loads(out.read_text())
    assert data["cpu_reference_only"] == (not CUDA)
    assert {"command", "commit", "machine", "date"} <= data.keys()
    ops = {(r["op"], r["method"]) for r in data["results"] if "median_us" in r}
    assert ("rollout_greedy", "reference") in ops and ("verify_sampled", "reference") in ops
    assert data["gate_table_mib"]["tiny"] > 0
    assert CUDA != (("rollout_greedy", "reference_table") in ops)
    assert CUDA == (("rollout_greedy", "triton") in ops) == (("rollout_greedy", "triton_table") in ops)
    for check in data["checks"]:  # CUDA: kernel vs reference on the bench's inputs (greedy bf16: near-ties)
        assert check["rows_equal"] >= (1.0 if check["op"] == "verify_sampled" else 0.5), check
