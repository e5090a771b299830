"""Publishing a trained encoder: the best checkpoint (``output_dir/best/``, sentence-transformers format) exported
to an ONNX artifact ``models_dir/<artifact_name>/<artifact_version>/`` whose manifest records the training recipe
and scores; a running service picks it up by ``POST /admin/models/<name>/activate`` (or by itself in poll mode)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

from training.config import TrainSettings
from training.st_dir import DEFAULT_BASE_MODEL

#: results keys recorded in the manifest's training recipe beside the config
_RECIPE_RESULTS = ("best_step", "steps", "c_final", "alignment", "uniformity")


def next_version(models_dir: str | Path, name: str) -> str:
    """One more than the largest numeric version directory in ``models_dir/name/`` ("1" when there is none)."""
    d = Path(models_dir) / name
    nums = [int(p.name) for p in d.iterdir() if p.is_dir() and p.name.isdigit()] if d.is_dir() else []
    return str(max(nums, default=0) + 1)


def publish_best(
    cfg: TrainSettings, best_dir: Path, results: dict[str, Any], scores: dict[str, float], inference_head: bool
) -> Path:
    """Export ``best_dir`` to ``cfg.models_dir/cfg.artifact_name/cfg.artifact_version`` and return that directory.

    The manifest's ``training`` is the config plus :data:`_RECIPE_RESULTS` from ``results``, where the weights
    came from, and what runs at inference (``inference_head``: the MLP head is kept in the graph); ``scores`` are
    recorded rounded to 4 decimals (the exporter adds its own ``cfg.export_evaluate`` measurement).

    Raises:
        training.export.ExportError: the export failed its parity check.
    """
    from training.export import export_artifact

    recipe = cfg.recipe()
    recipe.update({k: results[k] for k in _RECIPE_RESULTS if k in results})
    recipe["initialised_from"] = cfg.model_name_or_path or "sentence-tuned all-MiniLM-L6-v2 (no raw BERT weights here)"
    recipe["inference"] = (
        "fine-tuned encoder + pooling + the MLP head (kept at test time, supervised SimCSE); 3R is training-only"
        if inference_head
        else "plain fine-tuned encoder + pooling; 3R and the MLP head are training-only"
    )
    art_dir = Path(cfg.models_dir) / cfg.artifact_name / cfg.artifact_version
    export_artifact(
        str(best_dir),
        str(art_dir),
        name=cfg.artifact_name,
        version=cfg.artifact_version,
        base_model=cfg.model_name_or_path or DEFAULT_BASE_MODEL,
        training=recipe,
        scores={k: round(float(v), 4) for k, v in scores.items()},
        evaluate=cfg.export_evaluate,
    )
    return art_dir
