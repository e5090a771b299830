"""Structured masks over BERT attention heads and FFN neurons (SparseCSE, SparseCSE §2.2).

transformers 5 dropped ``head_mask``, so the masks are applied with forward
hooks, which works for every attention implementation (eager, sdpa):

* head mask ξ (SparseCSE, the MHA equation of §2.2): a forward *pre*-hook on
  ``layer.attention.output.dense`` multiplies the concatenated per-head context
  ``(batch, seq, n_heads * head_dim)`` head by head before the output
  projection, i.e. ``MHA(X) = Σ_i ξ_i Attn_i(X)``;
* neuron mask ν (the FFN equation of §2.2): a forward hook on
  ``layer.intermediate`` multiplies the GELU activations
  ``(batch, seq, d_ffn)`` neuron by neuron, i.e. ``FFN(A) = Σ_i ν_i GELU_i(A)``.

Masks are float parameters (ones by default), so ``∂L/∂ξ`` and ``∂L/∂ν`` are
ordinary ``.grad`` tensors (used by :mod:`training.sparse.importance`).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

import torch
from torch import nn

__all__ = ["StructuredMasks", "find_bert_layers", "layer_shapes"]


def find_bert_layers(model: nn.Module) -> nn.ModuleList:
    """The transformer blocks of a BERT-style encoder inside ``model``.

    Looks for the first ``nn.ModuleList`` whose items have ``.attention.self``,
    ``.attention.output.dense``, ``.intermediate.dense`` and ``.output.dense``
    (``BertModel.encoder.layer``; also found inside wrappers such as a
    sentence-transformers model or a training encoder).

    Raises:
        ValueError: no such list exists (not a BERT-style encoder).
    """
    for mod in model.modules():
        if isinstance(mod, nn.ModuleList) and len(mod) > 0:
            first = mod[0]
            if (
                all(hasattr(first, a) for a in ("attention", "intermediate", "output"))
                and hasattr(first.attention, "self")
                and hasattr(first.attention, "output")
            ):
                return mod
    raise ValueError(f"no BERT-style layer list found in {type(model).__name__}")


def layer_shapes(model: nn.Module) -> list[tuple[int, int]]:
    """``[(n_heads, d_ffn), ...]`` per layer, read from the live Linear shapes (works after pruning)."""
    out = []
    for layer in find_bert_layers(model):
        sa = layer.attention.self
        n_heads = layer.attention.output.dense.in_features // sa.attention_head_size
        out.append((n_heads, layer.intermediate.dense.out_features))
    return out


class StructuredMasks(nn.Module):
    """Per-layer head masks ξ (shape ``(n_heads_l,)``) and neuron masks ν (``(d_ffn_l,)``).

    Args:
        shapes: ``[(n_heads, d_ffn), ...]`` per layer (see :func:`layer_shapes`).
        head_dim: size of one attention head (``hidden / heads``; 32 for MiniLM-L6).

    Use :meth:`attach` (or the :meth:`applied` context manager) to apply the
    masks to a model with matching shapes; ``head_masks[l][h] = 0`` removes
    head ``h`` of layer ``l`` from the forward pass exactly as physical
    pruning would.
    """

    def __init__(self, shapes: list[tuple[int, int]], head_dim: int) -> None:
        super().__init__()
        self.head_dim = int(head_dim)
        self.head_masks = nn.ParameterList([nn.Parameter(torch.ones(h)) for h, _ in shapes])
        self.ffn_masks = nn.ParameterList([nn.Parameter(torch.ones(f)) for _, f in shapes])
        self._handles: list[torch.utils.hooks.RemovableHandle] = []

    @classmethod
    def for_model(cls, model: nn.Module) -> StructuredMasks:
        """All-ones masks shaped for ``model``'s current (possibly pruned) layers."""
        layers = find_bert_layers(model)
        return cls(layer_shapes(model), layers[0].attention.self.attention_head_size)

    def attach(self, model: nn.Module) -> None:
        """Register the hooks on ``model``'s layers.

        Raises:
            ValueError: layer count or shapes differ from the masks', or masks are already attached.
        """
        if self._handles:
            raise ValueError("masks are already attached; call detach() first")
        layers = find_bert_layers(model)
        shapes = layer_shapes(model)
        mine = [(len(h), len(f)) for h, f in zip(self.head_masks, self.ffn_masks)]
        if shapes != mine:
            raise ValueError(f"mask shapes {mine} do not match model layers {shapes}")
        for l, layer in enumerate(layers):
            self._handles.append(layer.attention.output.dense.register_forward_pre_hook(self._head_hook(l)))
            self._handles.append(layer.intermediate.register_forward_hook(self._ffn_hook(l)))

    def detach(self) -> None:
        """Remove the hooks (the model runs unmasked again)."""
        for h in self._handles:
            h.remove()
        self._handles = []

    @contextmanager
    def applied(self, model: nn.Module) -> Iterator[StructuredMasks]:
        """``with masks.applied(model): ...`` attaches, then always detaches."""
        self.attach(model)
        try:
            yield self
        finally:
            self.detach()

    def _head_hook(self, l: int):
        def hook(_mod, args):
            (ctx, *rest) = args  # (batch, seq, n_heads * head_dim)
            m = self.head_masks[l].to(ctx.dtype)
            shp = ctx.shape
            ctx = (ctx.view(*shp[:-1], m.shape[0], self.head_dim) * m[:, None]).view(shp)
            return (ctx, *rest)

        return hook

    def _ffn_hook(self, l: int):
        def hook(_mod, _args, out):
            return out * self.ffn_masks[l].to(out.dtype)  # (batch, seq, d_ffn) * (d_ffn,)

        return hook

    def num_heads(self) -> int:
        """Total number of heads the masks cover."""
        return sum(len(m) for m in self.head_masks)

    def num_neurons(self) -> int:
        """Total number of FFN neurons the masks cover."""
        return sum(len(m) for m in self.ffn_masks)
