"""SparseCSE end to end (SparseCSE §2, Fig. 2): score → prune → rewind → fine-tune → export → measure.

1. **Score** (§2.3): importance of every head and FFN neuron of the *scored*
   model (by default the default encoder; in the paper a SimCSE-trained model,
   pass its directory) with :func:`training.sparse.importance.compute_importance`.
2. **Prune** (§2.2–2.3): at sparsity ``s``, remove the fraction ``s`` of heads
   and of neurons with the lowest importance, physically
   (:func:`training.sparse.prune.apply_structure`).
3. **Rewind** (§2.1): the kept weights are taken from ``rewind_to`` (the model
   training started from; the default encoder here), not from the scored model.
   When the scored model *is* the starting model this is the identity.
4. **Fine-tune** (§2.1) the pruned model with the SimCSE objective through the
   project trainer (``training.trainer.Trainer``; any config, e.g.
   ``configs/sparsecse.yaml``, so 3R or other terms combine too).
5. **Export** the pruned encoder to an ONNX artifact (smaller Linear layers,
   so a smaller and faster graph) and **measure** parameters, ONNX bytes,
   ONNX Runtime throughput and STS.

Importance does not depend on the sparsity, so a sweep scores once.
"""

from __future__ import annotations

import json
import os
import shutil
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Literal

from training.encoder import SentenceEncoder
from training.sparse.importance import Importance, compute_importance, positive_pairs
from training.sparse.prune import (
    STRUCTURE_FILE,
    PruneStructure,
    apply_structure,
    count_parameters,
    load_pruned,
    save_pruned,
    select_structure,
)
from training.st_dir import DEFAULT_BASE_MODEL, copy_st_config, default_model_dir, read_st_config

__all__ = [
    "score_model",
    "prune_model_dir",
    "finetune_pruned",
    "export_pruned",
    "onnx_throughput",
    "artifact_stats",
]


def score_model(
    model_dir: str | None = None,
    *,
    lam: float = 0.5,
    min_score: float = 4.0,
    batch_size: int = 32,
    max_batches: int | None = 16,
    max_seq_length: int = 32,
    seed: int = 0,
) -> Importance:
    """Importance scores of ``model_dir``'s heads and neurons on STS-B train positives (SparseCSE §2.3).

    Args:
        model_dir: HF / sentence-transformers directory (default: the default encoder).
        lam: λ of ``L_score`` (paper default 0.5).
        min_score: gold threshold (0–5) for an STS-B **train** pair to count as positive.
        batch_size: pairs per batch; ``max_batches``: how many batches to average (None: all).
        max_seq_length: truncation (tokens), as in training.
        seed: order of the positives (:func:`training.sparse.importance.positive_pairs`).

    Raises:
        ValueError: not a BERT-style encoder.
    """
    enc = SentenceEncoder(model_dir or "", mlp_head=False, max_seq_length=max_seq_length)
    s1, s2 = positive_pairs("train", min_score, seed=seed)

    def embed(_model, sents: Sequence[str]):
        return enc(**enc.tokenize(sents), use_head=False).embedding

    return compute_importance(enc.model, embed, s1, s2, lam=lam, batch_size=batch_size, max_batches=max_batches)


def prune_model_dir(
    importance: Importance,
    sparsity: float,
    output_dir: str | Path,
    *,
    rewind_to: str | None = None,
    min_heads: int = 1,
    min_neurons: int = 1,
) -> PruneStructure:
    """Select, rewind and physically prune; save to ``output_dir`` (see :func:`~training.sparse.prune.save_pruned`).

    Args:
        importance: scores from :func:`score_model`.
        sparsity: fraction of heads and of FFN neurons to remove (paper: 0.01–0.5).
        rewind_to: directory whose weights the kept units take (default: the default encoder).

    Returns:
        the :class:`PruneStructure` (also written to ``output_dir/sparse_structure.json``).

    Raises:
        ValueError: sparsity outside ``[0, 1)`` or architecture mismatch.
    """
    from transformers import AutoModel

    src = Path(rewind_to or default_model_dir())
    structure = select_structure(
        importance.heads, importance.neurons, sparsity, min_heads=min_heads, min_neurons=min_neurons
    )
    model = AutoModel.from_pretrained(str(src), local_files_only=True)
    base_params = count_parameters(model)
    apply_structure(model, structure)
    structure.meta.update(
        {
            "rewound_to": str(src),
            "params_before": base_params,
            "params_after": count_parameters(model),
            "importance_batches": importance.n_batches,
        }
    )
    out = Path(output_dir)
    save_pruned(model, structure, out, tokenizer_src=src)
    copy_st_config(src, out)
    return structure


