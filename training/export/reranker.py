"""Export a sentence-transformers ``CrossEncoder`` (one logit per pair) to a reranker artifact (``task: "reranker"``).

The graph (:class:`PairScorer`): ``(input_ids, attention_mask) -> logits`` float32 ``(batch, 1)``, the raw score
of each ``[CLS] query [SEP] passage [SEP]`` row (the Hugging Face ``...ForSequenceClassification`` head; no sigmoid:
clients ask for it or not). The inputs are the artifact contract's two, so the service pads and batches pairs as it
does texts: the segment ids (``token_type_ids``, 0 up to the first ``[SEP]``, 1 after) are computed inside the graph
from ``input_ids``, as the tokenizer would give them for a pair.

Parity (recorded in the manifest, :class:`artifact_contract.Parity`): the largest |ONNX raw score -
``CrossEncoder.predict(..., activation_fn=Identity)``| on held-out pairs (the dev split's, or a built-in list), run
through ``tokenizer.json`` exactly as the service tokenizes pairs; over :data:`RERANK_PARITY_MAX_ABS` fails the
export (:class:`~training.export.parity.ExportError`) and no manifest is written. A sigmoid score differs by at most a
quarter of that. The canary is four pairs and their raw scores, re-scored by every loader.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch import nn

from artifact_contract import (
    INPUT_NAMES,
    MODEL_FILE,
    RERANK_OUTPUT_NAME,
    TOKENIZER_FILE,
    Canary,
    Manifest,
    Parity,
    now_utc,
    sha256_file,
    write_manifest,
)
from training.export.artifact import save_tokenizer
from training.export.graph import opset_of
from training.export.parity import ExportError

#: fp32 export tolerance of raw scores (logits) against ``CrossEncoder.predict``
RERANK_PARITY_MAX_ABS = 1e-4
#: ``CrossEncoder.activation_fn`` classes and the manifest's ``activation`` for each (the graph answers raw scores)
ACTIVATIONS = {"Sigmoid": "sigmoid", "Identity": "identity"}
CANARY_PAIRS = [
    ("What do cats do most of the day?", "Cats sleep most of the day."),
    ("What do cats do most of the day?", "Stocks fell sharply on Tuesday after the central bank raised rates."),
    (
        "Does the treatment reduce symptoms?",
        "The results suggest that the treatment reduces symptoms in most patients.",
    ),
    ("Who is playing an instrument?", "A man is playing a guitar."),
]


class PairScorer(nn.Module):
    """``(input_ids, attention_mask) -> logits (batch, num_labels)`` of a sequence-classification model, with the
    segment ids made from ``input_ids`` (1 after the first ``sep_id``, 0 before it and on padding).

    Args:
        model: a Hugging Face ``...ForSequenceClassification`` module (``CrossEncoder.model``).
        sep_id: the tokenizer's separator id (``[SEP]``).
        segments: pass segment ids at all; false for a model whose tokenizer makes none (RoBERTa / XLM-R style,
            e.g. bge-reranker: ``token_type_ids`` not among its ``model_input_names``).
    """

    def __init__(self, model: nn.Module, sep_id: int, segments: bool = True) -> None:
        super().__init__()
        self.model = model
        self.sep_id = int(sep_id)
        self.segments = segments

    def forward(self, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
        """Raw logits, float32 ``(batch, num_labels)``; int64 ``(batch, seq)`` inputs, right-padded."""
        if not self.segments:
            return self.model(input_ids=input_ids, attention_mask=attention_mask).logits.float()
        sep = (input_ids == self.sep_id).long()
        segment = ((torch.cumsum(sep, dim=1) - sep) > 0).long() * attention_mask
        return self.model(input_ids=input_ids, attention_mask=attention_mask, token_type_ids=segment).logits.float()


def onnx_pair_scores(
    artifact_dir: Path, pairs: Sequence[tuple[str, str]], model_file: Path | None = None, batch_size: int = 16
) -> np.ndarray:
    """Raw scores ``(n,)`` of ``pairs`` by the artifact's graph on ONNX Runtime's CPU provider, each pair tokenized
    by ``tokenizer.json`` (longest-first truncation to its ``max_seq_length``, right padding), as the service does."""
    import onnxruntime as ort
    from tokenizers import Tokenizer

    tok = Tokenizer.from_file(str(artifact_dir / TOKENIZER_FILE))
    sess = ort.InferenceSession(str(model_file or artifact_dir / MODEL_FILE), providers=["CPUExecutionProvider"])
    out = []
    for i in range(0, len(pairs), batch_size):
        encs = tok.encode_batch([tuple(p) for p in pairs[i : i + batch_size]])
        feed = {
            "input_ids": np.array([e.ids for e in encs], np.int64),
            "attention_mask": np.array([e.attention_mask for e in encs], np.int64),
        }
        out.append(sess.run([RERANK_OUTPUT_NAME], feed)[0][:, 0])
    return np.concatenate(out).astype(np.float32)


def _export_graph(module: PairScorer, tokenizer, path: Path, max_len: int) -> None:
    sample = tokenizer(
        ["a short query", "another query"],
        ["a passage", "a slightly longer passage for tracing"],
        padding=True,
        truncation=True,
        max_length=max_len,
        return_tensors="pt",
    )
    axes = {n: {0: "batch", 1: "seq"} for n in INPUT_NAMES}
    with torch.inference_mode():
        torch.onnx.export(
            module,
            (sample["input_ids"], sample["attention_mask"]),
            str(path),
            input_names=list(INPUT_NAMES),
            output_names=[RERANK_OUTPUT_NAME],
            dynamic_axes={**axes, RERANK_OUTPUT_NAME: {0: "batch"}},
            opset_version=17,
            dynamo=False,
            do_constant_folding=True,
        )


def export_reranker(
    model_dir: str | os.PathLike,
    output_dir: str | os.PathLike,
    *,
    name: str,
    version: str = "1",
    parity_pairs: Sequence[tuple[str, str]] | None = None,
    parity_source: str = "built-in canary pairs",
    base_model: str | None = None,
    training: dict | None = None,
    scores: dict[str, float] | None = None,
) -> Manifest:
    """Export the ``CrossEncoder`` saved in ``model_dir`` (one label) to a reranker artifact in ``output_dir``.

    Args:
        parity_pairs: held-out (query, passage) pairs the ONNX graph is checked on (default: the canary pairs).
        scores: figures to record (e.g. ``scifact-dev-ndcg@10``, x100).

    ``model_dir`` is a sentence-transformers ``CrossEncoder`` directory or any Hugging Face
    ``...ForSequenceClassification`` directory (``CrossEncoder`` loads both). Its ``activation_fn`` (sigmoid, the
    default for one label, or identity) is recorded as the manifest's ``activation``; the graph answers raw scores
    either way.

    Returns:
        The written manifest (``task: "reranker"``, ``dimension`` 1, ``pooling`` cls, ``normalize`` false).

    Raises:
        ExportError: not a sequence-classification directory, not one label, an activation other than sigmoid or
            identity, or parity over :data:`RERANK_PARITY_MAX_ABS`.
    """
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from sentence_transformers import CrossEncoder

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    arch = (
        json.loads(cfg.read_text()).get("architectures") if (cfg := Path(model_dir) / "config.json").is_file() else None
    )
    if not arch or not any(a.endswith("ForSequenceClassification") for a in arch):
        # CrossEncoder would put a fresh, random head on anything else: refuse rather than export noise
        raise ExportError(
            f"{model_dir}: not a sequence-classification model directory (config.json architectures {arch})"
        )
    ce = CrossEncoder(str(model_dir), device="cpu")
    if ce.model.config.num_labels != 1:
        raise ExportError(f"{model_dir}: a reranker has one label, this cross-encoder has {ce.model.config.num_labels}")
    activation = ACTIVATIONS.get(type(ce.activation_fn).__name__)
    if activation is None:
        raise ExportError(
            f"{model_dir}: CrossEncoder activation {ce.activation_fn!r} is not supported (Sigmoid or Identity)"
        )
    ce.model.set_attn_implementation("eager")  # traces to a graph ONNX Runtime fuses; parity checks it
    max_len = int(ce.max_seq_length)
    save_tokenizer(ce.tokenizer, out, max_len)
    tmp = out / f".{MODEL_FILE}.tmp"
    segments = "token_type_ids" in ce.tokenizer.model_input_names
    scorer = PairScorer(ce.model.eval(), ce.tokenizer.sep_token_id, segments).eval()
    _export_graph(scorer, ce.tokenizer, tmp, max_len)
    pairs = list(parity_pairs or CANARY_PAIRS)
    ref = np.asarray(ce.predict(pairs, activation_fn=nn.Identity(), batch_size=32), np.float32).reshape(-1)
    got = onnx_pair_scores(out, pairs, tmp, batch_size=7)  # different batching/padding from the reference
    max_abs = float(np.abs(ref - got).max())
    if not max_abs <= RERANK_PARITY_MAX_ABS:
        tmp.unlink(missing_ok=True)
        raise ExportError(f"reranker parity max |score diff| {max_abs:.3g} (limit {RERANK_PARITY_MAX_ABS})")
    os.replace(tmp, out / MODEL_FILE)
    canary = onnx_pair_scores(out, CANARY_PAIRS)
    manifest = Manifest(
        task="reranker",
        name=name,
        version=version,
        created_at=now_utc(),
        base_model=base_model or str(model_dir),
        training=training,
        pooling="cls",
        normalize=False,
        activation=activation,
        max_seq_length=max_len,
        dimension=1,
        onnx_opset=opset_of(out / MODEL_FILE),
        sha256=sha256_file(out / MODEL_FILE),
        scores=scores or {},
        parity=Parity(
            n_sentences=len(pairs),
            max_abs_diff=max_abs,
            provider="CPUExecutionProvider",
            source=f"{parity_source}: raw scores, ONNX vs CrossEncoder.predict",
        ),
        canary=Canary(
            queries=[q for q, _ in CANARY_PAIRS],
            sentences=[p for _, p in CANARY_PAIRS],
            embeddings=[[float(s)] for s in canary],
        ),
        files=sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")),
    )
    write_manifest(out, manifest)
    return manifest


def local_parity_pairs(n: int = 64) -> tuple[list[tuple[str, str]], str]:
    """``n`` real (query, passage) pairs for a cross-encoder exported without training, and their source: SciFact
    train claims, each with its judged abstracts and other abstracts (many over 128 tokens, so truncation is
    exercised), or the canary pairs when the shared data is absent (the manifest's ``parity.source`` says which)."""
    from training.data.scifact import load_scifact

    try:
        data = load_scifact(max_queries=8, max_corpus=64, seed=0)
    except (FileNotFoundError, OSError):
        return list(CANARY_PAIRS), "built-in canary pairs (shared data not found)"
    docs = list(data.corpus)
    pairs = [(data.queries[q], data.corpus[d]) for q in sorted(data.qrels) for d in sorted(data.qrels[q])]
    for i, q in enumerate(sorted(data.qrels)):
        pairs += [(data.queries[q], data.corpus[docs[(i * 7 + j) % len(docs)]]) for j in range(n // 8)]
    return pairs[:n], f"SciFact train, {min(n, len(pairs))} (claim, abstract) pairs"
