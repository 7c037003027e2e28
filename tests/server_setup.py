"""What the server test modules share: the target model, the committed drafter and the device to serve on."""

from __future__ import annotations

import os
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]
MODEL = os.environ.get("SGLANG_DOMINO_TEST_MODEL", str(ROOT / "models" / "SmolLM2-135M-Instruct"))
DRAFTER = ROOT / "drafters" / "smollm2-domino-b16"
DEVICE = os.environ.get("SGLANG_DOMINO_TEST_DEVICE", "cuda" if torch.cuda.is_available() else "cpu")
