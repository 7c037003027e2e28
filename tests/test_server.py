"""End-to-end tests of ``--speculative-algorithm DOMINO`` against real SGLang server processes.

Two servers on 127.0.0.1 serve SmolLM2-135M-Instruct (float32, CPU engine when no GPU): a plain
baseline and a DOMINO server. Its drafter is made here with ``init_drafter`` + ``save_drafter``: the
random drafter with its backbone layers zeroed ("echo" drafter: it proposes the anchor token again,
then the mask token, chosen as " ha"), so that ordinary prompts see almost no accepted drafts while a
" ha ha ha" prompt gets whole blocks accepted. Greedy output must match the baseline token for token
either way, and stop strings / EOS / max_tokens must end exactly as in plain decoding. The baseline runs
without overlap scheduling, as the DOMINO worker does: with it, SGLang's own plain decoding gave different
repetition-penalized output.

Environment: SGLANG_DOMINO_TEST_MODEL (default models/SmolLM2-135M-Instruct),
SGLANG_DOMINO_TEST_DEVICE (cpu unless CUDA is available), SGLANG_DOMINO_TEST_LOG_DIR (server logs).
"""

from __future__ import annotations

import concurrent.futures as cf
import json
import os
import time
from pathlib import Path

import pytest
import requests
import torch

from sglang_domino.policy import policy_env
from sglang_domino.serving.server import Server, free_port, preset_args, sse_events, start_all

from server_setup import DEVICE, MODEL

pytestmark = [pytest.mark.server, pytest.mark.slow]

HA = 421  # " ha" in SmolLM2's vocabulary: greedy decoding of "ha ha ha ..." repeats it
BLOCK = 8
TIMEOUT = 600
# Drafting is switched off above this decode batch size: the 20-request parity test and the 8-request
# sampling test start with it off and switch it on as requests finish; single requests always draft.
MAX_DRAFT_BATCH = 6


def _need_model():
    if not (Path(MODEL) / "config.json").exists():
        pytest.skip(f"{MODEL} missing: run `python -m sglang_domino.models` first")


def make_echo_drafter(out: Path, block_size: int = BLOCK, mask_token_id: int = HA) -> Path:
    from transformers import AutoConfig

    from sglang_domino.drafter import save_drafter
    from sglang_domino.models import init_drafter

    drafter = init_drafter(AutoConfig.from_pretrained(MODEL), block_size=block_size)
    with torch.no_grad():
        for layer in drafter.layers:
            layer.self_attn.o_proj.weight.zero_()
            layer.mlp.down_proj.weight.zero_()
    drafter.config.mask_token_id = mask_token_id
    save_drafter(drafter, out, dtype=torch.float32)
    return out


def _log_dir(tmp_path_factory) -> Path:
    d = os.environ.get("SGLANG_DOMINO_TEST_LOG_DIR")
    return Path(d) if d else tmp_path_factory.mktemp("server-logs")


@pytest.fixture(scope="module")
def echo_drafter_dir(tmp_path_factory):
    _need_model()
    return make_echo_drafter(tmp_path_factory.mktemp("drafter") / "echo")


@pytest.fixture(scope="module")
def domino_and_baseline_servers(tmp_path_factory, echo_drafter_dir):
    """(domino, baseline) servers, started together and stopped at the end of the module."""
    logs = _log_dir(tmp_path_factory)
    domino = Server(MODEL, free_port(), preset_args("domino", device=DEVICE, draft=str(echo_drafter_dir)),
                    env=policy_env("always", MAX_DRAFT_BATCH),
                    log_path=str(logs / "domino.log"))
    baseline = Server(MODEL, free_port(), preset_args("baseline", device=DEVICE) + ["--disable-overlap-schedule"],
                      log_path=str(logs / "baseline.log"))
    try:
        start_all([domino, baseline], TIMEOUT)
        yield domino, baseline
    finally:
        domino.stop()
        baseline.stop()


@pytest.fixture(scope="module")
def domino_server(domino_and_baseline_servers):
    return domino_and_baseline_servers[0]


@pytest.fixture(scope="module")
def baseline_server(domino_and_baseline_servers):
    return domino_and_baseline_servers[1]


# -- request helpers ------------------------------------------------------------------------------------
def post_ok(server, path, body):
    """POST a JSON body; the JSON answer (an HTTP error raises)."""
    r = requests.post(server.url + path, json=body, timeout=TIMEOUT)
    r.raise_for_status()
    return r.json()


