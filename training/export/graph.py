"""Graph building: the torch module that becomes ``model.onnx``, and its conversion to ONNX.

* :class:`PooledEncoder`: ``(input_ids, attention_mask) -> sentence_embedding``, the encoder with pooling
  (:func:`training.pooling.pool`) and a head kept at inference inside the graph; normalisation stays outside it
  (:func:`artifact_contract.postprocess`).
* :func:`load_pooled_encoder`: that module and its tokenizer from a Hugging Face / sentence-transformers
  directory (a physically pruned SparseCSE directory included), with eager attention in float32.
* :func:`onnx_export`: dynamic ``batch``/``seq`` axes, by the TorchScript exporter (its attention ONNX Runtime
  fuses, faster on CPU) or by torch.export (``dynamo``, handles more modules).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from artifact_contract import INPUT_NAMES, OUTPUT_NAME
from training.encoder import MLPHead, load_backbone
from training.export.parity import ExportError
from training.pooling import POOLINGS, Pooling, pool
from training.st_dir import read_st_config, read_st_prompts

ONNX_OPSET = 18


class PooledEncoder(nn.Module):
    """Encoder + pooling: ``(input_ids, attention_mask) -> sentence_embedding``.

    Args:
        encoder: a module called as ``encoder(input_ids=..., attention_mask=...)``
            returning an object with ``last_hidden_state`` ``(batch, seq, hidden)``
            (any Hugging Face encoder, or a pruned one with the same interface).
        pooling: ``"mean"`` (average over positions where ``attention_mask`` is 1)
            or ``"cls"`` (the first token's vector).
        head: a module applied after pooling and kept in the graph (supervised SimCSE's MLP, saved as a
            sentence-transformers ``Dense``), or None. Train-only heads are never passed here.

    Forward returns ``(batch, hidden)`` float32, not normalised.

    Raises:
        ExportError: pooling is neither mean nor cls.
    """

    def __init__(self, encoder: nn.Module, pooling: Pooling, head: nn.Module | None = None) -> None:
        super().__init__()
        if pooling not in POOLINGS:
            raise ExportError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.encoder = encoder
        self.pooling = pooling
        self.head = head

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """The exported graph: last hidden states pooled (``mean`` over ``attention_mask`` or ``cls``), then the head
        if any; ``(batch, seq)`` ids and mask in, float32 ``(batch, hidden)`` out, not normalised."""
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        pooled = pool(h, attention_mask, self.pooling)
        return pooled if self.head is None else self.head(pooled)


def load_pooled_encoder(model_dir: Path, pooling: Pooling | None, max_seq_length: int | None):
    """Build the module to export from a Hugging Face / sentence-transformers directory.

    Pooling and max_seq_length default to the directory's sentence-transformers config, in its older or current
    format (:func:`training.st_dir.read_st_config`; else ``mean`` and the tokenizer's limit, capped at 512); a
    ``Dense`` module (a head kept at inference) goes into the graph. The normalisation the service applies by
    default follows the directory: on when ``modules.json`` lists a ``Normalize`` module (or there is no
    ``modules.json``: a raw Hugging Face directory), off otherwise.

    Returns:
        ``(module, tokenizer, pooling, max_seq_length, has_head, normalize)``; the module is float32, in eval mode.

    Raises:
        ExportError: not a model directory; a pooling mode other than mean or cls; a module the graph cannot hold
            (anything but Transformer, Pooling, one square tanh Dense, Normalize, in that order); a Pooling that
            leaves the prompt out (``include_prompt`` false) on a model with prompts; ``do_lower_case`` over a
            tokenizer that does not lowercase.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoTokenizer

    if not (model_dir / "config.json").is_file():
        raise ExportError(f"{model_dir}: not a Hugging Face model directory (no config.json)")
    try:
        st = read_st_config(model_dir)
    except ValueError as e:
        raise ExportError(str(e)) from e
    if st.unsupported:
        raise ExportError(
            f"{model_dir}: modules.json lists modules the ONNX graph cannot hold: {', '.join(st.unsupported)} "
            "(supported: Transformer, Pooling (mean or cls), one Dense, Normalize, in that order)"
        )
    if not st.include_prompt and any(read_st_prompts(model_dir)[0].values()):
        raise ExportError(
            f"{model_dir}: its Pooling leaves the prompt tokens out (include_prompt false); the exported graph pools "
            "every token it is given, prompt included"
        )
    pooling = pooling or st.pooling or "mean"
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    if st.do_lower_case and tokenizer.backend_tokenizer.normalizer.normalize_str("A") != "a":
        raise ExportError(f"{model_dir}: do_lower_case is set but its tokenizer does not lowercase; not supported")
    max_seq_length = int(max_seq_length or st.max_seq_length or min(int(tokenizer.model_max_length), 512))
    # Eager attention traces to a graph ONNX Runtime fuses; it matches SDPA to ~1e-6 (parity checks it).
    encoder = load_backbone(model_dir, dtype=torch.float32, attn_implementation="eager").float().eval()
    try:
        head = MLPHead.load_st_dense(st.dense_dir).float().eval() if st.dense_dir is not None else None
    except ValueError as e:
        raise ExportError(str(e)) from e
    normalize = True if st.normalize is None else st.normalize
    return PooledEncoder(encoder, pooling, head), tokenizer, pooling, max_seq_length, head is not None, normalize


def torch_pooled(module, tokenizer, sentences: Sequence[str], max_len: int, batch_size: int = 32) -> np.ndarray:
    """The torch module's embeddings of ``sentences``, ``(n, dim)`` float32 (the parity reference)."""
    outs = []
    with torch.inference_mode():
        for i in range(0, len(sentences), batch_size):
            enc = tokenizer(
                list(sentences[i : i + batch_size]),
                padding=True,
                truncation=True,
                max_length=max_len,
                return_tensors="pt",
            )
            outs.append(module(enc["input_ids"], enc["attention_mask"]).float().numpy())
    return np.concatenate(outs)


def onnx_export(module, tokenizer, path: Path, max_len: int, opset: int, exporter: str) -> None:
    """Write ``module`` to ``path`` with dynamic batch/seq axes.

    ``exporter="torchscript"`` (tracing) gives a graph whose attention ONNX Runtime
    fuses (faster on CPU) when the encoder runs eager attention; ``"dynamo"``
    (torch.export) handles more modules. :func:`training.export.artifact.export_module` tries both, in that
    order, and keeps the first that passes parity.
    """
    sample = tokenizer(
        ["A short one.", "A slightly longer example sentence for tracing."],
        padding=True,
        truncation=True,
        max_length=max_len,
        return_tensors="pt",
    )
    args = (sample["input_ids"], sample["attention_mask"])
    names = {"input_names": list(INPUT_NAMES), "output_names": [OUTPUT_NAME]}
    if exporter == "torchscript":
        axes = {n: {0: "batch", 1: "seq"} for n in INPUT_NAMES}
        options = {"dynamic_axes": {**axes, OUTPUT_NAME: {0: "batch"}}, "opset_version": min(opset, 17)}
        options.update(dynamo=False, do_constant_folding=True)
    else:
        dims = {0: torch.export.Dim("batch"), 1: torch.export.Dim("seq")}
        options = {"dynamic_shapes": {n: dims for n in INPUT_NAMES}, "opset_version": opset}
        options.update(dynamo=True, external_data=False)
    with torch.inference_mode():
        torch.onnx.export(module, args, str(path), **names, **options)


def opset_of(path: Path) -> int:
    """The default-domain opset of an ONNX file."""
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return max(op.version for op in model.opset_import if op.domain in ("", "ai.onnx"))
