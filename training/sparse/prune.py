"""Physical structured pruning of a BERT encoder (SparseCSE, SparseCSE §2.2–2.3).

Pruned heads remove ``head_dim`` rows from the query/key/value projections and
the matching columns of the attention output projection; pruned FFN neurons
remove rows of ``intermediate.dense`` and columns of ``output.dense``. The
resulting model computes exactly what the masked model computes with those
masks set to 0 (tested), but with smaller matrices, so its ONNX export is
smaller and faster.

Per-layer head counts and FFN sizes differ after pruning, which a Hugging Face
``BertConfig`` cannot express. A pruned model is therefore saved as an HF
directory (``config.json`` of the *unpruned* architecture, tokenizer files,
``model.safetensors`` with the shrunken tensors) plus ``sparse_structure.json``
(kept head and neuron indices per layer); :func:`load_pruned` rebuilds it.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch
from torch import nn

from training.sparse.masks import find_bert_layers, layer_shapes

__all__ = [
    "PruneStructure",
    "select_structure",
    "apply_structure",
    "masks_for_structure",
    "count_parameters",
    "save_pruned",
    "load_pruned",
    "STRUCTURE_FILE",
    "expected_parameters",
]

STRUCTURE_FILE = "sparse_structure.json"


@dataclass
class PruneStructure:
    """What survives pruning: kept head and FFN-neuron indices per layer (indices into the original layer).

    ``heads[l]`` is a sorted list of kept head indices of layer ``l``;
    ``neurons[l]`` a sorted list of kept intermediate-neuron indices.
    ``original`` holds ``(n_heads, d_ffn)`` per layer before pruning.
    """

    heads: list[list[int]]
    neurons: list[list[int]]
    original: list[tuple[int, int]]
    sparsity: float = 0.0
    meta: dict = field(default_factory=dict)

    @property
    def head_sparsity(self) -> float:
        """Fraction of heads removed."""
        tot = sum(h for h, _ in self.original)
        return 1.0 - sum(len(h) for h in self.heads) / tot

    @property
    def neuron_sparsity(self) -> float:
        """Fraction of FFN neurons removed."""
        tot = sum(f for _, f in self.original)
        return 1.0 - sum(len(n) for n in self.neurons) / tot

    def to_json(self) -> dict:
        """The fields as a JSON-ready dict, plus the derived ``head_sparsity`` and ``neuron_sparsity``."""
        d = asdict(self)
        d["original"] = [list(x) for x in self.original]
        d["head_sparsity"] = self.head_sparsity
        d["neuron_sparsity"] = self.neuron_sparsity
        return d

    @classmethod
    def from_json(cls, d: dict) -> PruneStructure:
        """The inverse of :meth:`to_json` (derived keys ignored); ``KeyError`` when ``heads``, ``neurons`` or
        ``original`` is missing."""
        return cls(
            heads=[list(map(int, h)) for h in d["heads"]],
            neurons=[list(map(int, n)) for n in d["neurons"]],
            original=[tuple(x) for x in d["original"]],
            sparsity=float(d.get("sparsity", 0.0)),
            meta=dict(d.get("meta", {})),
        )


def _select(scores: list[torch.Tensor], sparsity: float, min_keep: int) -> list[list[int]]:
    """Globally rank all units by score and drop the ``round(sparsity * total)`` lowest,
    never leaving a layer with fewer than ``min_keep`` units."""
    flat = torch.cat([s.detach().float().flatten() for s in scores])
    total = flat.numel()
    n_prune = int(round(sparsity * total))
    keep = [torch.ones(len(s), dtype=torch.bool) for s in scores]
    if n_prune > 0:
        owners = torch.cat([torch.full((len(s),), l) for l, s in enumerate(scores)])
        local = torch.cat([torch.arange(len(s)) for s in scores])
        # stable ordering: ties broken by (layer, index) so selection is deterministic
        order = sorted(range(total), key=lambda i: (float(flat[i]), int(owners[i]), int(local[i])))
        pruned = 0
        for i in order:
            if pruned >= n_prune:
                break
            l, j = int(owners[i]), int(local[i])
            if int(keep[l].sum()) <= min_keep:
                continue
            keep[l][j] = False
            pruned += 1
    return [torch.nonzero(k).flatten().tolist() for k in keep]


def select_structure(
    head_scores: list[torch.Tensor],
    neuron_scores: list[torch.Tensor],
    sparsity: float,
    *,
    min_heads: int = 1,
    min_neurons: int = 1,
) -> PruneStructure:
    """Choose what to prune: the lowest-importance heads and neurons at ``sparsity``.

    As in SparseCSE §2.3 (last paragraph), heads and neurons are ranked
    separately, each globally across layers, and the fraction ``sparsity`` of
    each with the lowest importance is pruned.

    Args:
        head_scores: per layer, importance of each head, shape ``(n_heads_l,)``.
        neuron_scores: per layer, importance of each FFN neuron, ``(d_ffn_l,)``.
        sparsity: fraction in ``[0, 1)`` of heads and of neurons to remove (paper: 0.01–0.5).
        min_heads / min_neurons: never prune a layer below this many units
            (a layer with 0 heads cannot be expressed by the attention reshape).

    Raises:
        ValueError: sparsity outside ``[0, 1)`` or mismatched layer counts.
    """
    if not 0.0 <= sparsity < 1.0:
        raise ValueError(f"sparsity must be in [0, 1), got {sparsity}")
    if len(head_scores) != len(neuron_scores):
        raise ValueError("head_scores and neuron_scores have different layer counts")
    return PruneStructure(
        heads=_select(head_scores, sparsity, min_heads),
        neurons=_select(neuron_scores, sparsity, min_neurons),
        original=[(len(h), len(n)) for h, n in zip(head_scores, neuron_scores)],
        sparsity=float(sparsity),
    )


def _prune_linear(lin: nn.Linear, idx: torch.Tensor, dim: int) -> nn.Linear:
    """A new Linear keeping output rows (``dim=0``) or input columns (``dim=1``) ``idx``."""
    w = lin.weight.detach().index_select(dim, idx).clone()
    b = None
    if lin.bias is not None:
        b = lin.bias.detach().clone() if dim == 1 else lin.bias.detach()[idx].clone()
    new = nn.Linear(w.shape[1], w.shape[0], bias=b is not None, device=w.device, dtype=w.dtype)
    new.weight = nn.Parameter(w, requires_grad=lin.weight.requires_grad)
    if b is not None:
        new.bias = nn.Parameter(b, requires_grad=lin.bias.requires_grad)
    return new


def apply_structure(model: nn.Module, structure: PruneStructure) -> nn.Module:
    """Physically prune ``model`` (in place) to ``structure`` and return it.

    ``model`` must be unpruned with the layer shapes ``structure.original``
    (use this on a fresh copy of the scored model, or of the base model to
    *rewind*, SparseCSE §2.1).

    Raises:
        ValueError: the model's layer shapes differ from ``structure.original``.
    """
    layers = find_bert_layers(model)
    shapes = layer_shapes(model)
    if [tuple(s) for s in shapes] != [tuple(s) for s in structure.original]:
        raise ValueError(f"model layers {shapes} do not match the structure's original {structure.original}")
    for layer, heads, neurons in zip(layers, structure.heads, structure.neurons):
        sa = layer.attention.self
        dh = sa.attention_head_size
        dev = layer.attention.output.dense.weight.device
        idx = torch.cat([torch.arange(h * dh, (h + 1) * dh) for h in heads]).to(dev)
        sa.query = _prune_linear(sa.query, idx, 0)
        sa.key = _prune_linear(sa.key, idx, 0)
        sa.value = _prune_linear(sa.value, idx, 0)
        layer.attention.output.dense = _prune_linear(layer.attention.output.dense, idx, 1)
        sa.num_attention_heads = len(heads)
        sa.all_head_size = len(heads) * dh
        nidx = torch.as_tensor(neurons, dtype=torch.long, device=dev)
        layer.intermediate.dense = _prune_linear(layer.intermediate.dense, nidx, 0)
        layer.output.dense = _prune_linear(layer.output.dense, nidx, 1)
    return model


def masks_for_structure(structure: PruneStructure, head_dim: int):
    """0/1 :class:`~training.sparse.masks.StructuredMasks` for the *unpruned* model: 1 = kept.

    With these masks attached the unpruned model computes what
    ``apply_structure`` produces (used to test pruning).
    """
    from training.sparse.masks import StructuredMasks

    m = StructuredMasks(structure.original, head_dim)
    with torch.no_grad():
        for l, (h, n) in enumerate(zip(structure.heads, structure.neurons)):
            m.head_masks[l].zero_()
            m.head_masks[l][h] = 1.0
            m.ffn_masks[l].zero_()
            m.ffn_masks[l][n] = 1.0
    return m


def count_parameters(model: nn.Module) -> int:
    """Number of parameters (elements) of ``model``."""
    return sum(p.numel() for p in model.parameters())


def save_pruned(
    model: nn.Module, structure: PruneStructure, output_dir: str | Path, tokenizer_src: str | Path | None = None
) -> Path:
    """Save a physically pruned HF ``BertModel`` plus ``sparse_structure.json``.

    Args:
        model: the pruned ``transformers`` model (has ``save_pretrained``).
        structure: what :func:`apply_structure` applied.
        output_dir: created if missing.
        tokenizer_src: a directory whose tokenizer files are copied beside the weights.
    """
    import shutil

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out)
    (out / STRUCTURE_FILE).write_text(json.dumps(structure.to_json(), indent=1))
    if tokenizer_src is not None:
        for name in ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "vocab.txt"):
            p = Path(tokenizer_src) / name
            if p.exists():
                shutil.copy(p, out / name)
    return out


def load_pruned(model_dir: str | Path) -> nn.Module:
    """Rebuild a model saved by :func:`save_pruned` (or a plain HF directory when no structure file exists).

    Returns a ``transformers`` ``BertModel`` in eval mode whose layers have the
    saved (per-layer) head counts and FFN sizes.

    Raises:
        FileNotFoundError: no ``model.safetensors`` in ``model_dir``.
        RuntimeError: tensor shapes in the checkpoint do not match the structure.
    """
    from safetensors.torch import load_file
    from transformers import AutoConfig, AutoModel

    d = Path(model_dir)
    sfile = d / STRUCTURE_FILE
    if not sfile.exists():
        return AutoModel.from_pretrained(d).eval()
    structure = PruneStructure.from_json(json.loads(sfile.read_text()))
    config = AutoConfig.from_pretrained(d)
    model = AutoModel.from_config(config)
    apply_structure(model, structure)
    wfile = d / "model.safetensors"
    if not wfile.exists():
        raise FileNotFoundError(f"{wfile} not found")
    state = load_file(str(wfile))
    # save_pretrained may or may not prefix keys; align to the model's own names
    own = model.state_dict()
    if not set(state) & set(own):
        prefix = next(iter(own)).split(".")[0] + "."
        state = {k[len(prefix) :] if k.startswith(prefix) else k: v for k, v in state.items()}
    missing, unexpected = model.load_state_dict(state, strict=False)
    missing = [k for k in missing if "position_ids" not in k]
    if missing or unexpected:
        raise RuntimeError(f"pruned checkpoint mismatch: missing {missing[:5]}, unexpected {unexpected[:5]}")
    return model.eval()


def expected_parameters(structure: PruneStructure, hidden: int, head_dim: int, base_params: int) -> int:
    """Parameter count after pruning, computed from ``structure`` alone (for reports).

    Each removed head removes ``3 * (hidden * head_dim + head_dim)`` Q/K/V
    parameters and ``head_dim * hidden`` output-projection weights; each removed
    neuron removes ``hidden + 1`` (intermediate) and ``hidden`` (output) weights.
    """
    removed = 0
    for (h0, f0), h, n in zip(structure.original, structure.heads, structure.neurons):
        removed += (h0 - len(h)) * (3 * (hidden * head_dim + head_dim) + head_dim * hidden)
        removed += (f0 - len(n)) * (2 * hidden + 1)
    return base_params - removed
