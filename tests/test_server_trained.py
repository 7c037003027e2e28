"""The committed SmolLM2 drafter behind a real DOMINO server: the accept length the server reports matches
the Transformers backend's tau on the same prompts, and the outputs are the same tokens.

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
def server(tmp_path_factory, prompts_ids):
    logs = Path(os.environ.get("SGLANG_DOMINO_TEST_LOG_DIR") or tmp_path_factory.mktemp("server-logs"))
    srv = Server(MODEL, free_port(), preset_args("domino", device=DEVICE, draft=str(DRAFTER)),
                 env=policy_env("always"),  # every step drafts, as in the Transformers backend
                 log_path=str(logs / "domino-trained.log"))
    try:
        yield start_all([srv], 600)[0]
    finally:
        srv.stop()


def test_server_accept_length_matches_transformers_tau(server, prompts_ids):
    from sglang_domino.drafter import load_drafter
    from sglang_domino.hf.generate import speculative_generate
    from sglang_domino.hf.target import load_target, stop_token_ids

    served = []
    for ids in prompts_ids:  # one at a time: the same batch-size-1 steps as the Transformers backend
        r = requests.post(server.url + "/generate", json={
            "input_ids": ids, "sampling_params": {"max_new_tokens": MAX_NEW, "temperature": 0}}, timeout=600)
        r.raise_for_status()
        served.append(r.json())

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
