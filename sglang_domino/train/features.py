"""Target hidden states used as the drafter's context.

For ``target_layer_ids = [l_1 .. l_K]`` the context feature of position t is
``concat(hidden_states[l_1 + 1][t], .., hidden_states[l_K + 1][t])`` where HF's ``hidden_states[i + 1]``
is the output of decoder layer i. The target is causal, so the feature of position t depends on tokens
0..t only: one forward over the whole conversation serves every anchor.

Features are rounded to ``store_dtype`` (bfloat16) whether they come fresh or from the on-disk cache,
so a resumed run sees bit-identical inputs.

``labelled`` runs the whole causal LM instead of its body: the same features (cached on the way) and the
target's greedy next token after every position, for ``relabel.py``.
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

    def _forward(self, ids: torch.Tensor, with_logits: bool):
        """One target forward over a 1-D token tensor -> (features [T, K*H] in store_dtype, logits [T, V] or None)."""
        device = next(self.target.parameters()).device
        x = ids.long().to(device)[None]
        ctx = (torch.autocast(device.type, dtype=self.compute_dtype) if self.compute_dtype is not None
               and self.compute_dtype != next(self.target.parameters()).dtype else _null())
        with ctx:
            model = self.target if with_logits else target_body(self.target)
            res = model(input_ids=x, output_hidden_states=True, use_cache=False)
        feats = torch.cat([res.hidden_states[i + 1][0] for i in self.layer_ids], -1)
        return feats.to(self.store_dtype).cpu(), (res.logits[0] if with_logits else None)

    @torch.no_grad()
    def compute(self, seqs: list[torch.Tensor]) -> list[torch.Tensor]:
        """Fresh features for a list of 1-D token tensors -> list of [T_i, K*H] (store_dtype)."""
        # one sequence per forward: no padding, identical results batched or not
        return [self._forward(ids, with_logits=False)[0] for ids in seqs]

    @torch.no_grad()
    def labelled(self, ids: torch.Tensor) -> torch.Tensor:
        """The target's greedy next token after every position of ``ids`` [T] -> [T] (int32), from the same
        forward that gives the features, which are cached on the way (when there is a cache)."""
        feats, logits = self._forward(ids, with_logits=True)
        self._store(self._key(ids), feats)
        return logits.argmax(-1).to(torch.int32).cpu()

    def _store(self, key: str, feats: torch.Tensor) -> None:
        if self.cache_dir is not None:
            tmp = self.cache_dir / f"{key}.pt.tmp"
            torch.save(feats.clone(), tmp)
            os.replace(tmp, self.cache_dir / f"{key}.pt")

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
                self._store(keys[i], f)
        return result  # type: ignore[return-value]


class _null:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
