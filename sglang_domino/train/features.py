"""Target hidden states used as the drafter's context.

For ``target_layer_ids = [l_1 .. l_K]`` the context feature of position t is
``concat(hidden_states[l_1 + 1][t], .., hidden_states[l_K + 1][t])`` where HF's ``hidden_states[i + 1]``
is the output of decoder layer i. The target is causal, so the feature of position t depends on tokens
0..t only: one forward over the whole conversation serves every anchor.

Features are rounded to ``store_dtype`` (bfloat16) whether they come fresh or from the on-disk cache,
so a resumed run sees bit-identical inputs.
"""

from __future__ import annotations

import hashlib
import os
from pathlib import Path

import torch


def target_body(target):
    """The decoder stack without the LM head (``model.model`` for HF causal LMs)."""
    body = getattr(target, "model", None)
    return body if body is not None else target


class FeatureExtractor:
    def __init__(self, target, layer_ids: list[int], cache_dir: str | Path | None = None,
                 store_dtype: torch.dtype = torch.bfloat16, compute_dtype: torch.dtype | None = None):
        self.target = target
        self.layer_ids = list(layer_ids)
        self.store_dtype = store_dtype
        self.compute_dtype = compute_dtype
        self.cache_dir = Path(cache_dir) if cache_dir is not None else None
        if self.cache_dir is not None:
            self.cache_dir.mkdir(parents=True, exist_ok=True)

    def _key(self, ids: torch.Tensor) -> str:
        h = hashlib.sha1(ids.to(torch.int32).numpy().tobytes())
        h.update(repr((self.layer_ids, str(self.compute_dtype))).encode())
        return h.hexdigest()[:24]

    def _cached_path(self, key: str) -> Path | None:
        """The cache file of ``key`` if it exists."""
        path = None if self.cache_dir is None else self.cache_dir / f"{key}.pt"
        return path if path is not None and path.exists() else None

    def cached(self, ids: torch.Tensor) -> bool:
        return self._cached_path(self._key(ids)) is not None

    @torch.no_grad()
    def compute(self, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Fresh features for a list of 1-D token tensors -> list of [T_i, K*H] (store_dtype)."""
        body = target_body(self.target)
        device = next(self.target.parameters()).device
        out = []
        for ids in seqs:  # one sequence per forward: no padding, identical results batched or not
            x = ids.long().to(device)[None]
            ctx = (torch.autocast(device.type, dtype=self.compute_dtype) if self.compute_dtype is not None
                   and self.compute_dtype != next(self.target.parameters()).dtype else _null())
            with ctx:
                res = body(input_ids=x, output_hidden_states=True, use_cache=False)
            hs = res.hidden_states
            feats = torch.cat([hs[i + 1][0] for i in self.layer_ids], -1)
            out.append(feats.to(self.store_dtype).cpu())
        return out

    def __call__(self, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
        keys = [self._key(s) for s in seqs]
        result: list[torch.Tensor | None] = [None] * len(seqs)
        missing = []
        for i, k in enumerate(keys):
            path = self._cached_path(k)
            if path is not None:
                result[i] = torch.load(path, weights_only=True)
            else:
                missing.append(i)
        if missing:
            fresh = self.compute([seqs[i] for i in missing])
            for i, f in zip(missing, fresh):
                result[i] = f
                if self.cache_dir is not None:
                    tmp = self.cache_dir / f"{keys[i]}.pt.tmp"
                    torch.save(f.clone(), tmp)
                    os.replace(tmp, self.cache_dir / f"{keys[i]}.pt")
        return result  # type: ignore[return-value]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