def generate(server, text, **params):
    return post_ok(server, "/generate", {"text": text, "sampling_params": params})


def completion(server, prompt, stream=False, **params):
    body = {"model": "m", "prompt": prompt, "stream": stream, **params}
    return _openai(server, "/v1/completions", body, stream, lambda c: c["text"])


def chat(server, content, stream=False, **params):
    body = {"model": "m", "messages": [{"role": "user", "content": content}], "stream": stream, **params}
    return _openai(server, "/v1/chat/completions", body, stream,
                   lambda c: (c.get("delta") or c.get("message") or {}).get("content") or "")


def _openai(server, path, body, stream, text_of):
    r = requests.post(server.url + path, json=body, timeout=TIMEOUT, stream=stream)
    r.raise_for_status()
    if not stream:
        d = r.json()
        return text_of(d["choices"][0]), d["choices"][0]["finish_reason"]
    text, finish = "", None
    for event in sse_events(r):
        choice = event["choices"][0]
        text += text_of(choice)
        finish = choice.get("finish_reason") or finish
    return text, finish


def loads(server):
    return server.get("/v1/loads")["loads"][0]


def wait_idle(server, used_tokens: int | None = None, timeout: float = 60):
    """Wait until no request runs (and, if given, KV usage is back to used_tokens). Load snapshots are
    published periodically, so poll."""
    deadline = time.time() + timeout
    last = None
    while time.time() < deadline:
        last = loads(server)
        if last["num_running_reqs"] == 0 and last["num_waiting_reqs"] == 0 and (
                used_tokens is None or last["num_used_tokens"] == used_tokens):
            return last
        time.sleep(2)
    return last


CHAT_PROMPTS = [
    "Write a python function that computes fibonacci numbers.",
    "What is the capital of France? Answer in one sentence.",
    "Give me three tips for staying focused while studying.",
    "Explain what a hash table is to a child.",
    "Translate 'good morning, my friend' into Spanish.",
    "List the planets of the solar system.",
]
TEXT_PROMPTS = [
    "The quick brown fox",
    "In 1492, Christopher Columbus",
    "def is_prime(n):\n",
    "Once upon a time, in a small village,",
    "ha ha ha ha ha ha ha ha ha ha",
    "The three primary colors are",
    "import numpy as np\n\n",
    "Water boils at",
]


# -- tests --------------------------------------------------------------------------------------------
def test_greedy_parity_token_for_token(domino_server, baseline_server):
    """>= 20 greedy requests (generate ids, completions, chat; streaming and not) run concurrently on
    both servers and must agree exactly."""
    jobs = []
    for p in TEXT_PROMPTS:
        jobs.append(("generate", p, False))
    for i, p in enumerate(TEXT_PROMPTS[:6]):
        jobs.append(("completion", p, i % 2 == 1))
    for i, p in enumerate(CHAT_PROMPTS):
        jobs.append(("chat", p, i % 2 == 0))
    assert len(jobs) >= 20

    def run(server, job):
        kind, prompt, stream = job
        if kind == "generate":
            d = generate(server, prompt, max_new_tokens=24, temperature=0)
            return d["output_ids"], d["meta_info"]["finish_reason"]["type"]
        if kind == "completion":
            return completion(server, prompt, stream=stream, max_tokens=24, temperature=0)
        return chat(server, prompt, stream=stream, max_tokens=24, temperature=0)

    with cf.ThreadPoolExecutor(2 * len(jobs)) as ex:
        futs = {(name, i): ex.submit(run, server, job)
                for name, server in (("domino", domino_server), ("baseline", baseline_server))
                for i, job in enumerate(jobs)}
        results = {k: f.result() for k, f in futs.items()}
    mismatches = [(jobs[i], results[("domino", i)], results[("baseline", i)])
                  for i in range(len(jobs)) if results[("domino", i)] != results[("baseline", i)]]
    assert not mismatches, f"{len(mismatches)}/{len(jobs)} differ, e.g. {mismatches[0]}"


