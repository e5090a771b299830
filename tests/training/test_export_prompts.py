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


def test_a_trained_models_prompts_reach_its_exported_manifest(tmp_path):
    """The whole path, for real, on a tiny encoder (1 layer, 32 wide: its export takes a second, the default
    model's ~15 s): a source with sentence-transformers prompts → :class:`training.encoder.SentenceEncoder` saved as
    a training run saves its best model (the prompts kept) → ``export_artifact`` → the manifest."""
    from transformers import AutoTokenizer, BertConfig, BertModel

    from training.encoder import SentenceEncoder
    from training.st_dir import default_model_dir, write_st_config

    src = tmp_path / "src"
    tok = AutoTokenizer.from_pretrained(str(default_model_dir()))
    cfg = BertConfig(vocab_size=tok.vocab_size, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                     intermediate_size=64, max_position_embeddings=64)  # fmt: skip
    BertModel(cfg).save_pretrained(src)
    tok.save_pretrained(src)
    write_st_config(src, hidden=32, pooling="mean", max_seq_length=64, prompts=PROMPTS, default_prompt_name="query")
    trained = SentenceEncoder(str(src), max_seq_length=64).save_sentence_transformer(tmp_path / "best")
    assert st_prompts(trained) == (PROMPTS, "query")
    export_artifact_module.export_artifact(trained, tmp_path / "art", name="tiny", evaluate="none")
    m = validate_artifact(tmp_path / "art")
    assert (m.prompts, m.default_prompt_name) == (PROMPTS, "query")
