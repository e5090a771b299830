"""WiSE-FT: weight-space interpolation of a fine-tuned model with the model it started from (Wortsman et al., "Robust
fine-tuning of zero-shot models", CVPR 2022, arXiv:2109.01903, Eq. 1: ``theta_alpha = (1 - alpha) * theta_0 +
alpha * theta_1``), the mixing weight chosen on dev.

:func:`interpolate_dirs` writes ``theta_alpha`` of two checkpoints of the same architecture: every weight file of
the fine-tuned directory (``model.safetensors`` or ``pytorch_model.bin``, at the root and in module folders such as a
sentence-transformers ``2_Dense/``) is paired with the start directory's weight file of the same folder; both must
hold the same tensor names and shapes (else :class:`InterpolationError`); floating tensors are mixed, any other
(integer buffers: ``position_ids``) must be equal and is copied. The other files (configs, tokenizer, modules) are
the fine-tuned directory's, so the result loads as it does.

:func:`grid` mixes and scores each alpha of a grid (resumable); :func:`choose` scores a grid of alpha on the
in-domain dev split (nDCG@10 of SciFact's dev claims, carved from the train qrels as
:class:`training.retrieval.RetrievalTask` carves them, searched over the whole corpus) and on STS-B dev (Spearman
x100, the general-quality check), and chooses the alpha of the best in-domain dev score among those whose STS-B dev
is at most ``sts_tolerance`` below the start's (alpha 0); the paper chooses alpha on held-out data too.
"""

from __future__ import annotations

import json
import shutil
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from artifact_contract.fsio import atomic_write_json

WEIGHT_FILES = ("model.safetensors", "pytorch_model.bin")


class InterpolationError(ValueError):
    """The two checkpoints cannot be mixed: different weight files, tensor names or shapes; the message says which."""


def _weight_files(d: Path) -> dict[str, Path]:
    """``{folder relative to d: weight file}`` of every weight file under ``d``."""
    out: dict[str, Path] = {}
    for name in WEIGHT_FILES:
        for f in sorted(d.rglob(name)):
            out.setdefault(str(f.parent.relative_to(d)), f)
    return out


def _load(f: Path) -> dict:
    import torch
    from safetensors.torch import load_file

    return (
        load_file(str(f)) if f.suffix == ".safetensors" else torch.load(str(f), map_location="cpu", weights_only=True)
    )


def interpolate_state(start: dict, finetuned: dict, alpha: float) -> dict:
    """``(1 - alpha) * start + alpha * finetuned`` of each floating tensor (computed in float32 or wider, cast back
    to the fine-tuned tensor's dtype); a non-floating tensor must be equal in both and is copied. A non-floating
    buffer only the start holds (``embeddings.position_ids``, which older transformers versions saved and newer ones
    do not) is left out, as the fine-tuned checkpoint leaves it out.

    Raises:
        InterpolationError: different tensor names, shapes, or unequal non-floating tensors. ValueError: alpha
            outside [0, 1].
    """
    import torch

    if not 0.0 <= alpha <= 1.0:
        raise ValueError(f"alpha must be in [0, 1], got {alpha}")
    only_s, only_f = sorted(set(start) - set(finetuned)), sorted(set(finetuned) - set(start))
    if any(start[k].is_floating_point() for k in only_s) or only_f:
        raise InterpolationError(f"different tensors: only in start {only_s[:5]}, only in fine-tuned {only_f[:5]}")
    out = {}
    for k, b in finetuned.items():
        a = start[k]
        if a.shape != b.shape:
            raise InterpolationError(f"tensor {k!r}: shape {tuple(a.shape)} in start, {tuple(b.shape)} in fine-tuned")
        if not b.is_floating_point():
            if not torch.equal(a, b):
                raise InterpolationError(f"tensor {k!r}: a non-floating tensor differs between the checkpoints")
            out[k] = b.clone()
            continue
        wide = torch.promote_types(b.dtype, torch.float32)
        out[k] = ((1.0 - alpha) * a.to(wide) + alpha * b.to(wide)).to(b.dtype).contiguous()
    return out


