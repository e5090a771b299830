"""Sentence encoder for training: a Hugging Face transformer + pooling (+ SimCSE's MLP head).

Shapes used throughout: ``N`` sentences, ``T`` tokens (padded), ``H`` hidden size, ``D = H``
the sentence-embedding dimension.

* Pooling (:mod:`training.pooling`, the one definition): ``mean`` averages the last hidden states over
  non-padding tokens (the default encoder, all-MiniLM-L6-v2, was trained with it); ``cls`` takes the ``[CLS]``
  hidden state. SimCSE (Gao et al., arXiv:2104.08821, §3) trains unsupervised ``cls`` models with an MLP head
  (Linear H→H + tanh) on top and drops the head at test time; supervised runs keep it
  (:attr:`SentenceEncoder.inference_head`), saved as a sentence-transformers ``Dense`` module and exported.
* The sentence-transformers files (pooling, Dense head, max length) are read and written by
  :mod:`training.st_dir`; a physically pruned directory (SparseCSE) loads through :func:`load_backbone`.
* Cosine similarity: :func:`cosine_matrix`, a matmul of L2-normalised embeddings.

No network access: models load with ``local_files_only=True``.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch
import torch.nn.functional as F
from torch import nn

from training.pooling import Pooling, pool
from training.st_dir import default_model_dir, read_st_config, read_st_prompts, write_st_config

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

logger = logging.getLogger(__name__)


def load_backbone(path: str | os.PathLike, *, local: bool = True, **kwargs) -> nn.Module:
    """The Hugging Face encoder stored at ``path``: a physically pruned one (``sparse_structure.json``, rebuilt by
    :func:`training.sparse.prune.load_pruned`) or ``AutoModel.from_pretrained(path, **kwargs)`` (``local``: offline).

    Raises:
        OSError: no loadable model at ``path``.
    """
    from training.sparse.prune import STRUCTURE_FILE, load_pruned

    if (Path(path) / STRUCTURE_FILE).is_file():
        return load_pruned(path)
    from transformers import AutoModel

    return AutoModel.from_pretrained(str(path), local_files_only=local, **kwargs)


def cosine_matrix(a: torch.Tensor, b: torch.Tensor) -> torch.Tensor:
    """Cosine similarity of every row of ``a`` (N, D) with every row of ``b`` (M, D): ``(N, M)``.

    Computed as ``normalize(a) @ normalize(b).T`` (L2, eps 1e-12).
    """
    return F.normalize(a, dim=-1) @ F.normalize(b, dim=-1).T


TANH = "torch.nn.modules.activation.Tanh"


class MLPHead(nn.Module):
    """SimCSE's MLP over the pooled representation: ``tanh(W h + b)``, (N, H) → (N, H).

    Train-only in unsupervised SimCSE; kept at test time in supervised SimCSE (Gao et al., arXiv:2104.08821,
    §6.3 / its ``cls`` vs ``cls_before_pooler`` poolers). Saved as a sentence-transformers ``Dense`` module
    (``linear.weight``, ``linear.bias``, tanh) so ``SentenceTransformer`` and the exporter load it.
    """

    def __init__(self, hidden: int):
        super().__init__()
        self.dense = nn.Linear(hidden, hidden)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        """MLP head: ``tanh(W x + b)`` on pooled ``x`` ``(N, H)``, returns ``(N, H)``."""
        return torch.tanh(self.dense(x))

    def save_st_dense(self, path: Path) -> None:
        """Write ``config.json`` + ``model.safetensors`` of a sentence-transformers ``Dense`` module."""
        from safetensors.torch import save_file

        path.mkdir(parents=True, exist_ok=True)
        h = self.dense.in_features
        cfg = {"in_features": h, "out_features": h, "bias": True, "activation_function": TANH}
        (path / "config.json").write_text(json.dumps(cfg, indent=2))
        w = {"linear.weight": self.dense.weight.detach().cpu().contiguous()}
        w["linear.bias"] = self.dense.bias.detach().cpu().contiguous()
        save_file(w, str(path / "model.safetensors"))

    @classmethod
    def load_st_dense(cls, path: str | os.PathLike) -> MLPHead:
        """Load a sentence-transformers ``Dense`` module written by :meth:`save_st_dense`.

        Raises:
            ValueError: not a square tanh ``Dense`` (the only head this project exports).
        """
        from safetensors.torch import load_file

        p = Path(path)
        cfg = json.loads((p / "config.json").read_text())
        if cfg["in_features"] != cfg["out_features"] or cfg.get("activation_function") != TANH:
            raise ValueError(f"{p}: only a square tanh Dense head is supported, got {cfg}")
        head = cls(cfg["in_features"])
        w = load_file(str(p / "model.safetensors"))
        head.dense.load_state_dict({"weight": w["linear.weight"], "bias": w["linear.bias"]})
        return head


@dataclass
class EncoderOutput:
    """What one encoder pass returns (all tensors float32).

    Attributes:
        embedding: ``(N, D)`` pooled (+ head, when the head is on) sentence embedding ``h``.
        layers: ``{layer: (N, D)}`` the same pooling (+ head) applied to intermediate hidden
            states; layer indices follow Hugging Face ``hidden_states`` (0 = embeddings output,
            ``num_layers`` = last); negative indices count from the end (``-2`` = penultimate).
        token_states: ``(N, T, H)`` last hidden states, only when requested.
    """

    embedding: torch.Tensor
    layers: dict[int, torch.Tensor] = field(default_factory=dict)
    token_states: torch.Tensor | None = None

    def tensors(self) -> dict[str, torch.Tensor]:
        """Flat ``{key: tensor}`` view (for gradient caching)."""
        out = {"embedding": self.embedding}
        for k, v in self.layers.items():
            out[f"layer{k}"] = v
        if self.token_states is not None:
            out["token_states"] = self.token_states
        return out

    @classmethod
    def from_tensors(cls, t: dict[str, torch.Tensor]) -> EncoderOutput:
        """The inverse of :meth:`tensors` (``layer{k}`` keys back to ``layers[k]``)."""
        layers = {int(k[5:]): v for k, v in t.items() if k.startswith("layer")}
        return cls(t["embedding"], layers, t.get("token_states"))


class SentenceEncoder(nn.Module):
    """A Hugging Face encoder with pooling and an optional train-only MLP head.

    Args:
        model_name_or_path: local Hugging Face / sentence-transformers directory (empty string: the default
            encoder), or a hub id such as ``bert-base-uncased`` (resolved by ``transformers``; needs a hub).
        pooling: ``"mean"`` or ``"cls"``; ``None`` reads it from the sentence-transformers
            config in the directory, else ``"mean"`` (the choice and its reason are logged).
        mlp_head: add SimCSE's MLP head for training (``None``: on for ``cls``, off for ``mean``).
        max_seq_length: truncation length in tokens for :meth:`tokenize` (SimCSE: 32).

    Raises:
        OSError: the directory does not hold a loadable model/tokenizer.
    """

    def __init__(
        self,
        model_name_or_path: str = "",
        pooling: Pooling | None = None,
        mlp_head: bool | None = None,
        max_seq_length: int = 32,
    ):
        super().__init__()
        from transformers import AutoTokenizer

        path = model_name_or_path or str(default_model_dir())
        self.source = path
        # a local directory is read offline; anything else is a hub id, resolved by transformers (users with
        # a hub; here it fails with transformers' own error since nothing can be fetched)
        local = Path(path).is_dir()
        st = read_st_config(path) if local else None
        st_pooling = st.pooling if st else None
        self.pooling: Pooling = pooling or st_pooling or "mean"
        why = (
            "set by the config"
            if pooling
            else "from its sentence-transformers pooling config"
            if st_pooling
            else "no sentence-transformers pooling config (a raw Hugging Face model): defaulting to mean; "
            "set pooling: cls for SimCSE's [CLS] recipe"
        )
        logger.info("encoder %s: %s pooling (%s)", path, self.pooling, why)
        self.tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=local)
        self.model = load_backbone(path, local=local)
        self.max_seq_length = max_seq_length
        #: the inference-time truncation length written to ``sentence_bert_config.json`` (the base
        #: model's own value, else 128); training truncates at ``max_seq_length``.
        self.serve_max_seq_length = (st.max_seq_length if st else None) or 128
        hidden = self.model.config.hidden_size
        dense = st.dense_dir if st else None
        #: apply the head at inference (``encode``'s default): a saved ``Dense`` head (supervised SimCSE) is kept
        self.inference_head = dense is not None and mlp_head is not False
        use_head = (self.pooling == "cls") if mlp_head is None else mlp_head
        self.head: MLPHead | None = MLPHead(hidden) if use_head else None
        if self.inference_head:
            self.head = MLPHead.load_st_dense(dense)

    # ---- properties used by objectives -------------------------------------------------
    @property
    def hidden_size(self) -> int:
        """The backbone's hidden width ``H`` (``config.hidden_size``)."""
        return self.model.config.hidden_size

    @property
    def num_layers(self) -> int:
        """The backbone's transformer layer count (``config.num_hidden_layers``)."""
        return self.model.config.num_hidden_layers

    @property
    def word_embeddings(self) -> nn.Embedding:
        """The input token-embedding table ``(vocab, H)`` (for tied output layers, e.g. MSSE's decoder)."""
        return self.model.get_input_embeddings()

    @property
    def device(self) -> torch.device:
        """The device of the backbone's parameters."""
        return next(self.model.parameters()).device

    # ---- tokenisation / forward ------------------------------------------------------
    def set_dropout(self, p: float) -> None:
        """Set the rate of every dropout layer of the backbone to ``p`` (SimCSE's augmentation noise: Gao et al.,
        "SimCSE", arXiv:2104.08821, Table 2 sweeps p for BERT-base and finds 0.1 best) and record it in the model
        config, so the saved model states the rate it was trained with.

        Raises:
            ValueError: ``p`` outside [0, 1).
        """
        if not 0.0 <= p < 1.0:
            raise ValueError(f"dropout must be in [0, 1), got {p}")
        for m in self.model.modules():
            if isinstance(m, nn.Dropout):
                m.p = p
        for key in ("hidden_dropout_prob", "attention_probs_dropout_prob"):
            if hasattr(self.model.config, key):
                setattr(self.model.config, key, p)

    def tokenize(self, texts: Sequence[str], max_seq_length: int | None = None) -> dict[str, torch.Tensor]:
        """Tokenise to ``input_ids`` / ``attention_mask`` (int64, ``(N, T)``), padded to the longest, truncated."""
        enc = self.tokenizer(
            list(texts),
            padding=True,
            truncation=True,
            max_length=max_seq_length or self.max_seq_length,
            return_tensors="pt",
        )
        out = {"input_ids": enc["input_ids"], "attention_mask": enc["attention_mask"]}
        if "token_type_ids" in enc:
            out["token_type_ids"] = enc["token_type_ids"]
        return {k: v.to(self.device) for k, v in out.items()}

    def _pool_head(self, states: torch.Tensor, mask: torch.Tensor, use_head: bool) -> torch.Tensor:
        h = pool(states, mask, self.pooling).float()
        if use_head and self.head is not None:
            h = self.head(h).float()
        return h

    def forward(
        self,
        input_ids: torch.Tensor,
        attention_mask: torch.Tensor,
        token_type_ids: torch.Tensor | None = None,
        *,
        layers: Sequence[int] = (),
        return_token_states: bool = False,
        use_head: bool = True,
    ) -> EncoderOutput:
        """Encode a tokenised batch.

        Args:
            input_ids, attention_mask: ``(N, T)`` int64.
            layers: intermediate layers to pool as well (see :class:`EncoderOutput`).
            return_token_states: also return the last hidden states ``(N, T, H)``.
            use_head: apply the train-only MLP head (if the encoder has one).

        Returns:
            :class:`EncoderOutput` with float32 tensors.
        """
        kw = {"input_ids": input_ids, "attention_mask": attention_mask}
        if token_type_ids is not None:
            kw["token_type_ids"] = token_type_ids
        out = self.model(**kw, output_hidden_states=bool(layers))
        last = out.last_hidden_state
        emb = self._pool_head(last, attention_mask, use_head)
        lay: dict[int, torch.Tensor] = {}
        if layers:
            hs = out.hidden_states
            for l in layers:
                lay[int(l)] = self._pool_head(hs[l], attention_mask, use_head)
        return EncoderOutput(emb, lay, last.float() if return_token_states else None)

    @torch.no_grad()
    def encode(
        self,
        texts: Sequence[str],
        batch_size: int = 128,
        max_seq_length: int | None = None,
        use_head: bool | None = None,
        train_mode: bool = False,
    ) -> np.ndarray:
        """Embed sentences without gradient: ``(N, D)`` float32 numpy, un-normalised.

        ``use_head`` None: :attr:`inference_head` (the head only when it is kept at test time).

        Sentences are processed sorted by length (less padding) and returned in input order.
        Dropout is off unless ``train_mode``; the caller's train/eval mode is restored.
        """
        use_head = self.inference_head if use_head is None else use_head
        was_training = self.training
        self.train(train_mode)
        try:
            order = np.argsort([-len(t) for t in texts], kind="stable")
            out = np.zeros((len(texts), self.hidden_size), dtype=np.float32)
            for i in range(0, len(texts), batch_size):
                idx = order[i : i + batch_size]
                b = self.tokenize([texts[j] for j in idx], max_seq_length)
                out[idx] = self(**b, use_head=use_head).embedding.float().cpu().numpy()
            return out
        finally:
            self.train(was_training)

    def encode_tensor(self, texts: Sequence[str], use_head: bool = True) -> torch.Tensor:
        """Embed sentences without gradient and without dropout: ``(N, D)`` float32 tensor on the model device."""
        was_training = self.training
        self.eval()
        try:
            with torch.no_grad():
                return self(**self.tokenize(texts), use_head=use_head).embedding.float()
        finally:
            self.train(was_training)

    # ---- saving ------------------------------------------------------------------------
    def save_sentence_transformer(
        self, out_dir: str | os.PathLike, normalize: bool = True, with_head: bool = False
    ) -> Path:
        """Save the encoder as a sentence-transformers directory; the MLP head only ``with_head`` (as a
        ``2_Dense`` module, when it is kept at test time).

        Writes the Hugging Face model/tokenizer files, ``modules.json``, ``1_Pooling/config.json``,
        ``sentence_bert_config.json`` (``max_seq_length`` = :attr:`serve_max_seq_length`) and, when
        ``normalize``, a ``Normalize`` module, so ``SentenceTransformer(out_dir)`` loads it and
        ``training.export.export_artifact`` reads the pooling from it. The source model's sentence-transformers
        ``prompts`` (and default) are kept.
        """
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        self.model.save_pretrained(d)
        structure = Path(self.source) / "sparse_structure.json"
        if structure.is_file():  # pruned shapes travel with the weights (training/sparse)
            (d / structure.name).write_bytes(structure.read_bytes())
        self.tokenizer.save_pretrained(d)
        if with_head:
            if self.head is None:
                raise ValueError("with_head=True but the encoder has no MLP head")
            self.head.save_st_dense(d / "2_Dense")
        prompts, default_prompt = read_st_prompts(self.source)  # the source's prompts stay the model's
        write_st_config(
            d,
            hidden=self.hidden_size,
            pooling=self.pooling,
            max_seq_length=self.serve_max_seq_length,
            dense_dir="2_Dense" if with_head else None,
            normalize=normalize,
            prompts=prompts,
            default_prompt_name=default_prompt,
        )
        return d
