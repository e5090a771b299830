"""Pretraining settings: one pydantic-settings object, every field defaulted.

Precedence (highest first): dotted CLI flags (``--arch.layers 4``) > ``EMBED_PRETRAIN_*`` environment
variables (nested delimiter ``__``: ``EMBED_PRETRAIN_ARCH__HIDDEN=256``) > YAML file > defaults.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator
from pydantic_settings import SettingsConfigDict

from training.config import YamlSettings, expand_path
from training.data.sts import default_corpus_file


def cache_root() -> Path:
    """Where long runs keep their outputs outside the repository: ``$REDUNDANCY_EMBED_CACHE`` or
    ``~/.cache/redundancy-embed``."""
    return Path(os.environ.get("REDUNDANCY_EMBED_CACHE", Path.home() / ".cache" / "redundancy-embed"))


class ArchConfig(BaseModel):
    """BERT architecture of a model trained from scratch (ignored when ``init_from`` is set)."""

    model_config = ConfigDict(extra="forbid")
    layers: int = Field(4, ge=1)
    hidden: int = Field(256, ge=8)
    heads: int = Field(4, ge=1)
    ffn: int = Field(1024, ge=8, description="intermediate (feed-forward) size")
    max_positions: int = Field(128, ge=8)
    dropout: float = Field(0.1, ge=0, lt=1)


class PretrainSettings(YamlSettings):
    """Everything a pretraining run needs; see the module docstring for how to override."""

    model_config = SettingsConfigDict(env_prefix="EMBED_PRETRAIN_", env_nested_delimiter="__", extra="forbid")

    init_from: str = Field("", description="HF directory (or hub id) to continue from; empty = from scratch")
    arch: ArchConfig = Field(default_factory=ArchConfig)
    tokenizer: Literal["train", "default"] = Field(
        "train", description="train: a new WordPiece vocabulary on the corpus; default: the default encoder's"
    )
    vocab_size: int = Field(16000, ge=128, description="size of a trained WordPiece vocabulary")
    corpus_file: str = Field(default_factory=default_corpus_file)
    max_corpus_sentences: int | None = Field(None, ge=2, description="first N corpus lines (tests, dry runs)")
    heldout_fraction: float = Field(0.01, gt=0, lt=0.5, description="sentences held out for masked-token accuracy")
    heldout_max: int = Field(2000, ge=1, description="cap on held-out sentences scored per evaluation")
    max_seq_length: int = Field(64, ge=8)
    mlm_probability: float = Field(0.15, gt=0, lt=1)
    batch_size: int = Field(128, ge=1, description="sentences per step")
    max_steps: int = Field(3000, ge=1)
    lr: float = Field(5e-4, gt=0)
    weight_decay: float = 0.01
    warmup_ratio: float = Field(0.06, ge=0, le=1)
    max_grad_norm: float | None = 1.0
    seed: int = 42
    bf16: bool = Field(True, description="bf16 autocast on CUDA (ignored on CPU)")
    cpu_bf16: bool = Field(
        False,
        description="bf16 autocast on CPU: about 1.8x faster steps on an Intel Xeon with AMX, 1.3x on an AMD EPYC "
        "with AVX-512-BF16 and no AMX (docs/raw_encoder.md); not measured on CPUs with neither",
    )
    device: str | None = None
    threads: int | None = Field(None, description="torch.set_num_threads on CPU")
    eval_every: int = Field(250, ge=1, description="held-out MLM loss/accuracy every N steps")
    save_every: int = Field(250, ge=1, description="resumable checkpoint every N steps")
    output_dir: str = str(cache_root() / "raw_small")
    progress: bool = True

    @field_validator("init_from", "corpus_file", "output_dir")
    @classmethod
    def _expand_path(cls, v: str) -> str:
        return expand_path(v)

    def recipe(self) -> dict[str, Any]:
        """The config as a JSON-able dict (recorded beside the encoder)."""
        return self.model_dump(mode="json")