def interpolate_dirs(start: str | Path, finetuned: str | Path, alpha: float, out: str | Path) -> dict[str, Any]:
    """Write WiSE-FT's ``theta_alpha`` of the two model directories to ``out`` (module docstring); returns
    ``{"alpha", "start", "finetuned", "tensors"}`` (also written to ``out/wise_ft.json``).

    Raises:
        InterpolationError: the checkpoints differ in weight files, tensor names or shapes. FileNotFoundError: no
            weight file in ``finetuned``. ValueError: alpha outside [0, 1].
    """
    import torch
    from safetensors.torch import save_file

    start, finetuned, out = Path(start), Path(finetuned), Path(out)
    fw, sw = _weight_files(finetuned), _weight_files(start)
    if not fw:
        raise FileNotFoundError(f"{finetuned}: no weight file ({', '.join(WEIGHT_FILES)})")
    if set(fw) != set(sw):
        raise InterpolationError(f"weight files in folders {sorted(sw)} (start) and {sorted(fw)} (fine-tuned)")
    mixed = {rel: interpolate_state(_load(sw[rel]), _load(f), alpha) for rel, f in fw.items()}
    tmp = Path(tempfile.mkdtemp(prefix=".wise-ft-", dir=out.parent if out.parent.is_dir() else None))
    shutil.copytree(finetuned, tmp, dirs_exist_ok=True, ignore=shutil.ignore_patterns(*WEIGHT_FILES))
    for rel, f in fw.items():
        dest = tmp / rel / f.name
        if f.suffix == ".safetensors":
            save_file(mixed[rel], str(dest), metadata={"format": "pt"})
        else:
            torch.save(mixed[rel], str(dest))
    info = {"alpha": alpha, "start": str(start), "finetuned": str(finetuned), "tensors": sum(map(len, mixed.values()))}
    (tmp / "wise_ft.json").write_text(json.dumps(info, indent=2))
    if out.exists():
        shutil.rmtree(out)
    out.parent.mkdir(parents=True, exist_ok=True)
    tmp.rename(out)
    return info


def grid(
    start: str | Path,
    finetuned: str | Path,
    alphas: Sequence[float],
    score: Callable[[str], dict[str, Any]],
    *,
    settings: Sequence[Any] = (),
    record: str | Path | None = None,
) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    """Mix each alpha of ``alphas`` (alpha 0, the start, always; ascending) into a temporary directory and score it:
    ``(rows, inputs)``, rows ``[{"alpha", **score(model_dir), "seconds"}]`` (``seconds``: mixing and scoring, wall),
    ``inputs`` what identifies them (below).

    ``record``: a JSON file rewritten (atomically) after each alpha as ``{"rows", "inputs"}``; the rows of an earlier
    call found there with the same ``inputs`` (both directories' weight files by size and mtime, and ``settings``:
    whatever else decides the scores) are reused whole, so an interrupted grid resumes. A caller may add keys to the
    file and to its rows; they are kept with the rows.
    """
    inputs = {"weights": {str(d): weights_stamp(Path(d)) for d in (start, finetuned)}, "settings": list(settings)}
    done = recorded_rows(record, inputs)
    rows = []
    with tempfile.TemporaryDirectory(prefix="wise-ft-grid-") as tmp:
        for alpha in sorted({0.0, *alphas}):
            if alpha in done:
                rows.append(done[alpha])
                continue
            t0, d = time.perf_counter(), Path(tmp) / f"alpha-{alpha:g}"
            interpolate_dirs(start, finetuned, alpha, d)
            rows.append({"alpha": alpha, **score(str(d)), "seconds": round(time.perf_counter() - t0, 1)})
            shutil.rmtree(d)
            if record:
                atomic_write_json(record, {"rows": rows, "inputs": inputs})
    return rows, inputs


