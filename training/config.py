"""Training configuration: one pydantic-settings object, every field defaulted.

Precedence (highest first): CLI flags > environment variables > YAML config file > defaults.

* YAML: ``python -m training train --config configs/simcse_3r.yaml`` (nested mappings).
* CLI: dotted keys, ``--lr 5e-5 --three_r.enabled true --losses.simcse.weight 1``
  (``--key=value`` also works; values are parsed as YAML scalars).
* Environment: prefix ``EMBED_TRAIN_``, nested delimiter ``__``:
  ``EMBED_TRAIN_LR=5e-5``, ``EMBED_TRAIN_THREE_R__ENABLED=true``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, TypeVar

import yaml
from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator
from pydantic_settings import BaseSettings, PydanticBaseSettingsSource, SettingsConfigDict

from training.data.sts import REPO_ROOT, default_corpus_file


class LossTerm(BaseModel):
    """One named loss term: ``type`` is a registered objective (``training/objectives/<type>.py``)."""

    model_config = ConfigDict(extra="forbid")
    type: str = "simcse"
    weight: float = 1.0
    params: dict[str, Any] = Field(default_factory=dict)


class ThreeRConfig(BaseModel):
    """3R settings (Redundant Representation Reduction, §3; see ``training/three_r.py``)."""

    model_config = ConfigDict(extra="forbid")
    enabled: bool = False
    variant: Literal["3r", "dynamic_mask", "overall_subtraction", "token_subtraction", "static_identification"] = "3r"
    k: int = Field(6, ge=1, description="pool sentences averaged into h̄ per step")
    pool_size: int = Field(64, ge=1)
    n_top_words: int = Field(300, ge=1)
    pool_max_tokens: int = Field(32, ge=1)
    pool_min_top_fraction: float = Field(0.8, ge=0, le=1)
    pool_file: str | None = Field(None, description="user pool, one sentence a line; overrides the miner")
    pool_mine_max_sentences: int | None = Field(
        None, description="mine the pool from the first N corpus lines (None: all training sentences)"
    )
    c_init: float | Literal["uniform"] = Field(
        0.16,
        description="initial threshold c in embedding units, or 'uniform': c ~ U(0, 1) drawn with the run's seed "
        "(the 3R paper's init, reported to converge to 0.273 on BERT [CLS]). 0.16 suits all-MiniLM-L6-v2 mean "
        "pooling (per-dim batch σ ~0.15-0.28); set it explicitly per config",
    )
    learn_c: bool = True
    c_lr: float = Field(1e-3, gt=0, description="learning rate of c (AdamW, no weight decay, same schedule)")
    c_estimator: Literal["identity", "sigmoid"] = Field(
        "identity",
        description="gradient of the hard mask 1[σ<c] w.r.t. c: 'identity' (plain straight-through, never vanishes) "
        "or 'sigmoid' (sigmoid((c-σ)/surrogate_temperature); zero once c is a few β outside σ's range). "
        "dynamic_mask needs 'sigmoid': under it the identity gradient is exactly zero",
    )
    surrogate_temperature: float = Field(0.02, gt=0, description="β of the sigmoid estimator")
    refresh_every: int = Field(10, ge=1, description="word-embedding refresh interval (word-based variants)")


class DataConfig(BaseModel):
    """Training data. ``mode`` unsup: ``train_file`` text; sup: ``train_file`` SNLI dir or CSV triplets;
    pairs: ``train_file`` of ``sentence<TAB>positive`` lines (e.g. back-translations, MSSE §3.1); retrieval:
    ``train_file`` a BEIR dataset folder (corpus, queries, qrels/train.tsv), query-passage triplets with mined hard
    negatives, model choice by dev nDCG@10, the report on ``eval_split`` (:mod:`training.retrieval`)."""

    model_config = ConfigDict(extra="forbid")
    mode: Literal["unsup", "sup", "pairs", "retrieval"] = "unsup"
    train_file: str = Field(default_factory=default_corpus_file)
    max_train_samples: int | None = None
    # retrieval mode
    dev_fraction: float = Field(0.1, ge=0, lt=1, description="retrieval: train queries held out for model choice")
    split_seed: int = Field(42, description="retrieval: seed of the train/dev split (fixed across a comparison)")
    hard_negatives: Literal["bm25", "dense", "bm25+dense", "none"] = Field(
        "bm25+dense", description="retrieval: who mines the hard negatives (dense: the starting bi-encoder)"
    )
    negatives_depth: int = Field(7, ge=1, description="retrieval: mined negatives kept per query")
    max_queries: int | None = Field(None, ge=2, description="retrieval: a seeded sample of train queries (smoke)")
    max_corpus: int | None = Field(None, ge=1, description="retrieval: a corpus slice (smoke; numbers not BEIR's)")
    eval_split: str = Field("test", description="retrieval: the qrels reported once for the chosen checkpoint")


def expand_path(v: str) -> str:
    """``~`` and ``$VARS`` expanded in a path setting (an empty string stays empty)."""
    return os.path.expandvars(os.path.expanduser(v)) if v else v


class YamlSettings(BaseSettings):
    """Base of the package's settings objects: CLI overrides > ``env_prefix`` environment > YAML file > defaults.

    Subclasses set ``model_config`` (their environment prefix); :func:`load_settings` fills the YAML layer.
    """

    @classmethod
    def settings_customise_sources(
        cls, settings_cls, init_settings, env_settings, dotenv_settings, file_secret_settings
    ):
        """The sources, first wins (pydantic-settings docs, "Customise settings sources"): init arguments (CLI
        overrides), environment, YAML file; ``.env`` files and secrets directories are not read."""
        return (init_settings, env_settings, _YamlSource(settings_cls))


class TrainSettings(YamlSettings):
    """Everything a training run needs; see the module docstring for how to override."""

    model_config = SettingsConfigDict(env_prefix="EMBED_TRAIN_", env_nested_delimiter="__", extra="forbid")

    # model
    model_name_or_path: str = Field(
        "", description="HF/ST directory (~ and $VARS expanded) or a hub id; empty = default encoder"
    )
    pooling: Literal["mean", "cls"] | None = Field(None, description="None: from the ST config, else mean")
    mlp_head: bool | None = Field(None, description="SimCSE MLP head at training time; None: on for cls")
    head_at_inference: bool | None = Field(
        None,
        description="keep the MLP head at test time (evaluation, saved model, exported graph); None: SimCSE's "
        "recipe, kept for supervised runs (data.mode sup), dropped otherwise (cls_before_pooler)",
    )
    max_seq_length: int = Field(32, ge=4)
    dropout: float | None = Field(
        None,
        ge=0.0,
        lt=1.0,
        description="dropout rate of every dropout layer of the encoder during training (SimCSE's augmentation, "
        "its Table 2 sweeps it); None keeps the encoder's own (BERT: 0.1)",
    )
    # objective(s)
    losses: dict[str, LossTerm] = Field(default_factory=lambda: {"simcse": LossTerm()})
    three_r: ThreeRConfig = Field(default_factory=ThreeRConfig)
    data: DataConfig = Field(default_factory=DataConfig)
    # optimisation
    batch_size: int = Field(64, ge=2, description="InfoNCE batch (sentences per step)")
    grad_cache_chunk: int = Field(0, ge=0, description="gradient-caching chunk; 0 = whole batch at once")
    max_steps: int = Field(0, ge=0, description="0: num_epochs over the data")
    num_epochs: float = Field(1.0, gt=0)
    lr: float = Field(3e-5, gt=0)
    weight_decay: float = 0.0
    warmup_ratio: float = Field(0.0, ge=0, le=1)
    warmup_steps: int | None = None
    max_grad_norm: float | None = None
    seed: int = 42
    bf16: bool = Field(True, description="bf16 autocast on CUDA (ignored on CPU)")
    cpu_bf16: bool = Field(
        False,
        description="bf16 autocast on CPU (the training steps; evaluation stays fp32): faster on CPUs with AMX or "
        "AVX-512-BF16 (docs/results.md, 'WiSE-FT')",
    )
    device: str | None = None
    threads: int | None = Field(None, description="torch.set_num_threads on CPU")
    # evaluation / checkpointing
    eval_every: int = Field(125, ge=0, description="STS-B dev every N steps (0: only at the end)")
    eval_max_seq_length: int = Field(128, ge=4, description="truncation for STS evaluation")
    eval_batch_size: int = 128
    final_eval: bool = True
    final_eval_tasks: list[str] | None = Field(None, description="None: the seven test tasks (+ mean)")
    eval_limit: int | None = Field(
        None,
        ge=1,
        description="a fixed random subsample of N pairs per task "
        "(smoke tests, CPU benchmarks); scores are then recorded with an '@N' suffix",
    )
    wise_ft: list[float] = Field(
        [],
        description="retrieval mode: WiSE-FT mixing weights (alpha in [0, 1], 1 = the fine-tuned weights) scored after "
        "training on the dev queries and STS-B dev; the chosen mix (best dev nDCG@10 whose STS-B dev is at most "
        "wise_ft_sts_tolerance below the starting model's) is reported and exported instead of the fine-tuned "
        "checkpoint (training.interpolate); empty: off",
    )
    wise_ft_sts_tolerance: float = Field(0.5, ge=0, description="STS-B dev points (x100) a WiSE-FT mix may lose")
    save_every: int = Field(250, ge=0, description="resumable checkpoint every N steps (0: only at the end)")
    log_every: int = Field(1, ge=1)
    output_dir: str = str(REPO_ROOT / "runs" / "default")
    resume: bool = True
    # export
    export: bool = True
    models_dir: str = str(REPO_ROOT / "models")
    artifact_name: str = "minilm-simcse"
    artifact_version: str = "1"
    export_evaluate: Literal["none", "dev", "all"] = Field(
        "dev", description="export_artifact's own STS evaluation of the ONNX graph (overrides same-named scores)"
    )
    progress: bool = True

    @field_validator("model_name_or_path")
    @classmethod
    def _expand_path(cls, v: str) -> str:
        return expand_path(v)

    @field_validator("wise_ft")
    @classmethod
    def _alphas(cls, v: list[float]) -> list[float]:
        if any(not 0.0 <= a <= 1.0 for a in v):
            raise ValueError(f"wise_ft: mixing weights in [0, 1], got {v}")
        return v

    @model_validator(mode="after")
    def _wise_ft_needs_retrieval(self) -> TrainSettings:
        if self.wise_ft and self.data.mode != "retrieval":
            raise ValueError(
                f"wise_ft is chosen on retrieval dev queries: data.mode must be 'retrieval', not {self.data.mode!r}"
            )
        return self

    def recipe(self) -> dict[str, Any]:
        """The config as a JSON-able dict (the manifest's ``training`` recipe)."""
        return self.model_dump(mode="json")


_YAML_DATA: dict[str, Any] = {}
S = TypeVar("S", bound=YamlSettings)


class _YamlSource(PydanticBaseSettingsSource):
    def get_field_value(self, field, field_name):  # pragma: no cover - unused
        return None, field_name, False

    def __call__(self) -> dict[str, Any]:
        return dict(_YAML_DATA)


def _parse_value(v: str) -> Any:
    return yaml.safe_load(v) if v != "" else ""


def set_dotted(d: dict, key: str, value: Any) -> None:
    """Set ``d["a"]["b"]["c"] = value`` for ``key="a.b.c"`` (dashes read as underscores), creating levels."""
    parts = key.replace("-", "_").split(".")
    for p in parts[:-1]:
        d = d.setdefault(p, {})
    d[parts[-1]] = value


def parse_overrides(args: list[str]) -> dict[str, Any]:
    """``["--lr", "1e-4", "--three_r.enabled=true"]`` → nested dict (values as YAML scalars).

    Raises:
        ValueError: an argument is not ``--key value`` / ``--key=value``.
    """
    out: dict[str, Any] = {}
    i = 0
    while i < len(args):
        a = args[i]
        if not a.startswith("--"):
            raise ValueError(f"unexpected argument {a!r}: use --key value")
        a = a[2:]
        if "=" in a:
            k, v = a.split("=", 1)
            i += 1
        else:
            if i + 1 >= len(args):
                raise ValueError(f"--{a} needs a value")
            k, v = a, args[i + 1]
            i += 2
        set_dotted(out, k, _parse_value(v))
    return out


def parse_assignments(items: list[str]) -> dict[str, Any]:
    """``["max_steps=50", "three_r.enabled=true"]`` → nested dict (values as YAML scalars).

    Raises:
        ValueError: an item is not ``key=value``.
    """
    out: dict[str, Any] = {}
    for it in items:
        k, eq, v = it.partition("=")
        if not eq or not k:
            raise ValueError(f"expected key=value, got {it!r}")
        set_dotted(out, k, _parse_value(v))
    return out


def load_settings(
    config_file: str | Path | None = None,
    overrides: dict[str, Any] | None = None,
    settings_cls: type[S] | None = None,
) -> S:
    """Build ``settings_cls`` (default :class:`TrainSettings`) from a YAML file, environment and overrides (CLI).

    Raises:
        FileNotFoundError: the config file is missing. pydantic.ValidationError: a bad or unknown key.
    """
    global _YAML_DATA
    data: dict[str, Any] = {}
    if config_file:
        data = yaml.safe_load(Path(config_file).read_text(encoding="utf-8")) or {}
        if not isinstance(data, dict):
            raise ValueError(f"{config_file}: top level must be a mapping")
    _YAML_DATA = data
    try:
        return (settings_cls or TrainSettings)(**(overrides or {}))
    finally:
        _YAML_DATA = {}