def finetune_pruned(
    pruned_dir: str | Path,
    output_dir: str | Path,
    *,
    config_file: str | None = None,
    overrides: dict[str, Any] | None = None,
) -> Path:
    """Fine-tune a pruned model with the project trainer (SimCSE by default; SparseCSE §2.1 "rewinding").

    The trainer's own export and final STS suite are switched off (the pruned
    model is exported by :func:`export_pruned`); ``sparse_structure.json`` is
    copied into the best checkpoint so it reloads with its pruned shapes.

    Returns:
        the best checkpoint directory (``output_dir/best``).

    Raises:
        whatever :class:`training.trainer.Trainer` raises for a bad config.
    """
    from training.config import load_settings
    from training.trainer import Trainer

    ov = dict(overrides or {})
    ov.update(
        {"model_name_or_path": str(pruned_dir), "output_dir": str(output_dir), "export": False, "final_eval": False}
    )
    cfg = load_settings(config_file, ov)
    Trainer(cfg).run()
    best = Path(output_dir) / "best"
    if (Path(pruned_dir) / STRUCTURE_FILE).is_file():
        shutil.copy(Path(pruned_dir) / STRUCTURE_FILE, best / STRUCTURE_FILE)
    return best


def export_pruned(
    model_dir: str | Path,
    artifact_dir: str | Path,
    *,
    name: str,
    version: str = "1",
    training: dict[str, Any] | None = None,
    scores: dict[str, float] | None = None,
    evaluate: Literal["none", "dev", "all"] = "dev",
    base_model: str = DEFAULT_BASE_MODEL,
):
    """Export a (pruned or plain) encoder directory to an ONNX artifact, recording its sparse structure.

    A thin wrapper over :func:`training.export.export_artifact` (which loads pruned
    directories itself): pooling from the directory's sentence-transformers files
    (default mean), max_seq_length from them (default 128), and the kept heads/neurons
    added to the manifest's ``training`` recipe. Only the encoder and pooling are exported.

    Returns:
        the artifact's :class:`artifact_contract.Manifest`.

    Raises:
        training.export.ExportError: parity failure.
    """
    from training.export import export_artifact

    d = Path(model_dir)
    max_len = read_st_config(d).max_seq_length
    rec = dict(training or {})
    if (d / STRUCTURE_FILE).is_file():
        rec["sparse_structure"] = json.loads((d / STRUCTURE_FILE).read_text())
    return export_artifact(
        d,
        artifact_dir,
        name=name,
        version=version,
        base_model=base_model,
        max_seq_length=int(max_len or 128),
        training=rec,
        scores=scores,
        evaluate=evaluate,
    )


def onnx_throughput(
    artifact_dir: str | Path, sentences: Sequence[str], *, batch_size: int = 32, threads: int = 1, repeats: int = 3
) -> float:
    """Sentences per second of the artifact's ONNX graph with ONNX Runtime (the service's backend) on CPU.

    Tokenisation included; best of ``repeats`` passes over ``sentences`` in
    batches of ``batch_size``, ``threads`` intra-op threads (1: comparable on a
    shared machine).
    """
    from training.onnx_encoder import OnnxArtifactEncoder

    enc = OnnxArtifactEncoder(artifact_dir, intra_op_threads=threads)
    enc.pooled(sentences[:batch_size], batch_size)  # warm-up
    best = 0.0
    for _ in range(repeats):
        t = time.perf_counter()
        enc.pooled(sentences, batch_size)
        best = max(best, len(sentences) / (time.perf_counter() - t))
    return best


def artifact_stats(artifact_dir: str | Path, model_dir: str | Path, sentences: Sequence[str], **kw) -> dict[str, Any]:
    """``{"params", "onnx_bytes", "sent_per_s"}`` for an exported artifact and its source directory."""
    from artifact_contract import MODEL_FILE

    model = load_pruned(model_dir)
    return {
        "params": count_parameters(model),
        "onnx_bytes": os.path.getsize(Path(artifact_dir) / MODEL_FILE),
        "sent_per_s": onnx_throughput(artifact_dir, sentences, **kw),
    }


def throughput_sentences(n: int = 512) -> list[str]:
    """``n`` real sentences for throughput (STS-B dev, unique, in file order)."""
    from training.data.sts import load_task

    p = load_task("STSBenchmark-dev")
    return list(dict.fromkeys(p.sent1 + p.sent2))[:n]
