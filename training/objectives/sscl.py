"""SSCL: intermediate-layer representations as extra negatives.

Chen et al., "Alleviating Over-smoothing for Unsupervised Sentence Representation" (SSCL, ACL 2023,
arXiv:2305.06154). For each sentence ``i`` the representation ``h_i⁻`` of an intermediate layer ``M`` (the
same pooling and the same train-only head as the final embedding) is an extra negative of the last-layer
anchor ``h_i`` (the L_hne equation of §3.2):

``−log exp(ψ(h_i, h_i⁺)/τ) / ( Σ_j exp(ψ(h_i, h_j⁺)/τ) + Σ_{m∈layers} exp(ψ(h_i, h_i^{-,m})/τ) )``

ψ is cosine similarity, τ = 0.05. The paper's best single layer is the
penultimate one (§5.2, "11-th layer" of 12); **progressive SSCL** (§5.2,
Fig. 3b) stacks the last K intermediate layers (K = 2 best), i.e.
``layers = [-2, -3, …, -(K+1)]`` in Hugging Face ``hidden_states`` indexing.

Two forms (``form`` parameter of the objective):

* ``"authors"`` (default): what the paper's appendix ("from N pairs to 2N pairs") and the authors' code do:
  both views' intermediate representations of every sentence in the batch are negatives of every anchor
  (``2N`` extra columns per layer), and the loss is averaged with plain SimCSE: ``½(L_SSCL + L_SimCSE)``.
  We follow this by default because the published numbers come from it.
* ``"paper"``: the §3.2 equation as written, with ``negatives="self"`` (one column per layer, the anchor's
  own ``h_i⁻``) or ``"batch"`` (every anchor-view ``h_j⁻``, ``N`` columns per layer), not averaged.

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
    """InfoNCE with intermediate-layer negatives (SSCL §3.2), mean over the batch.

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
from training.objectives.simcse import info_nce  # noqa: E402


@register("sscl")
class SSCL(Objective):
    """SSCL loss term (§3.2): InfoNCE whose denominator also holds intermediate-layer negatives.

    It *replaces* SimCSE's InfoNCE (it contains the in-batch negatives, and the authors' form already averages
    with SimCSE), so a run uses it instead of the ``simcse`` term::

        losses:
          sscl: {type: sscl, weight: 1.0, params: {layer: -2, progressive_k: 0, temperature: 0.05}}

    The intermediate representations come from the views' own forward passes
    (``batch.layers["anchor"]``, and ``["positive"]`` in the authors' form: same pooling, same train-only
    head) and go through this step's 3R transform (``batch.transform``) so they live in the same space as the
    anchor. Gradient flows through them into the lower layers (they are negatives of the final layer, §3.2).

    Params: ``form`` (``"authors"``: both views' ``h_j⁻`` as negatives, ``½(L_SSCL + L_SimCSE)``, the
    default; ``"paper"``: the §3.2 equation, see the module docstring), ``temperature`` (τ, 0.05), ``layer``
    (−2 = penultimate), ``progressive_k`` (K > 0: the last K intermediate layers, §5.2), ``negatives``
    (``"self"`` | ``"batch"``, paper form only, see :func:`sscl_infonce`), ``use_hard_negative`` (supervised
    batches: also add ``h_j⁻`` columns).

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
        form: str = "authors",
    ):
        super().__init__(ctx)
        if temperature <= 0:
            raise ValueError(f"temperature must be > 0, got {temperature}")
        if form not in ("authors", "paper"):
            raise ValueError(f"form must be 'authors' or 'paper', got {form!r}")
        self.form = form
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

    def _layer(self, batch: ObjectiveBatch, l: int, view: str = "anchor") -> torch.Tensor:
        lay = batch.layers.get(view, {})
        if l in lay:
            return lay[l]
        alt = l % self._n_states
        if alt in lay:
            return lay[alt]
        raise KeyError(f"layer {l} missing from batch.layers[{view!r}] (have {sorted(lay)})")

    def forward(self, batch: ObjectiveBatch) -> torch.Tensor:
        """Scalar loss (nats): ``½(L_SSCL + L_SimCSE)`` in the authors' form, ``L_SSCL`` in the paper form."""
        negs = [batch.transform(self._layer(batch, l)) for l in self.layers]
        hard = batch.hard_negative if self.use_hard_negative else None
        if self.form == "authors":
            negs += [batch.transform(self._layer(batch, l, "positive")) for l in self.layers]
            a = F.normalize(batch.anchor, dim=-1)
            cols = [a @ F.normalize(batch.positive, dim=-1).T]
            cols += [a @ F.normalize(hard, dim=-1).T] if hard is not None else []
            cols += [a @ F.normalize(n, dim=-1).T for n in negs]  # 2N columns per layer
            target = torch.arange(a.shape[0], device=a.device)
            l_sscl = F.cross_entropy(torch.cat(cols, 1) / self.temperature, target)
            return 0.5 * (l_sscl + info_nce(batch.anchor, batch.positive, hard, self.temperature))
        if hard is not None:
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
