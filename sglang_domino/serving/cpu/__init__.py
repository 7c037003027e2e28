"""Shims that let SGLang 0.5.23's CPU engine run speculative decoding with the PyPI (CUDA) wheels.

All of them are switched on only for CPU serving (``SGLANG_USE_CPU_ENGINE=1`` and no GPU driver):

* ``libcuda``: a stand-in ``libcuda.so.1`` so that ``import sgl_kernel`` (a CUDA build) succeeds;
* ``ops``: pure-torch ``torch.ops.sgl_kernel.*_cpu`` ops that only a source-built CPU sgl-kernel has;
* ``attention``: a TARGET_VERIFY path for the torch_native attention backend (it has none);
* ``linear``: 1-64-row matmuls (decode, verify) as ``(W @ x.T).T`` where that measures faster than stock.
"""

from __future__ import annotations

import os


def cpu_engine_requested() -> bool:
    return os.environ.get("SGLANG_USE_CPU_ENGINE", "").strip().lower() in ("1", "true", "yes", "on")