def test_accepted_blocks_and_reported_accept_length(domino_server, baseline_server):
    d = generate(domino_server, "ha ha ha ha ha ha ha ha ha ha", max_new_tokens=40, temperature=0)
    b = generate(baseline_server, "ha ha ha ha ha ha ha ha ha ha", max_new_tokens=40, temperature=0)
    assert d["output_ids"] == b["output_ids"]
    meta = d["meta_info"]
    assert meta["spec_verify_ct"] >= 1
    assert meta["spec_accept_length"] > 2.5, meta  # whole blocks of " ha" are accepted
    assert meta["spec_verify_ct"] < 40
    # the server-wide average, where this SGLang build publishes it
    state = domino_server.get("/server_info")["internal_states"][0]
    if "avg_spec_accept_length" in state:
        assert state["avg_spec_accept_length"] > 1.0


@pytest.mark.parametrize("case", [
    dict(max_new_tokens=11),  # lands inside an accepted block of " ha"
    dict(max_new_tokens=40, stop=["ha ha ha ha"]),
    dict(max_new_tokens=40, stop=["haa"]),  # the greedy run has " haa" after 17 " ha"
    dict(max_new_tokens=40, stop_token_ids=[81]),
    dict(max_new_tokens=40, stop=[" ha ha"], no_stop_trim=True),
])
def test_stop_conditions_inside_accepted_blocks(domino_server, baseline_server, case):
    prompt = "ha ha ha ha ha ha ha ha ha ha"
    with cf.ThreadPoolExecutor(2) as ex:
        d, b = ex.map(lambda s: generate(s, prompt, temperature=0, **case), (domino_server, baseline_server))
    assert d["text"] == b["text"]
    assert d["output_ids"] == b["output_ids"]
    assert d["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"]
    assert d["meta_info"]["completion_tokens"] == b["meta_info"]["completion_tokens"]


def test_eos_and_openai_stop_match_plain_decoding(domino_server, baseline_server):
    cases = [("chat", "Say hello.", dict(max_tokens=64)),
             ("chat", "Count from 1 to 10.", dict(max_tokens=64, stop=["5"])),
             ("completion", "ha ha ha ha ha ha", dict(max_tokens=30, stop=["ha ha ha"]))]
    for kind, prompt, params in cases:
        fn = chat if kind == "chat" else completion
        with cf.ThreadPoolExecutor(4) as ex:
            futs = [ex.submit(fn, s, prompt, stream=st, temperature=0, **params)
                    for s in (domino_server, baseline_server) for st in (False, True)]
            d, ds, b, bs = [f.result() for f in futs]
        assert d == b == ds == bs, (kind, prompt, d, b, ds, bs)


PER_TOKEN_RULES = {
    "frequency": dict(frequency_penalty=1.0),
    "presence": dict(presence_penalty=1.5),
    "repetition": dict(repetition_penalty=1.3),
    "min_new_tokens": dict(min_new_tokens=30),
    "regex": dict(regex="(ha ){3}[a-z]+"),
    "json_schema": dict(json_schema=json.dumps(
        {"type": "object", "properties": {"name": {"type": "string"}}, "required": ["name"]})),
    "ebnf": dict(ebnf='root ::= "ha" (" ha")* " done"'),
}


def test_logit_rules_that_change_per_token_match_plain_decoding(domino_server, baseline_server):
    """Penalties, min_new_tokens and grammars depend on the tokens before; they are applied at every chain
    position (before, DOMINO ignored penalties and gave HTTP 500 'Grammar accept_token failed'). All run at
    once, beside requests without them that share their batches; every output must equal the baseline's, and
    each rule must change its output."""
    ha = "ha ha ha ha ha ha ha ha ha ha"  # the echo drafter's whole blocks are accepted here
    short = ("<|im_start|>user\nWhat is the capital of France? Answer with one word.<|im_end|>\n"
             "<|im_start|>assistant\n")  # ends early, at EOS, unless min_new_tokens holds it
    jobs = {(rule, p): dict(max_new_tokens=32, temperature=0, **params)
            for rule, params in PER_TOKEN_RULES.items() for p in (ha, short)}
    jobs.update({("none", p): dict(max_new_tokens=32, temperature=0) for p in (ha, short)})
    servers = (("domino", domino_server), ("baseline", baseline_server))
    with cf.ThreadPoolExecutor(2 * len(jobs)) as ex:
        futs = {(name, job): ex.submit(generate, server, job[1], **params)
                for name, server in servers for job, params in jobs.items()}
        out = {k: f.result() for k, f in futs.items()}
    for job in jobs:
        d, b = out[("domino", job)], out[("baseline", job)]
        assert d["output_ids"] == b["output_ids"], (job, d["text"], b["text"])
        assert d["meta_info"]["finish_reason"] == b["meta_info"]["finish_reason"], job
    for rule in PER_TOKEN_RULES:
        p = short if rule == "min_new_tokens" else ha
        assert out[("domino", (rule, p))]["output_ids"] != out[("domino", ("none", p))]["output_ids"], \
            f"{rule} changed nothing: this test would show nothing"


