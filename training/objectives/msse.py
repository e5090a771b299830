"""MSSE ("Harnessing Dimension-level Contrastive Learning and Information Compensation Mechanism for Sentence
Embedding Enhancement", §3.2–3.3): dimension-level contrast (DCM) and information compensation (ICM).

MSSE, Eq. 10: ``L = L_NCE + μ·L_DCM + γ·L_ICM`` (μ = 0.8, γ = 0.2 in its
Appendix; ``L_NCE`` is the run's InfoNCE, the SimCSE objective of training/objectives/simcse.py).

**DCM** (Eqs. 2–4). ``H, H⁺ ∈ R^{N×D}`` are the two views' batch embeddings.
Each column is normalised over the batch (centred, then scaled to unit norm,
i.e. the column's z-score up to a constant), and ``C_ij`` is the cosine of
column ``i`` of ``H`` and column ``j`` of ``H⁺`` (Eq. 3): the ``D×D``
cross-correlation matrix. ``L_DCM = Σ_{i,j} (C_ij − δ_ij)²`` (Eq. 4), a plain
sum over ``D²`` entries as written (it is large: with ``N < D`` the
off-diagonal cannot vanish; μ scales it).

**ICM** (Eqs. 8–9). A train-only decoder ``q(s|h)`` reconstructs the input
tokens from the sentence embedding ``h`` alone: ``L_ICM = −Σ_i Σ_j log P(x_j | h_i)``
(we average over real tokens instead of summing, so γ does not depend on
batch size or sentence length). The decoder is non-autoregressive: for each
position ``j``, ``u_j = LN(GELU(W h + p_j))`` with learned position vectors
``p_j``, and the vocabulary logits come from an output layer **tied** to the
encoder's word embeddings (``u_j E^T + c``), since the default encoder has no
MLM head. Gradients reach the encoder through ``h`` and through ``E``.

Positives: dropout (the second view of the same sentence) or a user pairs
file (:func:`training.data.train_data.read_pairs`, e.g. back-translations as in MSSE §3.1).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["dcm_loss", "cross_correlation", "ICMDecoder", "icm_loss"]


def cross_correlation(h: torch.Tensor, h_pos: torch.Tensor, eps: float = 1e-8) -> torch.Tensor:
    """``C`` of MSSE, Eq. 3: ``(D, D)`` cosines between batch-normalised columns of ``h`` and ``h_pos``.

    Args:
        h, h_pos: ``(N, D)``, N ≥ 2.
    Returns:
        ``(D, D)`` with entries in ``[−1, 1]`` (Pearson correlation over the batch).
    Raises:
        ValueError: shapes differ or N < 2.
    """
    if h.shape != h_pos.shape or h.dim() != 2:
        raise ValueError(f"expected two (N, D) tensors of equal shape, got {tuple(h.shape)}, {tuple(h_pos.shape)}")
    if h.shape[0] < 2:
        raise ValueError("DCM needs a batch of at least 2")
    a = h - h.mean(0, keepdim=True)
    b = h_pos - h_pos.mean(0, keepdim=True)
    a = a / a.norm(dim=0, keepdim=True).clamp_min(eps)
    b = b / b.norm(dim=0, keepdim=True).clamp_min(eps)
    return a.T @ b


def dcm_loss(h: torch.Tensor, h_pos: torch.Tensor, reduction: str = "sum") -> torch.Tensor:
    """``L_DCM = Σ_{i,j} (C_ij − δ_ij)²`` (MSSE, Eq. 4).

    Args:
        h, h_pos: ``(N, D)`` view embeddings.
        reduction: ``"sum"`` (paper) or ``"mean"`` (divided by ``D²``).
    Returns:
        scalar, ``≥ 0`` (``sum``: at most ``4 D²``).
    """
    c = cross_correlation(h, h_pos)
    eye = torch.eye(c.shape[0], device=c.device, dtype=c.dtype)
    s = (c - eye).pow(2)
    if reduction == "sum":
        return s.sum()
    if reduction == "mean":
        return s.mean()
    raise ValueError(f"reduction must be 'sum' or 'mean', got {reduction!r}")


class ICMDecoder(nn.Module):
    """Train-only decoder ``q(s|h)`` of MSSE §3.3: sentence embedding → token logits.

    ``(N, D)`` embeddings and a length ``T`` → ``(N, T, V)`` logits, through an
    output layer tied to ``word_embeddings`` (shared, not copied) plus a bias.

    Args:
        word_embeddings: the encoder's ``nn.Embedding`` ``(V, H)``.
        dim: sentence-embedding size D.
        max_len: longest sequence the position vectors cover.
    """

    def __init__(
        self, word_embeddings: nn.Embedding, dim: int, max_len: int = 512, layer_norm_eps: float = 1e-12
    ) -> None:
        super().__init__()
        v, hdim = word_embeddings.weight.shape
        self.proj = nn.Linear(dim, hdim)
        self.pos = nn.Parameter(torch.randn(max_len, hdim) * 0.02)
        self.norm = nn.LayerNorm(hdim, eps=layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(v))
        object.__setattr__(self, "_tied", word_embeddings)  # not a submodule: belongs to the encoder

    @property
    def tied_weight(self) -> torch.Tensor:
        """The shared ``(V, H)`` word-embedding matrix."""
        return self._tied.weight

    def hidden(self, h: torch.Tensor, length: int) -> torch.Tensor:
        """Per-position decoder states ``(N, T, H)`` from embeddings ``(N, D)``.

        Raises:
            ValueError: ``length`` exceeds ``max_len``.
        """
        if length > self.pos.shape[0]:
            raise ValueError(f"length {length} > max_len {self.pos.shape[0]}")
        return self.norm(F.gelu(self.proj(h)[:, None, :] + self.pos[None, :length]))

    def forward(self, h: torch.Tensor, length: int) -> torch.Tensor:
        """``(N, D)`` → ``(N, T, V)`` logits."""
        return self.hidden(h, length) @ self.tied_weight.T + self.bias


def icm_loss(
    decoder: ICMDecoder,
    h: torch.Tensor,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    special_ids: set[int] | frozenset[int] = frozenset(),
) -> torch.Tensor:
    """``L_ICM``: mean cross-entropy (nats per token) of reconstructing ``input_ids`` from ``h`` (MSSE, Eq. 9).

    Positions with ``attention_mask == 0`` and tokens in ``special_ids``
    (e.g. ``[CLS]``, ``[SEP]``) are not predicted. Only the predicted
    positions go through the ``(·, V)`` output layer.

    Args:
        h: ``(N, D)`` sentence embeddings (gradient flows back to the encoder).
        input_ids, attention_mask: ``(N, T)``.
    Raises:
        ValueError: no position to predict.
    """
    sel = attention_mask.bool()
    for s in special_ids:
        sel &= input_ids != s
    if not sel.any():
        raise ValueError("no token to reconstruct")
    states = decoder.hidden(h, input_ids.shape[1])[sel]  # (M, H)
    logits = states @ decoder.tied_weight.T + decoder.bias
    return F.cross_entropy(logits, input_ids[sel])


# ---------------------------------------------------------------- trainer integration
from training.objectives import register  # noqa: E402
from training.objectives.base import Objective, ObjectiveBatch, ObjectiveContext  # noqa: E402


@register("msse")
class MSSE(Objective):
    """MSSE's extra terms (MSSE, Eq. 10): ``{"dcm": μ·L_DCM, "icm": γ·L_ICM}``.

    Combine with the InfoNCE term ``L_NCE`` (SimCSE) in the config::

        losses:
          simcse: {type: simcse, weight: 1.0}
          msse:   {type: msse, weight: 1.0, params: {mu: 0.8, gamma: 0.2}}

    DCM uses ``batch.anchor`` / ``batch.positive`` (3R-transformed when 3R
    is on). ICM reconstructs the anchor view's tokens
    (``batch.input_ids["anchor"]``, padding and special tokens excluded) from
    ``batch.anchor`` with a train-only :class:`ICMDecoder` tied to the
    encoder's word embeddings; the decoder is part of this objective, so it is
    saved in training checkpoints and never exported.

    Params: ``mu`` (μ ≥ 0, 0.8), ``gamma`` (γ ≥ 0, 0.2), ``dcm_reduction``
    (``"sum"`` as Eq. 4, or ``"mean"``), ``decoder_max_len`` (512).

    Raises:
        ValueError: negative weights, or ``gamma > 0`` without ``ctx.encoder``.
    """

    def __init__(
        self,
        ctx: ObjectiveContext,
        mu: float = 0.8,
        gamma: float = 0.2,
        dcm_reduction: str = "sum",
        decoder_max_len: int = 512,
    ):
        super().__init__(ctx)
        if mu < 0 or gamma < 0:
            raise ValueError(f"mu and gamma must be >= 0, got {mu}, {gamma}")
        if dcm_reduction not in ("sum", "mean"):
            raise ValueError(f"dcm_reduction must be 'sum' or 'mean', got {dcm_reduction!r}")
        self.mu, self.gamma, self.dcm_reduction = float(mu), float(gamma), dcm_reduction
        self.decoder: ICMDecoder | None = None
        self._special: frozenset[int] = frozenset({ctx.pad_token_id})
        if self.gamma > 0:
            if ctx.encoder is None:
                raise ValueError("msse with gamma > 0 needs ctx.encoder (the decoder is tied to its word embeddings)")
            self.decoder = ICMDecoder(ctx.encoder.word_embeddings, ctx.hidden_size, decoder_max_len)
            tok = getattr(ctx.encoder, "tokenizer", None)
            if tok is not None:
                self._special = frozenset(tok.all_special_ids) | self._special

    def forward(self, batch: ObjectiveBatch) -> dict[str, torch.Tensor]:
        out: dict[str, torch.Tensor] = {}
        if self.mu > 0:
            out["dcm"] = self.mu * dcm_loss(batch.anchor, batch.positive, self.dcm_reduction)
        if self.decoder is not None:
            if "anchor" not in batch.input_ids:
                raise RuntimeError("msse ICM needs batch.input_ids['anchor'] / attention_mask['anchor']")
            out["icm"] = self.gamma * icm_loss(
                self.decoder, batch.anchor, batch.input_ids["anchor"], batch.attention_mask["anchor"], self._special
            )
        return out
