"""A plain ONNX Runtime encoder for an artifact (training-side: export parity, STS evaluation).

The service has its own batched backend; this runner is the simple reference
used by ``training export`` and ``training eval --model <artifact>``.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import numpy as np

from artifact_contract import MODEL_FILE, OUTPUT_NAME, TOKENIZER_FILE, load_manifest, postprocess


class OnnxArtifactEncoder:
    """Encode sentences with an artifact's ``model.onnx`` and ``tokenizer.json``.

    Args:
        artifact_dir: directory holding the artifact (manifest read for pooling
            length and normalisation defaults).
        providers: ONNX Runtime providers (default: CPU).
        intra_op_threads: 0 lets ONNX Runtime choose.
        model_file: override the ONNX file (used to check a not-yet-installed graph).
    """

    def __init__(
        self,
        artifact_dir: str | Path,
        providers: Sequence[str] | None = None,
        intra_op_threads: int = 0,
        model_file: str | Path | None = None,
        max_seq_length: int | None = None,
    ) -> None:
        import onnxruntime as ort
        from tokenizers import Tokenizer

        self.dir = Path(artifact_dir)
        self.manifest = load_manifest(self.dir) if (self.dir / "manifest.json").exists() else None
        self.max_seq_length = max_seq_length or (self.manifest.max_seq_length if self.manifest else 512)
        self.tokenizer = Tokenizer.from_file(str(self.dir / TOKENIZER_FILE))
        self.tokenizer.enable_truncation(self.max_seq_length)
        pad = self.tokenizer.padding or {}
        self.tokenizer.enable_padding(pad_id=pad.get("pad_id", 0), pad_token=pad.get("pad_token", "[PAD]"))
        opts = ort.SessionOptions()
        opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
        opts.intra_op_num_threads = intra_op_threads
        self.session = ort.InferenceSession(
            str(model_file or self.dir / MODEL_FILE),
            sess_options=opts,
            providers=list(providers or ["CPUExecutionProvider"]),
        )

    @property
    def provider(self) -> str:
        """The execution provider the session runs on first (``CPUExecutionProvider`` unless asked otherwise)."""
        return self.session.get_providers()[0]

    def pooled(self, sentences: Sequence[str], batch_size: int = 64) -> np.ndarray:
        """Pooled, un-normalised embeddings, shape ``(len(sentences), dimension)`` float32.

        Sentences are sorted by length within the call to cut padding; the
        output keeps the input order.
        """
        order = np.argsort([len(s) for s in sentences], kind="stable")
        out: list[np.ndarray | None] = [None] * len(sentences)
        for start in range(0, len(order), batch_size):
            idx = order[start : start + batch_size]
            encs = self.tokenizer.encode_batch([sentences[i] for i in idx])
            ids = np.asarray([e.ids for e in encs], dtype=np.int64)
            mask = np.asarray([e.attention_mask for e in encs], dtype=np.int64)
            emb = self.session.run([OUTPUT_NAME], {"input_ids": ids, "attention_mask": mask})[0]
            for j, i in enumerate(idx):
                out[i] = emb[j]
        if not sentences:
            dim = self.manifest.dimension if self.manifest else 0
            return np.zeros((0, dim), dtype=np.float32)
        return np.stack(out).astype(np.float32)

    def encode(self, sentences: Sequence[str], batch_size: int = 64, normalize: bool = True) -> np.ndarray:
        """Embeddings as served: :func:`artifact_contract.postprocess` of :meth:`pooled`."""
        return postprocess(self.pooled(sentences, batch_size), normalize=normalize)