@pytest.mark.parametrize("params", [
    dict(frequency_penalty=0.1), dict(presence_penalty=0.5), dict(min_new_tokens=30),
    dict(frequency_penalty=0.05, repetition_penalty=1.01), dict(regex="ha( ha){6} done( ha)+"),
    dict(ebnf='root ::= "ha" (" ha")* " done"', frequency_penalty=0.05)])
def test_rules_inside_accepted_chains_match_plain_decoding(params, domino_server, baseline_server):
    """Mild penalties and grammars on the echo drafter's " ha ha" text: whole chains are accepted while the
    penalty grows with every " ha", until it turns the target away, possibly in the middle of a chain; position
    i of a chain must see the penalty and the grammar state after the drafts before it, or the output would
    part from plain decoding's."""
    ha = "ha ha ha ha ha ha ha ha ha ha"
    d, b = (generate(s, ha, max_new_tokens=32, temperature=0, **params) for s in (domino_server, baseline_server))
    assert d["output_ids"] == b["output_ids"], (d["text"], b["text"])
    meta = d["meta_info"]
    assert meta["completion_tokens"] / meta["spec_verify_ct"] > 2, "no chain was accepted: this shows nothing"
    if "min_new_tokens" not in params:
        plain = generate(domino_server, ha, max_new_tokens=32, temperature=0)["output_ids"]
        assert d["output_ids"] != plain, "the rule changed nothing: this shows nothing"


@pytest.mark.parametrize("params", [dict(frequency_penalty=0.1), dict(regex="ha( ha){6} done( ha)+")])
def test_logprobs_inside_accepted_chains_with_rules_match_plain_decoding(params, domino_server, baseline_server):
    """Logprobs of tokens committed inside accepted chains under a penalty or a grammar: the values and top-3
    lists of plain decoding."""
    body = {"text": "ha ha ha ha ha ha ha ha ha ha", "return_logprob": True, "top_logprobs_num": 3,
            "sampling_params": {"max_new_tokens": 16, "temperature": 0, **params}}
    d, b = (post_ok(s, "/generate", body) for s in (domino_server, baseline_server))
    assert d["output_ids"] == b["output_ids"]
    assert d["meta_info"]["spec_verify_ct"] <= 8, "no chain was accepted: this shows nothing"
    logprobs = [[t[0] for t in r["meta_info"]["output_token_logprobs"]] for r in (d, b)]
    assert logprobs[0] == pytest.approx(logprobs[1], abs=1e-3)
    tops = [[[t[1] for t in row] for row in r["meta_info"]["output_top_logprobs"]] for r in (d, b)]
    assert tops[0] == tops[1] and len(tops[0]) == 16


def test_per_token_rules_with_logprobs_and_sampling(domino_server, baseline_server):
    """Penalties in a logprob batch (its steps are verifies, 1-wide where it cannot draft) are applied as
    SGLang's sampler applies them. Sampled requests with penalties complete."""
    body = {"text": "ha ha ha ha ha ha ha ha ha ha", "return_logprob": True,
            "sampling_params": {"max_new_tokens": 24, "temperature": 0, "frequency_penalty": 1.0}}
    d, b = (post_ok(s, "/generate", body) for s in (domino_server, baseline_server))
    assert d["output_ids"] == b["output_ids"]
    assert len(d["meta_info"]["output_token_logprobs"]) == 24
    sampled = generate(domino_server, "Write a poem.", max_new_tokens=20, temperature=0.8, presence_penalty=0.5,
                       repetition_penalty=1.1, ignore_eos=True)
    assert sampled["meta_info"]["completion_tokens"] == 20


