"""SGLang plugin entry point (``[project.entry-points."sglang.srt.plugins"] domino``).

SGLang runs ``register()`` in every process it starts (launcher, scheduler, detokenizer, ...).
It registers ``--speculative-algorithm DOMINO`` and, for CPU serving only, the shims of
``sglang_domino.serving.cpu``. Errors are logged by SGLang and otherwise swallowed, so they are
logged loudly here too.
"""

from __future__ import annotations

import logging

from .args import ALGORITHM, make_spec_class, validate_server_args

logger = logging.getLogger(__name__)

_done = False


def _install_cpu_shims() -> None:
    from .cpu import attention, cpu_engine_requested, libcuda, linear, ops

    if not cpu_engine_requested():
        return
    stub = libcuda.install()
    if stub is not None:
        try:
            import sgl_kernel  # noqa: F401  (so a CPU build's own ops are seen before ours)
        except Exception as e:  # pragma: no cover
            logger.warning("sglang-domino: import sgl_kernel failed even with the libcuda stand-in: %s", e)
    ops.register()
    attention.register_hook()
    linear.register_hooks()


def _factory(server_args):
    from .worker import DominoWorker

    return DominoWorker


def register() -> None:
    global _done
    if _done:
        return
    try:
        _install_cpu_shims()
        from sglang.srt.speculative import spec_registry
        from sglang.srt.speculative.spec_info import SpeculativeAlgorithm

        if spec_registry.get_spec(ALGORITHM) is None:
            SpeculativeAlgorithm.register(
                ALGORITHM, supports_overlap=False, validate_server_args=validate_server_args,
                spec_class=make_spec_class(),
            )(_factory)
        _done = True
    except Exception:
        logger.exception("sglang-domino plugin failed to register %s", ALGORITHM)
        raise
