"""The committed SmolLM2 drafter behind a real DOMINO server: the accept length the server reports matches
the Transformers backend's tau on the same prompts, and the outputs are the same tokens; a second server with
the head's gate table (SGLANG_DOMINO_GATE_TABLE=1) drafts the same chains.

Both run the same drafter weights and the same Domino math (``sglang_domino.rollout`` via
``kernels.dispatch``) over a float32 target; they differ only in the target's kernels (SGLang's CPU
engine vs Transformers), so a near-tie can flip a draft here and there: "within noise".
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import requests
import torch

from sglang_domino.policy import policy_env
from sglang_domino.serving.server import Server, free_port, preset_args, start_all

from server_setup import DEVICE, DRAFTER, MODEL

pytestmark = [pytest.mark.server, pytest.mark.slow]

N_PROMPTS, MAX_NEW = 6, 48


@pytest.fixture(scope="module")
def prompts_ids():
    if not (Path(MODEL) / "config.json").exists():
        pytest.skip(f"{MODEL} missing: run `python -m sglang_domino.models` first")
    from transformers import AutoTokenizer

    from sglang_domino.hf.target import chat_input_ids
    from sglang_domino.prompts import mtbench_first_turns

    tok = AutoTokenizer.from_pretrained(MODEL)
    return [chat_input_ids(tok, q)[0].tolist() for q in mtbench_first_turns(N_PROMPTS)]


@pytest.fixture(scope="module")
def servers(tmp_path_factory, prompts_ids):
    """The default DOMINO server, and one with the head's gate table (SGLANG_DOMINO_GATE_TABLE=1)."""
    logs = Path(os.environ.get("SGLANG_DOMINO_TEST_LOG_DIR") or tmp_path_factory.mktemp("server-logs"))
    args = preset_args("domino", device=DEVICE, draft=str(DRAFTER))
    env = policy_env("always")  # every step drafts, as in the Transformers backend
    both = [Server(MODEL, free_port(), args, env=env, log_path=str(logs / "domino-trained.log")),
            Server(MODEL, free_port(), args, env={**env, "SGLANG_DOMINO_GATE_TABLE": "1"},
                   log_path=str(logs / "domino-trained-gate-table.log"))]
    try:
        yield start_all(both, 600)
    finally:
        for srv in both:
            srv.stop()


def _serve(server, prompts_ids):
    out = []
    for ids in prompts_ids:  # one at a time: the same batch-size-1 steps as the Transformers backend
        r = requests.post(server.url + "/generate", json={
            "input_ids": ids, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0}}, timeout=600)
        r.raise_for_status()
        out.append(r.json())
    return out


@pytest.fixture(scope="module")
def served(servers, prompts_ids):
    return _serve(servers[0], prompts_ids)


def test_server_accept_length_matches_transformers_tau(served, prompts_ids):
    from sglang_domino.drafter import load_drafter
    from sglang_domino.hf.generate import speculative_generate
    from sglang_domino.hf.target import load_target, stop_token_ids

    target, tok = load_target(MODEL, torch.float32)
    drafter = load_drafter(DRAFTER, target.config, dtype=torch.float32)
    stops = stop_token_ids(target, tok)
    hf = [speculative_generate(target, drafter, torch.tensor([ids]), MAX_NEW, stop_token_ids=stops, policy="always")
          for ids in prompts_ids]

    same = sum(s["output_ids"] == h.tokens for s, h in zip(served, hf))
    assert same >= N_PROMPTS - 1, f"only {same}/{N_PROMPTS} outputs identical"
    # The server reports accept length = completion tokens / verify steps (the prefill token counted too);
    # the same ratio from the Transformers backend's stats:
    for s in served:
        m = s["meta_info"]
        assert m["spec_accept_length"] == pytest.approx(m["completion_tokens"] / m["spec_verify_ct"])
    reported = sum(s["meta_info"]["completion_tokens"] for s in served) / sum(
        s["meta_info"]["spec_verify_ct"] for s in served)
    hf_tau = sum(h.stats.new_tokens for h in hf) / sum(h.stats.steps for h in hf)
    assert hf_tau > 1.05, f"the committed drafter accepts almost nothing (tau {hf_tau:.2f})"
    assert abs(reported - hf_tau) <= 0.1 * hf_tau, f"server {reported:.3f} vs Transformers {hf_tau:.3f}"


def test_gate_table_server_drafts_the_same(servers, served, prompts_ids):
    """With the gate table the server drafts the same chains (only the fp32 summation order of the input
    gates differs): the same outputs, and the same verify steps but for a rare near-tie."""
    with_table = _serve(servers[1], prompts_ids)
    assert "gate table 72 MiB" in Path(servers[1].log_path).read_text(errors="replace")
    assert "gate table off" in Path(servers[0].log_path).read_text(errors="replace")
    assert [s["output_ids"] for s in with_table] == [s["output_ids"] for s in served]
    steps = [(a["meta_info"]["spec_verify_ct"], b["meta_info"]["spec_verify_ct"]) for a, b in zip(with_table, served)]
    assert sum(a == b for a, b in steps) >= N_PROMPTS - 1, steps
