"""InforMin-CL: contrast + reconstruction, optional MLM auxiliary.

Chen et al., "An Information Minimization Based Contrastive Learning Model for Unsupervised Sentence
Embeddings Learning" (InforMin-CL, COLING 2022, arXiv:2209.10951), Eq. 8: ``L_R = E[‖z1 − z2‖²]`` between the two positive views (written there as the log-likelihood
``−‖z1 − z2‖²`` of a Gaussian reconstruction ``Q(z1|z2)``; minimising the squared distance maximises it).
Eq. 9: ``L = L_C + λ·L_R``, λ = 0.4 by default (Table 3); §4.1: optionally ``+ β·L_MLM`` (β = 0.1 in the
"w/ MLM" rows).

Scale. The authors' code computes the reconstruction as ``F.mse_loss(z1, z2) + F.mse_loss(z2, z1)``: a mean
over dimensions, i.e. ``(2/D)·‖ẑ1 − ẑ2‖²``. We follow the code (``scale="authors"``, the default) so that the
paper's λ = 0.4 means what it means there; ``scale="sum"`` keeps the textbook sum over dimensions, which is
D/2 times stronger (192× on a 384-d encoder, 384× on BERT-base). ``z`` are the views' sentence embeddings
L2-normalised (``‖ẑ1 − ẑ2‖² = 2 − 2 cos``). ``L_C`` is the contrastive term of the run (SimCSE's InfoNCE,
``training/objectives/simcse.py``); this module supplies ``L_R`` and ``L_MLM``.

The MLM head (the default encoder has none) is train-only: a BERT prediction
transform (dense + GELU + LayerNorm) and an output layer **tied** to the
encoder's word-embedding matrix plus a free bias. It is never exported.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

__all__ = ["informin_reconstruction", "TiedMLMHead", "mask_tokens", "mlm_loss"]


def informin_reconstruction(z1: torch.Tensor, z2: torch.Tensor, scale: str = "authors") -> torch.Tensor:
    """``L_R`` of InforMin-CL Eq. 8 (sign flipped to a loss) with ``ẑ = z / ‖z‖``.

    ``scale="authors"``: ``mean_i (2/D)·‖ẑ1_i − ẑ2_i‖²`` = ``F.mse_loss(ẑ1, ẑ2) + F.mse_loss(ẑ2, ẑ1)``, the
    authors' code, in ``[0, 8/D]``; ``scale="sum"``: ``mean_i ‖ẑ1_i − ẑ2_i‖²``, in ``[0, 4]``.

    Args:
        z1, z2: ``(N, D)`` embeddings of the two views of the same N sentences.
    Returns:
        scalar tensor.
    Raises:
        ValueError: shapes differ or are not 2-D, or an unknown ``scale``.
    """
    if z1.dim() != 2 or z1.shape != z2.shape:
        raise ValueError(f"expected two (N, D) tensors of equal shape, got {tuple(z1.shape)}, {tuple(z2.shape)}")
    if scale not in ("authors", "sum"):
        raise ValueError(f"scale must be 'authors' or 'sum', got {scale!r}")
    sq = (F.normalize(z1, dim=-1) - F.normalize(z2, dim=-1)).pow(2).sum(-1).mean()
    return sq * (2.0 / z1.shape[1]) if scale == "authors" else sq


class TiedMLMHead(nn.Module):
    """Train-only masked-LM head whose output layer is tied to the word embeddings.

    ``logits = LN(GELU(W t + b)) @ E^T + c``: token states ``(N, T, H)`` →
    logits ``(N, T, V)``, where ``E`` ``(V, H)`` is the encoder's input
    embedding matrix (shared, not copied: gradients of the output layer reach
    it) and ``c`` ``(V,)`` a free bias.

    Args:
        word_embeddings: the encoder's ``nn.Embedding`` ``(V, H)``.
        layer_norm_eps: LayerNorm epsilon (BERT: 1e-12).
    """

    def __init__(self, word_embeddings: nn.Embedding, layer_norm_eps: float = 1e-12) -> None:
        super().__init__()
        v, h = word_embeddings.weight.shape
        self.dense = nn.Linear(h, h)
        self.norm = nn.LayerNorm(h, eps=layer_norm_eps)
        self.bias = nn.Parameter(torch.zeros(v))
        # a plain attribute (not a registered submodule): the embedding belongs to the encoder,
        # so the head's state_dict never duplicates it, and nothing here is exported.
        object.__setattr__(self, "_tied", word_embeddings)

    @property
    def tied_weight(self) -> torch.Tensor:
        """The shared ``(V, H)`` word-embedding matrix."""
        return self._tied.weight

    def forward(self, token_states: torch.Tensor) -> torch.Tensor:
        """``(N, T, H)`` → ``(N, T, V)`` logits (or ``(M, H)`` → ``(M, V)``)."""
        x = self.norm(F.gelu(self.dense(token_states)))
        return x @ self.tied_weight.T + self.bias


def mask_tokens(
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    *,
    mask_token_id: int,
    vocab_size: int,
    special_ids: set[int] | frozenset[int] = frozenset(),
    prob: float = 0.15,
    generator: torch.Generator | None = None,
) -> tuple[torch.Tensor, torch.Tensor]:
    """BERT masking (Devlin et al. 2019): choose ``prob`` of real, non-special tokens;
    of those 80% → ``[MASK]``, 10% → random token, 10% unchanged.

    Args:
        input_ids, attention_mask: ``(N, T)`` int64.
    Returns:
        ``(masked_ids, labels)``, both ``(N, T)`` int64; ``labels`` is ``-100``
        where no prediction is asked. At least one token per batch is chosen
        (the first eligible one) so the loss is always defined.
    """
    ids = input_ids.clone()
    eligible = attention_mask.bool()
    for s in special_ids:
        eligible &= input_ids != s
    u = torch.rand(ids.shape, generator=generator, device="cpu").to(ids.device)
    chosen = eligible & (u < prob)
    if not chosen.any() and eligible.any():
        first = eligible.flatten().nonzero()[0, 0]
        chosen.view(-1)[first] = True
    labels = torch.where(chosen, input_ids, torch.full_like(input_ids, -100))
    r = torch.rand(ids.shape, generator=generator, device="cpu").to(ids.device)
    ids[chosen & (r < 0.8)] = mask_token_id
    rand_pos = chosen & (r >= 0.8) & (r < 0.9)
    rnd = torch.randint(vocab_size, ids.shape, generator=generator, device="cpu").to(ids.device)
    ids[rand_pos] = rnd[rand_pos]
    return ids, labels


def mlm_loss(head: TiedMLMHead, token_states: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy (nats per masked token) of ``head(token_states)`` against ``labels`` (``-100`` ignored).

    Only the masked positions go through the ``(·, V)`` output layer.

    Args:
        token_states: ``(N, T, H)`` last hidden states of the masked input.
        labels: ``(N, T)`` int64.
    Raises:
        ValueError: no position is labelled.
    """
    sel = labels != -100
    if not sel.any():
        raise ValueError("no masked positions to predict")
    return F.cross_entropy(head(token_states[sel]), labels[sel])


