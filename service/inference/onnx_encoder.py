"""One loaded model: ONNX Runtime session + tokenizer + ``artifact_contract.postprocess``.

A :class:`OnnxModel` is a plain object; the service may hold several (see
``service.inference.model_registry``). Its methods are synchronous and thread-safe (ONNX
Runtime sessions and ``tokenizers.Tokenizer`` may be used from several threads);
the batcher calls them off the event loop.
"""

from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import onnxruntime as ort

from artifact_contract import (
    INPUT_NAMES,
    MODEL_FILE,
    OUTPUT_NAME,
    ArtifactError,
    Manifest,
    postprocess,
    validate_artifact,
)
from service.inference.prompts import prompts_leaving_no_room
from service.inference.providers import CUDA, ProviderError, open_session
from service.inference.text_tokenizer import TextTokenizer, Tokenized

log = logging.getLogger("service.inference.onnx_encoder")


class ModelLoadError(RuntimeError):
    """A model could not be loaded or failed its checks (ONNX signature, warm-up, canary).

    The message names the artifact directory and what is wrong.
    """


class PrecisionUnsupported(ModelLoadError):
    """An fp16 artifact (``manifest.dtype == "fp16"``) on a session without ONNX Runtime's CUDA provider.

    fp16 artifacts are for GPU serving. ONNX Runtime's CPU provider would run the fp16 ops it has no CPU kernel for
    in float32 behind casts it inserts (not the fp16 arithmetic the artifact is for), so the service refuses to load
    one there (admin API: 422 ``model_load_failed``; at start-up: the service does not start) and the fp32 artifact
    is the one to serve on a CPU.
    """


def session_options(intra_op_threads: int = 0, inter_op_threads: int = 0, spinning: bool = False) -> ort.SessionOptions:
    """The service's ONNX Runtime session options: every graph optimisation, sequential execution, the thread counts
    (0: ORT's default), busy-waiting between ops only with ``spinning`` (ORT docs, "Thread management")."""
    opts = ort.SessionOptions()
    opts.graph_optimization_level = ort.GraphOptimizationLevel.ORT_ENABLE_ALL
    opts.execution_mode = ort.ExecutionMode.ORT_SEQUENTIAL
    opts.intra_op_num_threads = intra_op_threads
    opts.inter_op_num_threads = inter_op_threads
    opts.log_severity_level = 3
    opts.add_session_config_entry("session.intra_op.allow_spinning", "1" if spinning else "0")
    opts.add_session_config_entry("session.inter_op.allow_spinning", "1" if spinning else "0")
    return opts


@dataclass(frozen=True)
class ModelInfo:
    """Identity of a loaded model, as reported to clients and to collections.

    ``dimension`` is the full embedding width (before any ``dimensions`` truncation);
    ``max_seq_length`` is in tokens, special tokens included.
    """

    name: str
    version: str
    sha256: str
    dimension: int
    max_seq_length: int
    quantization: str | None = None
    path: str = ""

    @property
    def id(self) -> str:
        """``name:version``, unique among loaded models."""
        return f"{self.name}:{self.version}"


