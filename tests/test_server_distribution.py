"""Lossless sampling, end to end: what a real DOMINO server samples is distributed as the target's own.

A DOMINO server with the committed drafter verifies ``[bonus, y_1, y_2, y_3]`` at every decode step, at any
batch size, and draws each request's first three tokens; every batch mixes three sampling settings (top-k at
temperature 1, and top-p with min-p at temperature 0.7, on a chat prompt; top-k with frequency, presence and repetition
penalties on " ha ha" text, where the penalties act within the three tokens) with greedy requests. The joint
distribution of the three tokens is compared with the target's exact one (Transformers forwards, SGLang's
sampling conventions) by a chi-square goodness-of-fit test over every triple with an expected count of at
least 5, the rest pooled. Token 1 comes from the prefill; tokens 2 and 3 from verify steps, where a draft is
kept with probability min(1, p/q) and a rejected one is replaced by a draw from the residual max(p - q, 0),
p penalized for the drafts before it: a mistake there moves mass between triples.

Two controls keep the test honest: a plain server's samples pass the same test (the reference distribution is
SGLang's, not just ours), and the DOMINO samples fail it against the target at a temperature 0.25 away, and
without the penalties or the min-p where they are set (the sample is large enough to see a difference of that
size: in 100 simulated samples from the exact distribution of each setting, all failed against each near miss
but one sample against the one without min-p). A server whose verify drew a rejected draft's replacement from
p instead of the residual failed the top-k and top-p settings (p = 1.6e-11 and 1.8e-15, the top-p one then
without min-p; a one-off check by hand). Three tokens are too few to see a chain that applies its first
position's penalties to every position (that passed here); the greedy chain tests of ``test_server.py`` catch
it. Servers run with ``--random-seed 0``.
"""

from __future__ import annotations

import os
from collections import Counter
from pathlib import Path

import pytest
import requests
import torch

from sglang_domino.policy import policy_env
from sglang_domino.serving.sampling import sglang_probs
from sglang_domino.serving.server import Server, free_port, preset_args, start_all

from server_setup import DEVICE, DRAFTER, MODEL

pytestmark = [pytest.mark.server, pytest.mark.slow]

POEM = "Write a short poem about the sea."  # a chat prompt
HA = "ha ha ha ha ha ha"  # plain text: " ha" again is likely, so penalties matter within three tokens
SETTINGS = {  # name: (prompt, sampling parameters)
    "top-k": (POEM, {"temperature": 1.0, "top_k": 8}),
    "top-p": (POEM, {"temperature": 0.7, "top_p": 0.9, "min_p": 0.05}),
    "penalties": (HA, {"temperature": 1.0, "top_k": 8, "frequency_penalty": 0.4, "presence_penalty": 0.3,
                       "repetition_penalty": 1.2}),
}
SAMPLES = 720  # per setting
PER_CALL = 24  # requests per setting in one /generate call, beside GREEDY_PER_CALL greedy ones
GREEDY_PER_CALL = 4
MIN_EXPECTED = 5.0
ALPHA = 1e-3


@pytest.fixture(scope="module")
def prompt_ids():
    """Token ids of each prompt: POEM with the chat template, HA as it is."""
    if not (Path(MODEL) / "config.json").exists():
        pytest.skip(f"{MODEL} missing: run `python -m sglang_domino.models` first")
    from transformers import AutoTokenizer

    from sglang_domino.hf.target import chat_input_ids

    tok = AutoTokenizer.from_pretrained(MODEL)
    return {POEM: chat_input_ids(tok, POEM)[0].tolist(), HA: tok(HA)["input_ids"]}


@pytest.fixture(scope="module")
def servers(tmp_path_factory, prompt_ids):
    logs = Path(os.environ.get("SGLANG_DOMINO_TEST_LOG_DIR") or tmp_path_factory.mktemp("server-logs"))
    seed = ["--random-seed", "0"]  # the samples (so the p-values) repeat from run to run
    domino = Server(MODEL, free_port(), preset_args("domino", device=DEVICE, draft=str(DRAFTER)) + seed,
                    env=policy_env("always", max_batch=0, widths=[4]),  # draft at every step and batch size
                    log_path=str(logs / "domino-distribution.log"))
    # without overlap scheduling, as the DOMINO worker runs: with it, SGLang's plain decoding counts a
    # penalized token a step late (its sampled triples failed this test against the penalized target)
    baseline = Server(MODEL, free_port(),
                      preset_args("baseline", device=DEVICE) + seed + ["--disable-overlap-schedule"],
                      log_path=str(logs / "baseline-distribution.log"))
    try:
        yield start_all([domino, baseline], 600)
    finally:
        domino.stop()
        baseline.stop()