def test_top_logprobs_parallel_samples_and_stop_regex_match_plain_decoding(domino_server, baseline_server):
    ha = "ha ha ha ha ha ha ha ha ha ha"
    calls = [
        ("/generate", {"text": ha, "return_logprob": True, "top_logprobs_num": 3,
                       "sampling_params": {"max_new_tokens": 12, "temperature": 0}}),
        ("/generate", {"text": ha, "sampling_params": {"max_new_tokens": 40, "temperature": 0, "stop_regex": "haa"}}),
        ("/v1/completions", {"model": "m", "prompt": ha, "max_tokens": 12, "temperature": 0, "n": 2}),
    ]

    def run(server, path, body):
        d = post_ok(server, path, body)
        if path == "/v1/completions":
            return [c["text"] for c in d["choices"]]
        meta = d["meta_info"]
        return (d["output_ids"], meta["finish_reason"],
                [[t[1] for t in row] for row in meta.get("output_top_logprobs") or []])

    for path, body in calls:
        d, b = run(domino_server, path, body), run(baseline_server, path, body)
        assert d == b, (path, body, d, b)
    assert len(run(domino_server, *calls[0])[2]) == 12  # a top-3 list per output token


def test_concurrent_mixed_sampling_completes_and_frees_kv(domino_server):
    start = wait_idle(domino_server)
    params = [
        dict(temperature=0), dict(temperature=0.7), dict(temperature=1.0, top_p=0.9),
        dict(temperature=0.8, top_k=20), dict(temperature=0.6, top_k=50, top_p=0.8),
        dict(temperature=1.2, min_p=0.1), dict(temperature=0), dict(temperature=0.9, top_p=0.5, top_k=5),
    ]
    prompts = ["ha ha ha ha ha ha", *CHAT_PROMPTS, "The quick brown fox"][: len(params)]

    def run(i):
        return generate(domino_server, prompts[i], max_new_tokens=20, ignore_eos=True, **params[i])

    with cf.ThreadPoolExecutor(len(params)) as ex:
        outs = list(ex.map(run, range(len(params))))
    for out in outs:
        assert out["meta_info"]["completion_tokens"] == 20
        assert out["meta_info"]["finish_reason"]["type"] == "length"
        assert all(0 <= t < 49152 for t in out["output_ids"])
    end = wait_idle(domino_server, start["num_used_tokens"])
    assert end["num_used_tokens"] == start["num_used_tokens"], (start, end)


def test_sampled_output_distribution_is_plausible(domino_server):
    """Sanity check of lossless sampling at T > 0: top_k=1 behaves greedy; very low temperature
    matches the greedy output."""
    prompt = "The three primary colors are"
    greedy = generate(domino_server, prompt, max_new_tokens=12, temperature=0)["output_ids"]
    topk1 = generate(domino_server, prompt, max_new_tokens=12, temperature=1.0, top_k=1)["output_ids"]
    cold = generate(domino_server, prompt, max_new_tokens=12, temperature=1e-3)["output_ids"]
    assert topk1 == greedy
    assert cold == greedy


def test_abort_mid_stream_frees_request(domino_server):
    start = wait_idle(domino_server)
    body = {"text": "ha ha ha ha ha ha", "stream": True,
            "sampling_params": {"max_new_tokens": 400, "temperature": 0, "ignore_eos": True}}
    with requests.post(domino_server.url + "/generate", json=body, stream=True, timeout=TIMEOUT) as r:
        chunks = 0
        for line in r.iter_lines():
            if line.startswith(b"data:"):
                chunks += 1
                if chunks >= 3:
                    break
    # the connection is closed: the server must abort the request and release its KV
    end = wait_idle(domino_server, start["num_used_tokens"], timeout=120)
    assert end["num_running_reqs"] == 0
    assert end["num_used_tokens"] == start["num_used_tokens"], (start, end)


def test_bad_request_is_4xx_while_others_continue(domino_server):
    def good():
        return generate(domino_server, "Once upon a time,", max_new_tokens=16, temperature=0, ignore_eos=True)

    with cf.ThreadPoolExecutor(1) as ex:
        fut = ex.submit(good)
        time.sleep(1.0)
        bad = [
            requests.post(domino_server.url + "/v1/completions",
                          json={"model": "m", "prompt": "hi", "max_tokens": 8, "temperature": -1}, timeout=60),
            requests.post(domino_server.url + "/v1/chat/completions",
                          json={"model": "m", "messages": "not a list"}, timeout=60),
            requests.post(domino_server.url + "/generate",
                          json={"text": "hi", "sampling_params": {"top_p": 2.0}}, timeout=60),
        ]
        out = fut.result()
    for r in bad:
        assert 400 <= r.status_code < 500, (r.status_code, r.text[:200])
    assert out["meta_info"]["completion_tokens"] == 16
    after = generate(domino_server, "Water boils at", max_new_tokens=4, temperature=0)
    assert after["meta_info"]["completion_tokens"] >= 1


