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

from collections.abc import Sequence
from typing import Literal

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


# ---------------------------------------------------------------- trainer integration
from training.objectives import register  # noqa: E402
from training.objectives.base import Objective, ObjectiveBatch, ObjectiveContext  # noqa: E402


@register("sscl")
class SSCL(Objective):
    """SSCL loss term (paper 002 §3.2): InfoNCE whose denominator also holds intermediate-layer negatives.

    It *replaces* SimCSE's InfoNCE (it contains the in-batch negatives), so a
    run uses it instead of the ``simcse`` term::

        losses:
          sscl: {type: sscl, weight: 1.0, params: {layer: -2, progressive_k: 0, temperature: 0.05}}

    The intermediate representations come from the anchor view's own forward
    pass (``batch.layers["anchor"]``: same pooling, same train-only head) and
    go through this step's 3R transform (``batch.transform``) so they live in
    the same space as the anchor. Gradient flows through them into the lower
    layers (they are negatives of the final layer, paper 002 §3.2).

    Params: ``temperature`` (τ, 0.05), ``layer`` (−2 = penultimate),
    ``progressive_k`` (K > 0: the last K intermediate layers, paper 002 §5.2),
    ``negatives`` (``"self"`` | ``"batch"``, see :func:`sscl_infonce`),
    ``use_hard_negative`` (supervised batches: also add ``h_j⁻`` columns).

    Raises:
        ValueError: τ ≤ 0 or a layer outside the encoder.
    """

    def __init__(
        self,
        ctx: ObjectiveContext,
        temperature: float = 0.05,
        layer: int = -2,
        progressive_k: int = 0,
        negatives: str = "self",
        use_hard_negative: bool = True,
    ):
        super().__init__(ctx)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        self.layers = sscl_layers(layer, progressive_k)
        n = ctx.num_layers
        for l in self.layers:
            if not (-(n + 1) <= l <= n) or l in (-1, n):
                raise ValueError(f"layer {l} is not an intermediate layer of a {n}-layer encoder")
        self.extra_layers = tuple(self.layers)
        self.temperature = float(temperature)
        self.negatives = negatives
        self.use_hard_negative = use_hard_negative
        self._n_states = n + 1

    def _layer(self, batch: ObjectiveBatch, l: int) -> torch.Tensor:
        lay = batch.layers.get("anchor", {})
        if l in lay:
            return lay[l]
        alt = l % self._n_states
        if alt in lay:
            return lay[alt]
        raise KeyError(f"layer {l} missing from batch.layers['anchor'] (have {sorted(lay)})")

    def forward(self, batch: ObjectiveBatch) -> torch.Tensor:
        negs = [batch.transform(self._layer(batch, l)) for l in self.layers]
        if self.use_hard_negative and batch.hard_negative is not None:
            a = F.normalize(batch.anchor, dim=-1)
            pos = a @ F.normalize(batch.positive, dim=-1).T
            hard = a @ F.normalize(batch.hard_negative, dim=-1).T
            extra = [
                (a * F.normalize(n, dim=-1)).sum(-1, keepdim=True)
                if self.negatives == "self"
                else a @ F.normalize(n, dim=-1).T
                for n in negs
            ]
            logits = torch.cat([pos, hard, *extra], 1) / self.temperature
            return F.cross_entropy(logits, torch.arange(a.shape[0], device=a.device))
        return sscl_infonce(batch.anchor, batch.positive, negs, self.temperature, self.negatives)
