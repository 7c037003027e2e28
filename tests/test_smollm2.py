"""The real target: Domino output equals plain greedy decoding on SmolLM2-135M-Instruct.

Needs ``models/SmolLM2-135M-Instruct`` (``sglang-domino install-model``). Parity does not depend on
draft quality, so both an untrained drafter and (when present) the committed trained one are checked.
"""

from pathlib import Path

import pytest
import torch

from sglang_domino.cli import DEFAULT_DRAFTER
from sglang_domino.drafter import load_drafter
from sglang_domino.hf.generate import plain_generate, speculative_generate
from sglang_domino.hf.target import chat_input_ids, load_target, stop_token_ids
from sglang_domino.models import DEFAULT_MODEL_DIR, init_drafter
from sglang_domino.prompts import mtbench_first_turns, sharegpt_heldout

pytestmark = pytest.mark.slow
torch.set_num_threads(2)
ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def smollm2():
    path = ROOT / DEFAULT_MODEL_DIR
    if not (path / "config.json").exists():
        pytest.fail(f"{path} missing: run `sglang-domino install-model` first")
    return load_target(str(path), torch.float32)


@pytest.fixture(scope="module")
def prompts():
    return mtbench_first_turns(16) + sharegpt_heldout(4)


def _drafters(target):
    yield "random", init_drafter(target.config, num_layers=1, num_context_layers=3)
    trained = ROOT / DEFAULT_DRAFTER
    if trained.exists():
        yield "trained", load_drafter(trained, target.config, dtype=torch.float32)


def test_greedy_parity_on_20_prompts(smollm2, prompts):
    target, tokenizer = smollm2
    stops = stop_token_ids(target, tokenizer)
    assert len(prompts) == 20
    for name, drafter in _drafters(target):
        for prompt in prompts:
            ids = chat_input_ids(tokenizer, prompt)
            expected = target.generate(ids, attention_mask=torch.ones_like(ids), max_new_tokens=32,
                                       do_sample=False, eos_token_id=stops, pad_token_id=stops[0])
            expected = expected[0, ids.shape[1]:].tolist()
            out = speculative_generate(target, drafter, ids, 32, stop_token_ids=stops)
            assert out.tokens == expected, (name, prompt)


def test_block_sizes_and_backbone_only_keep_parity(smollm2, prompts):
    target, tokenizer = smollm2
    drafter = init_drafter(target.config, num_layers=1, num_context_layers=3, block_size=8)
    ids = chat_input_ids(tokenizer, prompts[0])
    expected = plain_generate(target, ids, 24).tokens
    for kwargs in ({"block_size": 2, "policy": "always"}, {"block_size": 5, "policy": "always"},
                   {"use_head": False, "policy": "always"}, {"policy": "always"}, {}):
        assert speculative_generate(target, drafter, ids, 24, **kwargs).tokens == expected, kwargs