class OnnxModel:
    """A validated, warmed-up artifact ready to embed.

    Args:
        artifact_dir: directory with ``manifest.json``, ``model.onnx``, ``tokenizer.json``.
        providers: ORT providers setting (``["auto"]`` or explicit names).
        intra_op_threads / inter_op_threads: ORT thread counts (0 = ORT default).
        spinning: ORT's ``session.intra_op.allow_spinning`` (busy-wait between ops).
        arena_shrink_tokens: after a batch of more than this many padded tokens (``batch x max_len``), ORT's
            CPU memory arena returns its wholly free regions to the OS (run option
            ``memory.enable_memory_arena_shrinkage``); the arena otherwise keeps the peak of the largest batch
            ever run for good. None: never shrink; 0: after every batch.

    Raises:
        ModelLoadError: the artifact is invalid (wraps :class:`ArtifactError`), the graph's
            inputs/outputs or output width disagree with the manifest, a prompt leaves no room for an input
            within ``max_seq_length`` (:func:`~service.inference.prompts.prompts_leaving_no_room`), the canary
            embeddings are not reproduced within ``canary.atol``, or an explicitly named provider (not ``auto``)
            could not be initialised (``auto`` falls back to the CPU, logged).
        PrecisionUnsupported: an fp16 artifact, and the session has no CUDA provider.
    """

    #: the graph output this class reads (a reranker's is ``logits``: :class:`service.inference.reranker.OnnxReranker`)
    OUTPUT = OUTPUT_NAME

    def __init__(
        self,
        artifact_dir: str | os.PathLike,
        *,
        providers: list[str] | None = None,
        intra_op_threads: int = 0,
        inter_op_threads: int = 0,
        spinning: bool = False,
        arena_shrink_tokens: int | None = None,
    ) -> None:
        self.path = Path(artifact_dir)
        self.arena_shrink_tokens = arena_shrink_tokens
        self._shrink = ort.RunOptions()
        self._shrink.add_run_config_entry("memory.enable_memory_arena_shrinkage", "cpu:0")
        try:
            self.manifest: Manifest = validate_artifact(self.path)
        except ArtifactError as e:
            raise ModelLoadError(str(e)) from e
        m = self.manifest
        self.info = ModelInfo(
            name=m.name,
            version=m.version,
            sha256=m.sha256,
            dimension=m.dimension,
            max_seq_length=m.max_seq_length,
            quantization=m.quantization,
            path=str(self.path),
        )
        self._session = self._open_session(providers or ["auto"], intra_op_threads, inter_op_threads, spinning)
        self.providers = self._session.get_providers()
        if m.dtype == "fp16" and CUDA not in self.providers:
            raise PrecisionUnsupported(
                f"{self.path}: an fp16 artifact needs ONNX Runtime's {CUDA} and this session runs on "
                f"{self.providers}; fp16 artifacts are for GPU serving, serve the fp32 artifact on a CPU "
                "(models/README.md)"
            )
        self._check_signature()
        try:
            self.text = TextTokenizer(self.path, m.max_seq_length)
        except ValueError as e:
            raise ModelLoadError(f"{self.path}: {e}") from e
        self._tok_trunc, self._tok_left, self._tok_full = self.text.trunc, self.text.left, self.text.full
        self.pad_id = self.text.pad_id
        if (problem := prompts_leaving_no_room(m, lambda t: len(self.tokenize([t]).ids[0]))) is not None:
            raise ModelLoadError(f"{self.path}: {problem}")

    # ---------------------------------------------------------------- loading
    def _open_session(self, providers: list[str], intra: int, inter: int, spinning: bool) -> ort.InferenceSession:
        try:
            return open_session(self.path / MODEL_FILE, session_options(intra, inter, spinning), providers)
        except ProviderError as e:
            raise ModelLoadError(f"{self.path}: {e}") from e

    def _check_signature(self) -> None:
        ins = {i.name: i for i in self._session.get_inputs()}
        outs = {o.name: o for o in self._session.get_outputs()}
        missing = [n for n in INPUT_NAMES if n not in ins]
        extra = [n for n in ins if n not in INPUT_NAMES]
        if missing or extra:
            raise ModelLoadError(
                f"{self.path}: ONNX inputs are {sorted(ins)}, the contract wants exactly {list(INPUT_NAMES)}"
            )
        for n in INPUT_NAMES:
            if ins[n].type != "tensor(int64)":
                raise ModelLoadError(f"{self.path}: ONNX input {n!r} is {ins[n].type}, expected tensor(int64)")
        if self.OUTPUT not in outs:
            raise ModelLoadError(f"{self.path}: ONNX outputs are {sorted(outs)}, expected {self.OUTPUT!r}")
        shape = outs[self.OUTPUT].shape
        if len(shape) != 2:
            raise ModelLoadError(f"{self.path}: output {self.OUTPUT!r} has shape {shape}, expected (batch, dimension)")
        if isinstance(shape[1], int) and shape[1] != self.manifest.dimension:
            raise ModelLoadError(
                f"{self.path}: output {self.OUTPUT!r} has {shape[1]} columns, manifest dimension is "
                f"{self.manifest.dimension}"
            )

    # ---------------------------------------------------------------- inference
    def tokenize(self, texts: list[str], truncate: bool = True, direction: str = "right") -> Tokenized:
        """Token ids for ``texts`` (no padding): :meth:`TextTokenizer.tokenize` (truncation, ``direction``, the
        character budget)."""
        return self.text.tokenize(texts, truncate, direction)

    def encodings(self, texts: list[str], add_special_tokens: bool = True) -> list:
        """:meth:`TextTokenizer.encodings`: the untruncated ``tokenizers.Encoding`` of each text."""
        return self.text.encodings(texts, add_special_tokens)

    def decode(self, ids: list[list[int]], skip_special_tokens: bool = True) -> list[str]:
        """The text of each id list (``ids`` within :attr:`vocab_size`)."""
        return self.text.decode(ids, skip_special_tokens)

    @property
    def vocab_size(self) -> int:
        """Token ids run from 0 to ``vocab_size - 1``."""
        return self.text.vocab_size

    @property
    def char_budget(self) -> int:
        """Characters of a text read by the tokenizer: ``CHARS_PER_TOKEN * max_seq_length``."""
        return self.text.char_budget

    _encode = staticmethod(TextTokenizer.encode)

    def pad(self, ids: list[np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        """Right-pad to the longest sequence: ``(input_ids, attention_mask)``, both int64 ``(batch, max_len)``."""
        n = len(ids)
        max_len = max(len(x) for x in ids)
        input_ids = np.full((n, max_len), self.pad_id, dtype=np.int64)
        mask = np.zeros((n, max_len), dtype=np.int64)
        for i, x in enumerate(ids):
            input_ids[i, : len(x)] = x
            mask[i, : len(x)] = 1
        return input_ids, mask

    def run(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        """The graph's pooled, *unnormalised* output: float32 ``(batch, dimension)``.

        Raises:
            RuntimeError: ORT failed, or the output is not ``(batch, dimension)``.
        """
        shrink = self.arena_shrink_tokens is not None and input_ids.size > self.arena_shrink_tokens
        feed = {"input_ids": input_ids, "attention_mask": attention_mask}
        out = self._session.run([self.OUTPUT], feed, self._shrink if shrink else None)[0]
        if out.ndim != 2 or out.shape != (input_ids.shape[0], self.info.dimension):
            raise RuntimeError(
                f"model returned shape {out.shape}, expected ({input_ids.shape[0]}, {self.info.dimension})"
            )
        return np.asarray(out, dtype=np.float32)

    def embed_sync(self, texts: list[str], normalize: bool = True, dimensions: int | None = None) -> np.ndarray:
        """Embed ``texts`` in one batch on the calling thread (warm-up, canary, tests).

        Returns float32 ``(len(texts), dimensions or dimension)``.
        """
        tok = self.tokenize(texts)
        return postprocess(self.run(*self.pad(tok.ids)), normalize=normalize, dimensions=dimensions)

    def warm_up(self, batch_size: int = 8) -> float:
        """Run a short and a ``max_seq_length`` batch once, then check the canary.

        Returns the seconds it took.

        Raises:
            ModelLoadError: non-finite output, or the canary does not match.
        """
        t0 = time.perf_counter()
        short = ["warm up"] * batch_size
        long = ["warm " * (self.info.max_seq_length * 2)] * 2
        for texts in (short, long):
            try:
                e = self.embed_sync(texts)
            except Exception as err:
                raise ModelLoadError(f"{self.path}: warm-up inference failed: {type(err).__name__}: {err}") from err
            if not np.isfinite(e).all():
                raise ModelLoadError(f"{self.path}: warm-up produced non-finite embeddings")
        self.check_canary()
        return time.perf_counter() - t0

    def check_canary(self) -> float | None:
        """Re-embed the manifest's canary sentences and compare; returns the max abs diff (None: no canary).

        Raises:
            ModelLoadError: non-finite embeddings, wrong width, or a difference above ``canary.atol``.
        """
        c = self.manifest.canary
        if c is None:
            return None
        got = self.embed_sync(list(c.sentences))
        want = np.asarray(c.embeddings, dtype=np.float32)
        if not np.isfinite(got).all():
            raise ModelLoadError(f"{self.path}: canary embeddings are not finite")
        if got.shape != want.shape:
            raise ModelLoadError(f"{self.path}: canary embeddings have shape {got.shape}, manifest has {want.shape}")
        diff = float(np.abs(got - want).max())
        if not diff <= c.atol:
            raise ModelLoadError(
                f"{self.path}: canary mismatch: max abs diff {diff:.3g} > atol {c.atol} "
                f"(the model.onnx/tokenizer on disk do not reproduce the exported embeddings)"
            )
        return diff
