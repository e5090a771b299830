"""Pooling of token states into one sentence vector: the one definition, used by the training encoder, the
exported ONNX graph (:class:`training.export.graph.PooledEncoder`) and SparseCSE's importance scoring.

* ``mean``: the average of the last hidden states over positions where ``attention_mask`` is 1
  (sentence-transformers' mean pooling; all-MiniLM-L6-v2 was trained with it).
* ``cls``: the first token's (``[CLS]``) hidden state (SimCSE, Gao et al., arXiv:2104.08821, §3).
"""

from __future__ import annotations

from typing import Literal

import torch

Pooling = Literal["mean", "cls"]
POOLINGS: tuple[str, ...] = ("mean", "cls")


def pool(last_hidden: torch.Tensor, attention_mask: torch.Tensor, pooling: Pooling) -> torch.Tensor:
    """Pool token states ``(N, T, H)`` with mask ``(N, T)`` into ``(N, H)`` (mean over real tokens, or [CLS]).

    The mask is cast to the states' dtype; a row with no real token divides by 1e-9 (gives zeros, not NaN).
    """
    if pooling == "cls":
        return last_hidden[:, 0]
    m = attention_mask.unsqueeze(-1).to(last_hidden.dtype)
    return (last_hidden * m).sum(dim=1) / m.sum(dim=1).clamp(min=1e-9)
