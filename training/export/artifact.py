"""Export + parity: a torch encoder to a servable ONNX artifact (``model.onnx``, tokenizer files, manifest).

* the graph (:mod:`training.export.graph`) is exported by the TorchScript exporter first, then torch.export,
  and the first whose output matches the torch module on real sentences is kept: fp32 must reach
  max |diff| <= 1e-4 and per-sentence cosine >= 0.9999, else :class:`ExportError` and no manifest is written;
* ``quantize="int8"`` or ``dtype="fp16"``: the fp32 artifact is made in a temporary directory and converted
  (:mod:`training.export.quantize`).

The manifest is written last, so a half-written directory is never an artifact.
"""

from __future__ import annotations

import dataclasses
import json
import os
import tempfile
from pathlib import Path
from typing import Any, Literal

from artifact_contract import MODEL_FILE, TOKENIZER_FILE, Manifest
from training.export.graph import ONNX_OPSET, load_pooled_encoder, onnx_export, opset_of, torch_pooled
from training.export.parity import (
    ExportError,
    fp32_parity_failure,
    measure_parity,
    parity_sentences,
    write_artifact_manifest,
)
from training.export.quantize import CONVERSIONS, fused_artifact
from training.pooling import Pooling
from training.st_dir import DEFAULT_BASE_MODEL, default_model_dir

Evaluate = Literal["none", "dev", "all"]


@dataclasses.dataclass
class ArtifactSpec:
    """The manifest fields known before the graph exists (see ``models/README.md``).

    ``training``: the training recipe, or None for an untrained export. ``prompts``, ``default_prompt_name``:
    sentence-transformers' (:func:`st_prompts`), None when the model has none.
    """

    name: str
    base_model: str
    pooling: Pooling
    max_seq_length: int
    version: str = "1"
    normalize: bool = True
    training: dict[str, Any] | None = None
    prompts: dict[str, str] | None = None
    default_prompt_name: str | None = None


#: sentence-transformers' model configuration, which holds its ``prompts`` and ``default_prompt_name``
ST_CONFIG_FILE = "config_sentence_transformers.json"


def st_prompts(model_dir: str | Path) -> tuple[dict[str, str] | None, str | None]:
    """``(prompts, default_prompt_name)`` of a sentence-transformers directory's ``config_sentence_transformers.json``
    (sentence-transformers API reference, ``SentenceTransformer(prompts=..., default_prompt_name=...)``), for the
    manifest; ``(None, None)`` without the file or without prompts (an empty ``prompts`` is none).

    Raises:
        ExportError: the file is not JSON, ``prompts`` is not a mapping of names to strings, or
            ``default_prompt_name`` is not one of its names (sentence-transformers refuses that model too).
    """
    path = Path(model_dir) / ST_CONFIG_FILE
    if not path.is_file():
        return None, None
    try:
        cfg = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise ExportError(f"{path}: not readable JSON ({e})") from e
    prompts, default = cfg.get("prompts") or None, cfg.get("default_prompt_name")
    if prompts is not None and not (
        isinstance(prompts, dict) and all(isinstance(k, str) and k and isinstance(v, str) for k, v in prompts.items())
    ):
        raise ExportError(f"{path}: prompts must map prompt names to strings, got {prompts!r}")
    if default is not None and default not in (prompts or {}):
        raise ExportError(f"{path}: default_prompt_name {default!r} is not one of its prompts {sorted(prompts or {})}")
    return prompts, default


def save_tokenizer(tokenizer, out: Path, max_len: int) -> None:
    """Save a Hugging Face fast tokenizer; ``tokenizer.json`` carries truncation at ``max_len`` and padding to the
    longest, so ``tokenizers`` alone reproduces the training-side tokenization."""
    tokenizer.save_pretrained(str(out))
    from tokenizers import Tokenizer

    tk = Tokenizer.from_file(str(out / TOKENIZER_FILE))
    tk.enable_truncation(max_len)
    pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0
    tk.enable_padding(pad_id=pad_id, pad_token=tokenizer.pad_token or "[PAD]")
    tk.save(str(out / TOKENIZER_FILE))