# ---------------------------------------------------------------- trainer integration
from training.objectives import register  # noqa: E402
from training.objectives.base import Objective, ObjectiveBatch, ObjectiveContext  # noqa: E402


@register("informin")
class InforMinCL(Objective):
    """InforMin-CL's extra terms (Eq. 9 and §4.1): ``{"rec": λ·L_R, "mlm": β·L_MLM}``.

    Combine with the contrastive term ``L_C`` in the config::

        losses:
          simcse:   {type: simcse, weight: 1.0}
          informin: {type: informin, weight: 1.0, params: {lam: 0.4, beta: 0.0}}

    ``L_R`` is computed on ``batch.anchor`` / ``batch.positive`` (the two
    views, 3R-transformed when 3R is on). With ``beta > 0`` a masked copy of
    the anchor sentences (``mlm_prob`` of the real tokens, BERT's 80/10/10
    rule) is encoded once more **with gradient** inside the objective and a
    train-only :class:`TiedMLMHead` predicts the masked tokens. That extra
    forward is not gradient-cached: its gradient reaches the encoder directly
    when the trainer back-propagates the total loss (correct with or without
    ``grad_cache_chunk``, but it holds one full-batch activation graph).

    Params: ``lam`` (λ ≥ 0, default 0.4), ``beta`` (β ≥ 0, default 0: no MLM),
    ``mlm_prob`` (default 0.15), ``rec_scale`` (``"authors"``: per-dimension mean as the authors' code, the
    default; ``"sum"``: sum over dimensions, see :func:`informin_reconstruction`).

    Raises:
        ValueError: negative λ/β, or ``beta > 0`` without an encoder in the context.
    """

    def __init__(
        self,
        ctx: ObjectiveContext,
        lam: float = 0.4,
        beta: float = 0.0,
        mlm_prob: float = 0.15,
        seed: int = 0,
        rec_scale: str = "authors",
    ):
        super().__init__(ctx)
        if lam < 0 or beta < 0:
            raise ValueError(f"lam and beta must be >= 0, got {lam}, {beta}")
        informin_reconstruction(torch.zeros(1, 2), torch.ones(1, 2), rec_scale)  # validates rec_scale
        self.rec_scale = rec_scale
        self.lam, self.beta, self.mlm_prob = float(lam), float(beta), float(mlm_prob)
        self.mlm_head: TiedMLMHead | None = None
        if self.beta > 0:
            if ctx.encoder is None:
                raise ValueError(
                    "informin with beta > 0 needs ctx.encoder (the MLM head is tied to its word embeddings)"
                )
            self.mlm_head = TiedMLMHead(ctx.encoder.word_embeddings)
            self.needs_token_states = False
            self._gen = torch.Generator().manual_seed(seed)

    def forward(self, batch: ObjectiveBatch) -> dict[str, torch.Tensor]:
        """``{"rec": λ·L_R}`` (:func:`informin_reconstruction` at ``rec_scale``) plus ``"mlm": β·CE`` when β > 0.

        Raises:
            RuntimeError: β > 0 and the batch lacks ``encoder`` / ``input_ids["anchor"]``.
        """
        out = {"rec": self.lam * informin_reconstruction(batch.anchor, batch.positive, self.rec_scale)}
        if self.mlm_head is not None:
            enc = batch.encoder
            if enc is None or "anchor" not in batch.input_ids:
                raise RuntimeError("informin MLM needs batch.encoder and batch.input_ids['anchor']")
            tok = enc.tokenizer
            ids, att = batch.input_ids["anchor"], batch.attention_mask["anchor"]
            masked, labels = mask_tokens(
                ids,
                att,
                mask_token_id=tok.mask_token_id,
                vocab_size=self.mlm_head.tied_weight.shape[0],
                special_ids=set(tok.all_special_ids),
                prob=self.mlm_prob,
                generator=self._gen,
            )
            states = enc(masked, att, return_token_states=True, use_head=False).token_states
            out["mlm"] = self.beta * mlm_loss(self.mlm_head, states, labels)
        return out
