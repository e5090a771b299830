"""Prompts in the artifact contract (``Manifest.prompts``, ``Manifest.default_prompt_name``) and where the export
takes them from: the source model's ``config_sentence_transformers.json``, as sentence-transformers stores them."""

from __future__ import annotations

import json
import shutil

import pytest

from artifact_contract import ArtifactError, load_manifest, validate_artifact, write_manifest
from training.export import ExportError
from training.export import artifact as export_artifact_module
from training.export.artifact import ST_CONFIG_FILE, st_prompts

pytestmark = pytest.mark.timeout(60)

PROMPTS = {"query": "query: ", "passage": "passage: "}


@pytest.fixture
def artifact_copy(default_artifact, tmp_path):
    """A copy of the default artifact (no prompts in its manifest) to rewrite the manifest of."""
    dst = tmp_path / "art"
    shutil.copytree(default_artifact, dst, ignore=shutil.ignore_patterns(".*"))
    return dst


def _set_manifest_fields(d, **fields) -> None:
    raw = json.loads((d / "manifest.json").read_text())
    raw.update(fields)
    (d / "manifest.json").write_text(json.dumps(raw))


def test_old_manifests_stay_valid_and_are_written_without_prompts(artifact_copy):
    m = validate_artifact(artifact_copy)
    assert (m.prompts, m.default_prompt_name) == (None, None)
    write_manifest(artifact_copy, m)
    raw = json.loads((artifact_copy / "manifest.json").read_text())
    assert "prompts" not in raw and "default_prompt_name" not in raw


def test_manifest_carries_prompts(artifact_copy):
    _set_manifest_fields(artifact_copy, prompts=PROMPTS, default_prompt_name="query")
    m = validate_artifact(artifact_copy)
    assert (m.prompts, m.default_prompt_name) == (PROMPTS, "query")
    write_manifest(artifact_copy, m)  # round trip
    assert load_manifest(artifact_copy).prompts == PROMPTS


@pytest.mark.parametrize(
    ("fields", "why"),
    [
        ({"prompts": PROMPTS, "default_prompt_name": "document"}, "default_prompt_name 'document' is not a key"),
        ({"default_prompt_name": "query"}, "default_prompt_name 'query' is not a key of prompts (prompts: none)"),
        ({"prompts": {"query": 1}}, "prompts.query"),
        ({"prompts": {"": "x: "}}, "prompts"),
        ({"prompts": ["query: "]}, "prompts"),
    ],
)
def test_manifest_validation_rejects_bad_prompts(artifact_copy, fields, why):
    _set_manifest_fields(artifact_copy, **fields)
    with pytest.raises(ArtifactError, match="invalid manifest") as e:
        load_manifest(artifact_copy)
    assert why in str(e.value)


def test_a_reranker_takes_no_prompts(default_artifact):
    m = load_manifest(default_artifact)
    raw = {**m.model_dump(), "task": "reranker", "dimension": 1, "normalize": False, "canary": None, "parity": None}
    type(m).model_validate(raw)  # a valid reranker manifest without prompts
    with pytest.raises(ValueError, match="a reranker takes no prompts"):
        type(m).model_validate({**raw, "prompts": PROMPTS})


def _st_dir(tmp_path, cfg):
    d = tmp_path / "st"
    d.mkdir(exist_ok=True)
    if cfg is not None:
        (d / ST_CONFIG_FILE).write_text(cfg if isinstance(cfg, str) else json.dumps(cfg))
    return d


def test_st_prompts_reads_sentence_transformers_config(tmp_path):
    assert st_prompts(_st_dir(tmp_path, None)) == (None, None)
    assert st_prompts(_st_dir(tmp_path, {"prompts": {}, "default_prompt_name": None})) == (None, None)
    cfg = {"__version__": {"sentence_transformers": "3.0.0"}, "prompts": PROMPTS, "default_prompt_name": "query"}
    assert st_prompts(_st_dir(tmp_path, cfg)) == (PROMPTS, "query")
    for bad in ({"prompts": PROMPTS, "default_prompt_name": "doc"}, {"prompts": {"q": 3}}, "{not json"):
        with pytest.raises(ExportError):
            st_prompts(_st_dir(tmp_path, bad))


def test_export_artifact_puts_the_source_prompts_in_the_manifest_spec(tmp_path, monkeypatch):
    """``export_artifact`` hands the source directory's prompts to the manifest (the graph export itself stubbed:
    it is the same with or without prompts, and takes ~15 s)."""
    seen = {}
    monkeypatch.setattr(export_artifact_module, "load_pooled_encoder", lambda d, p, n: (None, None, "mean", 128, False))
    monkeypatch.setattr(
        export_artifact_module, "export_module", lambda m, t, out, spec, **kw: seen.setdefault("s", spec)
    )
    src = _st_dir(tmp_path, {"prompts": PROMPTS, "default_prompt_name": "passage"})
    export_artifact_module.export_artifact(src, tmp_path / "out", name="p", evaluate="none")
    assert (seen["s"].prompts, seen["s"].default_prompt_name) == (PROMPTS, "passage")