def test_adaptive_width_switching_keeps_greedy_parity(tmp_path, echo_drafter_dir, baseline_server):
    """The adaptive policy changes the verify width from step to step (its warm-up alone runs each of
    8, 5, 2, 1 three times per batch-size bucket): output must not change."""
    server = Server(MODEL, free_port(), preset_args("domino", device=DEVICE, draft=str(echo_drafter_dir)),
                    env=policy_env("adaptive", widths=[1, 2, 5, BLOCK]), log_path=str(tmp_path / "adaptive.log"))
    try:
        start_all([server], TIMEOUT)
        prompts = TEXT_PROMPTS[:8] + ["ha ha ha ha ha ha ha ha ha ha"]
        with cf.ThreadPoolExecutor(2 * len(prompts)) as ex:
            futs = {(name, i): ex.submit(generate, srv, p, max_new_tokens=32, temperature=0)
                    for name, srv in (("domino", server), ("baseline", baseline_server)) for i, p in enumerate(prompts)}
            out = {k: f.result()["output_ids"] for k, f in futs.items()}
        solo = [generate(server, prompts[-1], max_new_tokens=32, temperature=0) for _ in range(2)]
    finally:
        server.stop()
    for i in range(len(prompts)):
        assert out[("domino", i)] == out[("baseline", i)], prompts[i]
    assert all(d["output_ids"] == out[("baseline", len(prompts) - 1)] for d in solo)


def test_a_taken_port_is_detected_and_start_all_moves_on(tmp_path):
    """A port taken between choosing and binding it (free_port races other processes): the server is
    stopped as soon as its log says so, and start_all starts it again on a fresh port."""
    import socket

    with socket.socket() as squatter:
        squatter.bind(("127.0.0.1", 0))
        squatter.listen()
        taken = squatter.getsockname()[1]
        server = Server(MODEL, taken, preset_args("baseline", device=DEVICE), log_path=str(tmp_path / "port.log"))
        try:
            start_all([server], TIMEOUT)
            assert server.port != taken and server.healthy()
            assert generate(server, "Hello", max_new_tokens=4, temperature=0)["output_ids"]
        finally:
            server.stop()
    assert "error while attempting to bind on address" in Path(server.log_path).read_text(errors="replace")


# -- startup refusals (no model weights are loaded: the launcher rejects the arguments) --------------
def _refused(tmp_path, draft, extra=()):
    server = Server(MODEL, free_port(), preset_args("domino", device=DEVICE, draft=str(draft)) + list(extra),
                    log_path=str(tmp_path / "refused.log"))
    server.start()
    try:
        code = server.wait_exit(timeout=300)
    finally:
        server.stop()
    return code, Path(server.log_path).read_text(errors="replace")


def test_malformed_draft_checkpoint_is_refused_with_tensor_named(tmp_path, echo_drafter_dir):
    from safetensors.torch import load_file, save_file

    bad = tmp_path / "bad-drafter"
    bad.mkdir()
    (bad / "config.json").write_text((echo_drafter_dir / "config.json").read_text())
    state = load_file(str(echo_drafter_dir / "model.safetensors"))
    state["prefix_gru.bias_ih_l0"] = torch.zeros(3 * 256)  # a GRU bias: not in the Domino format
    state["embed_proj.0.weight"] = state["embed_proj.0.weight"][:, :-1].contiguous()  # wrong shape
    save_file(state, str(bad / "model.safetensors"))
    code, log = _refused(tmp_path, bad)
    assert code != 0
    assert "prefix_gru.bias_ih_l0" in log
    assert "embed_proj.0.weight" in log


def test_not_a_domino_checkpoint_and_bad_block_size_are_refused(tmp_path, echo_drafter_dir):
    cfg = json.loads((echo_drafter_dir / "config.json").read_text())
    cfg["dflash_config"]["projector_type"] = "mlp"
    plain = tmp_path / "dflash"
    plain.mkdir()
    (plain / "config.json").write_text(json.dumps(cfg))
    (plain / "model.safetensors").symlink_to(echo_drafter_dir / "model.safetensors")
    code, log = _refused(tmp_path, plain)
    assert code != 0 and "projector_type" in log
    code, log = _refused(tmp_path, echo_drafter_dir, ["--speculative-num-draft-tokens", str(BLOCK + 1)])
    assert code != 0 and "--speculative-num-draft-tokens" in log