def export_module(
    module,
    tokenizer,
    output_dir: str | Path,
    spec: ArtifactSpec,
    *,
    scores: dict[str, float] | None = None,
    evaluate: Evaluate = "dev",
    opset: int = ONNX_OPSET,
) -> Manifest:
    """Export a :class:`~training.export.graph.PooledEncoder`-like module (``(ids, mask) -> pooled``) to an artifact.

    Args:
        module: torch module; ``forward(input_ids, attention_mask) -> (batch, dim)`` (put in eval mode here).
        tokenizer: a Hugging Face fast tokenizer (saved as ``tokenizer.json`` + companions).
        output_dir: artifact directory (created; an existing ``manifest.json`` is removed first, replaced last).
        spec: the manifest's identity and model fields.
        scores: known STS scores to record; ``evaluate`` adds STS-B dev (``"dev"``) or the
            full suite (``"all"``) measured on the exported ONNX graph.

    Returns:
        The written manifest.

    Raises:
        ExportError: parity outside max |diff| <= 1e-4 / cosine >= 0.9999 with every exporter.
    """
    from training.onnx_encoder import OnnxArtifactEncoder

    out = Path(output_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "manifest.json").unlink(missing_ok=True)
    module = module.eval()
    save_tokenizer(tokenizer, out, spec.max_seq_length)
    sents, source = parity_sentences()
    ref = torch_pooled(module, tokenizer, sents, spec.max_seq_length)
    tmp_model = out / f".{MODEL_FILE}.tmp"
    failures = []
    for exporter in ("torchscript", "dynamo"):
        try:
            onnx_export(module, tokenizer, tmp_model, spec.max_seq_length, opset, exporter)
        except Exception as e:  # an exporter that cannot handle this module: try the next one
            failures.append(f"{exporter}: {type(e).__name__}: {e}")
            continue
        enc = OnnxArtifactEncoder(out, max_seq_length=spec.max_seq_length, model_file=tmp_model)
        got = enc.pooled(sents, batch_size=48)  # different batching/padding from the reference on purpose
        parity = measure_parity(ref, got, f"{source}, ONNX vs torch", enc.provider)
        if (why := fp32_parity_failure(parity)) is None:
            break
        failures.append(f"{exporter}: {why}")
    else:
        tmp_model.unlink(missing_ok=True)
        raise ExportError("ONNX export failed: " + "; ".join(failures))
    os.replace(tmp_model, out / MODEL_FILE)
    enc = OnnxArtifactEncoder(out, max_seq_length=spec.max_seq_length)
    all_scores = dict(scores or {})
    if evaluate != "none":
        from training.data.sts import TEST_TASKS
        from training.evaluation import evaluate_sts

        tasks = ["STSBenchmark-dev"] + (TEST_TASKS if evaluate == "all" else [])
        all_scores.update(evaluate_sts(enc.encode, tasks))
    fields = {**dataclasses.asdict(spec), "dimension": int(got.shape[1]), "onnx_opset": opset_of(out / MODEL_FILE)}
    return write_artifact_manifest(out, fields, enc, parity=parity, scores=all_scores)


def export_artifact(
    model_dir: str | Path,
    output_dir: str | Path,
    *,
    name: str,
    version: str = "1",
    pooling: Pooling | None = None,
    normalize: bool | None = None,
    max_seq_length: int | None = None,
    base_model: str | None = None,
    training: dict[str, Any] | None = None,
    scores: dict[str, float] | None = None,
    quantize: Literal["int8"] | None = None,
    dtype: Literal["fp32", "fp16"] = "fp32",
    evaluate: Evaluate = "dev",
    fuse: bool = False,
) -> Manifest:
    """Export a Hugging Face / sentence-transformers encoder directory to an artifact.

    Pooling, max_seq_length and ``normalize`` (None: a ``Normalize`` module in ``modules.json``, or no
    ``modules.json``) default to the directory's sentence-transformers config, older or current format (else
    ``mean`` and the tokenizer's limit, capped at 512); its ``prompts`` and ``default_prompt_name``
    (``config_sentence_transformers.json``, :func:`st_prompts`) go into the manifest. A sentence-transformers ``Dense`` module
    (supervised SimCSE's MLP kept at test time) goes into the graph, and the manifest's ``training`` says so. With
    ``quantize="int8"`` or ``dtype="fp16"`` (exclusive) the fp32 graph is exported to a temporary directory and
    ``output_dir`` receives the converted artifact (:mod:`training.export.quantize`). ``fuse``: the fp32 or fp16
    graph with ONNX Runtime's fused encoder layers (:func:`~training.export.quantize.fused_artifact`; not with int8).

    Raises:
        ExportError: unreadable directory, unsupported pooling, quantization or dtype, int8 with ``fuse``, an encoder
            whose layers do not all fuse, or failed parity.
    """
    model_dir = Path(model_dir)
    if quantize not in (None, "int8") or dtype not in ("fp32", "fp16"):
        raise ExportError(f"unsupported quantization {quantize!r} or dtype {dtype!r} (int8; fp32 or fp16)")
    if quantize is not None and dtype != "fp32":
        raise ExportError(f"quantization {quantize} applies to fp32 graphs, not dtype {dtype}")
    if fuse and quantize is not None:
        raise ExportError(f"fuse applies to fp32 and fp16 graphs, not quantization {quantize}")
    convert = quantize or (dtype if dtype != "fp32" else None)
    loaded = load_pooled_encoder(model_dir, pooling, max_seq_length)
    module, tokenizer, pooling, max_seq_length, has_head, st_normalize = loaded
    normalize = st_normalize if normalize is None else normalize
    if base_model is None:
        base_model = DEFAULT_BASE_MODEL if model_dir.resolve() == default_model_dir().resolve() else str(model_dir)
    if has_head:
        training = {**(training or {}), "inference_head": "MLP (tanh Dense) after pooling, kept in the graph"}
    prompts, default_prompt = st_prompts(model_dir)
    spec = ArtifactSpec(
        name, base_model, pooling, max_seq_length, version, normalize, training, prompts, default_prompt
    )
    if convert is None and not fuse:
        return export_module(module, tokenizer, output_dir, spec, scores=scores, evaluate=evaluate)
    with tempfile.TemporaryDirectory(prefix="fp32-") as tmp:
        export_module(module, tokenizer, tmp, spec, scores=scores, evaluate="dev")
        if fuse:
            cfg = module.encoder.config
            return fused_artifact(
                tmp,
                output_dir,
                name=name,
                version=version,
                num_heads=cfg.num_attention_heads,
                hidden_size=cfg.hidden_size,
                num_layers=cfg.num_hidden_layers,
                dtype=dtype,
            )
        return CONVERSIONS[convert](tmp, output_dir, name=name, version=version)
