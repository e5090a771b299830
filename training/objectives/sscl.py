"""SSCL (paper 002 §3.2): intermediate-layer representations as extra negatives.

For each sentence ``i`` the representation ``h_i⁻`` of an intermediate layer
``M`` (the same pooling and the same train-only head as the final embedding)
is an extra negative of the last-layer anchor ``h_i`` (paper 002, the L_hne
equation of §3.2):

``−log exp(ψ(h_i, h_i⁺)/τ) / ( Σ_j exp(ψ(h_i, h_j⁺)/τ) + Σ_{m∈layers} exp(ψ(h_i, h_i^{-,m})/τ) )``

ψ is cosine similarity, τ = 0.05. The paper's best single layer is the
penultimate one (§5.2, "11-th layer" of 12); **progressive SSCL** (§5.2,
Fig. 3b) stacks the last K intermediate layers (K = 2 best), i.e.
``layers = [-2, -3, …, -(K+1)]`` in Hugging Face ``hidden_states`` indexing.

``negatives="self"`` (default) adds exactly one intermediate negative per layer
for each anchor, its own ``h_i⁻``, as the equation is written; ``"batch"``
adds every sentence's intermediate representation ``h_j⁻`` (the SimCSE
hard-negative layout, ``N`` extra columns per layer).

The denominator also contains the in-batch positives ``h_j⁺`` (including
``j = i``, the numerator), as in SimCSE.
"""

from __future__ import annotations

from typing import Literal, Sequence

import torch
import torch.nn.functional as F

__all__ = ["sscl_layers", "sscl_infonce"]


def sscl_layers(layer: int = -2, progressive_k: int = 0) -> list[int]:
    """Intermediate layers used as negatives (Hugging Face ``hidden_states`` indices).

    Args:
        layer: single layer (``-2`` = penultimate) when ``progressive_k == 0``.
        progressive_k: K > 0 stacks the last K intermediate layers ``[-2, …, -(K+1)]``.
    Raises:
        ValueError: ``layer == -1`` / a non-intermediate choice, or K < 0.
    """
    if progressive_k < 0:
        raise ValueError("progressive_k must be >= 0")
    if progressive_k:
        return [-(k + 2) for k in range(progressive_k)]
    if layer == -1:
        raise ValueError("layer -1 is the final layer itself, not an intermediate one")
    return [int(layer)]


def sscl_infonce(
    h: torch.Tensor,
    h_pos: torch.Tensor,
    h_neg: Sequence[torch.Tensor],
    temperature: float = 0.05,
    negatives: Literal["self", "batch"] = "self",
) -> torch.Tensor:
    """InfoNCE with intermediate-layer negatives (paper 002 §3.2), mean over the batch.

    Args:
        h: ``(N, D)`` last-layer anchors.
        h_pos: ``(N, D)`` positives (the other dropout view / augmentation).
        h_neg: list of ``(N, D)`` intermediate-layer representations of the anchors' sentences.
        temperature: τ.
        negatives: ``"self"`` (``h_i⁻`` only) or ``"batch"`` (all ``h_j⁻``).
    Returns:
        scalar loss (nats).
    Raises:
        ValueError: shape mismatch, empty ``h_neg``, or unknown ``negatives``.
    """
    if h.shape != h_pos.shape or any(n.shape != h.shape for n in h_neg):
        raise ValueError("h, h_pos and every h_neg must share the shape (N, D)")
    if not h_neg:
        raise ValueError("h_neg is empty: SSCL needs at least one intermediate layer")
    a = F.normalize(h, dim=-1)
    cols = [a @ F.normalize(h_pos, dim=-1).T]  # (N, N)
    for n in h_neg:
        nn_ = F.normalize(n, dim=-1)
        if negatives == "self":
            cols.append((a * nn_).sum(-1, keepdim=True))  # (N, 1)
        elif negatives == "batch":
            cols.append(a @ nn_.T)  # (N, N)
        else:
            raise ValueError(f"negatives must be 'self' or 'batch', got {negatives!r}")
    logits = torch.cat(cols, dim=1) / temperature
    target = torch.arange(h.shape[0], device=h.device)
    return F.cross_entropy(logits, target)