def sample(server, prompt_ids) -> tuple[dict[str, list[tuple]], list[list[int]], list[dict]]:
    """SAMPLES first-three-token triples per setting, the greedy requests' outputs and every request's
    meta_info, from /generate calls that each carry PER_CALL requests per setting and GREEDY_PER_CALL greedy
    ones (one batch)."""
    ids = [prompt_ids[SETTINGS[name][0]] for name in SETTINGS for _ in range(PER_CALL)]
    ids += [prompt_ids[POEM]] * GREEDY_PER_CALL
    params = [dict(SETTINGS[name][1]) for name in SETTINGS for _ in range(PER_CALL)]
    params += [{"temperature": 0.0} for _ in range(GREEDY_PER_CALL)]
    for p in params:
        p.update(max_new_tokens=3, ignore_eos=True)
    triples, greedy, metas = {name: [] for name in SETTINGS}, [], []
    for _ in range(SAMPLES // PER_CALL):
        r = requests.post(server.url + "/generate", json={"input_ids": ids, "sampling_params": params}, timeout=600)
        r.raise_for_status()
        outs = r.json()
        for i, name in enumerate(SETTINGS):
            triples[name] += [tuple(o["output_ids"]) for o in outs[i * PER_CALL:(i + 1) * PER_CALL]]
        greedy += [o["output_ids"] for o in outs[len(SETTINGS) * PER_CALL:]]
        metas += [o["meta_info"] for o in outs]
    return triples, greedy, metas


@pytest.fixture(scope="module")
def domino_samples(servers, prompt_ids):
    return sample(servers[0], prompt_ids)


@pytest.fixture(scope="module")
def baseline_samples(servers, prompt_ids):
    return sample(servers[1], prompt_ids)


@pytest.fixture(scope="module")
def target(prompt_ids):
    from sglang_domino.hf.target import load_target

    return load_target(MODEL, torch.float32)[0]


def exact_triples(target, ids, temperature: float, top_k: int = 1 << 30, top_p: float = 1.0, min_p: float = 0.0,
                  frequency_penalty: float = 0.0, presence_penalty: float = 0.0,
                  repetition_penalty: float = 1.0) -> dict[tuple, float]:
    """Every triple of next tokens whose probability under the target (SGLang's sampling conventions, the
    penalties counting the triple's tokens before each one) is at least MIN_EXPECTED / SAMPLES, with that
    probability: one batched forward per token, over the prefixes still that likely (a triple is no likelier
    than its prefixes)."""
    probs = {(): 1.0}
    for _ in range(3):
        prefixes = list(probs)
        with torch.no_grad():
            logits = target(torch.tensor([list(ids) + list(p) for p in prefixes])).logits[:, -1].float()
        for row, prefix in zip(logits, prefixes):
            for t, count in Counter(prefix).items():
                row[t] -= frequency_penalty * count + presence_penalty
                row[t] = row[t] * repetition_penalty if row[t] < 0 else row[t] / repetition_penalty
        k = len(prefixes)
        rows = sglang_probs(logits[:, None], torch.full((k,), temperature), torch.full((k,), top_k),
                            torch.full((k,), top_p), torch.full((k,), min_p))
        joint = torch.tensor([probs[p] for p in prefixes], dtype=torch.float64)[:, None] * rows[:, 0].double()
        likely = (joint * SAMPLES >= MIN_EXPECTED).nonzero().tolist()
        probs = {prefixes[i] + (t,): float(joint[i, t]) for i, t in likely}
    return probs


def chi_square_p(observed: list[tuple], expected: dict[tuple, float]) -> float:
    """p-value of Pearson's goodness-of-fit test of the observed triples against ``expected`` (probabilities
    of the likely triples); the other triples form one category, which takes the least likely listed ones
    until its expected count is MIN_EXPECTED too."""
    n = len(observed)
    counts = Counter(observed)
    cats = sorted(expected, key=expected.get)
    rest = 1.0 - sum(expected.values())
    while cats and rest * n < MIN_EXPECTED:
        rest += expected[cats.pop(0)]
    obs = [counts[c] for c in cats] + [n - sum(counts[c] for c in cats)]
    exp = [expected[c] * n for c in cats] + [max(rest, 0.0) * n]
    stat = sum((o - e) ** 2 / e for o, e in zip(obs, exp) if e > 0)
    df = torch.tensor((len(obs) - 1) / 2, dtype=torch.float64)
    return float(torch.special.gammaincc(df, torch.tensor(stat / 2, dtype=torch.float64)))


def wrong_references(params: dict) -> list[dict]:
    """Sampling parameters near ``params`` whose distribution the samples must be told apart from."""
    wrong = [{**params, "temperature": params["temperature"] + shift} for shift in (-0.25, 0.25)]
    if any(k.endswith("_penalty") for k in params):
        wrong.append({k: v for k, v in params.items() if not k.endswith("_penalty")})
    if "min_p" in params:
        wrong.append({k: v for k, v in params.items() if k != "min_p"})
    return wrong


@pytest.mark.parametrize("name", list(SETTINGS))
def test_domino_samples_follow_the_target(name, domino_samples, baseline_samples, target, prompt_ids):
    prompt, params = SETTINGS[name]
    expected = exact_triples(target, prompt_ids[prompt], **params)
    assert len(expected) >= 8, "too few likely triples for a meaningful test: choose another prompt"
    p_domino = chi_square_p(domino_samples[0][name], expected)
    p_plain = chi_square_p(baseline_samples[0][name], expected)
    assert p_plain > ALPHA, f"the reference is off: plain server's samples p = {p_plain:.2e}"
    assert p_domino > ALPHA, f"DOMINO samples are not the target's distribution: p = {p_domino:.2e}"
    for wrong in wrong_references(params):  # power: the same samples against a near miss must fail
        p = chi_square_p(domino_samples[0][name], exact_triples(target, prompt_ids[prompt], **wrong))
        assert p < ALPHA, f"the test cannot tell {wrong} from {params}: p = {p:.2e}"


def test_sampled_steps_drafted_and_rejected(domino_samples):
    """The verify path ran: drafts were both accepted and rejected (3 tokens take one verify step when both
    drafts are kept, two when the first is rejected)."""
    metas = domino_samples[2]
    assert all(m["spec_verify_ct"] >= 1 for m in metas)
    lengths = [m["completion_tokens"] / m["spec_verify_ct"] for m in metas]
    assert min(lengths) < 3 and max(lengths) > 1.5, (min(lengths), max(lengths))


def test_greedy_requests_in_sampled_batches_match_plain_decoding(domino_samples, baseline_samples):
    plain = baseline_samples[1]
    assert len(set(map(tuple, plain))) == 1
    assert all(out == plain[0] for out in domino_samples[1])