def choose(
    start: str | Path,
    finetuned: str | Path,
    alphas: Sequence[float],
    *,
    dev_fraction: float = 0.1,
    split_seed: int = 42,
    sts_tolerance: float = 0.5,
    max_seq_length: int = 256,
    max_queries: int | None = None,
    max_corpus: int | None = None,
    sts_limit: int | None = None,
    record: str | Path | None = None,
    directory: str | Path | None = None,
) -> dict[str, Any]:
    """Score each alpha of ``alphas`` (alpha 0, the start, always) on SciFact dev and STS-B dev (:func:`grid`);
    choose (module docstring). Returns ``{"rows": [{"alpha", "scifact-dev-ndcg@10", "stsb-dev", "seconds"}],
    "alpha", "rule", "dev_queries", "inputs"}`` (``inputs``: :func:`grid`'s).

    ``max_queries`` / ``max_corpus`` / ``sts_limit``: slices for a smoke run (not the datasets' numbers).
    ``directory``: the BEIR dataset folder (None: SciFact's). ``record``: :func:`grid`'s resumable record. Each alpha
    takes one encoding of the corpus (about 2.5 min at 256 tokens on a 2-core CPU).
    """
    from training.data.scifact import load_scifact, split_queries
    from training.evaluation import encode_fn_for, evaluate_sts
    from training.retrieval import evaluate_retrieval

    data = load_scifact(max_queries, max_corpus, split_seed, directory=directory)
    dev_q = split_queries(list(data.qrels), dev_fraction, split_seed)[1]

    def score(model: str) -> dict[str, float]:
        retrieval = evaluate_retrieval(encode_fn_for(model, max_seq_length), data, dev_q)["ndcg@10"]
        sts = evaluate_sts(encode_fn_for(model, 128), ["STSBenchmark-dev"], with_mean=False, limit=sts_limit)
        return {"scifact-dev-ndcg@10": retrieval, "stsb-dev": sts["STSBenchmark-dev"]}

    settings = [dev_fraction, split_seed, max_seq_length, max_queries, max_corpus, sts_limit, str(directory)]
    rows, inputs = grid(start, finetuned, alphas, score, settings=settings, record=record)
    alpha, rule = pick(rows, sts_tolerance)
    return {"rows": rows, "alpha": alpha, "rule": rule, "dev_queries": len(dev_q), "inputs": inputs}


def pick(rows: Sequence[dict[str, Any]], sts_tolerance: float = 0.5) -> tuple[float, str]:
    """The chooser's rule (module docstring) over rows ``{"alpha", "scifact-dev-ndcg@10", "stsb-dev"}`` sorted by
    alpha, the first being alpha 0 (the start): ``(chosen alpha, the rule in words)``; ties go to the larger alpha.
    Only the dev columns are read."""
    floor = rows[0]["stsb-dev"] - sts_tolerance
    ok = [r for r in rows if r["stsb-dev"] >= floor]
    best = max(ok, key=lambda r: (r["scifact-dev-ndcg@10"], r["alpha"]))
    return best["alpha"], f"best SciFact dev nDCG@10 with STS-B dev >= start's - {sts_tolerance:g} ({floor:.2f})"


def weights_stamp(d: Path) -> dict[str, list[int]]:
    """``{weight file: [size in bytes, mtime in ns]}`` of a model directory: what identifies it for a resumed grid."""
    return {rel: [f.stat().st_size, f.stat().st_mtime_ns] for rel, f in sorted(_weight_files(d).items())}


def recorded_rows(record: str | Path | None, inputs: dict[str, Any]) -> dict[float, dict[str, Any]]:
    """The rows of :func:`grid`'s ``record`` by alpha, when it exists and was made from the same ``inputs``."""
    if not record or not Path(record).is_file():
        return {}
    try:
        old = json.loads(Path(record).read_text())
    except ValueError:
        return {}
    if old.get("inputs") != json.loads(json.dumps(inputs)):
        return {}
    return {float(r["alpha"]): r for r in old.get("rows", [])}
