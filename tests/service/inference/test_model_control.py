"""``service.inference.model_control.ModelControl`` in-process: start-up, load/activate/unload rules, listeners, failed loads,
persistence, rescan and the poll watcher, on real artifacts built from the default fp32 one.

Each test runs its own event loop (``asyncio.run``) over a fresh models dir and data dir:

* ``minilm/<v>``: the default encoder re-labelled (``versioned_copy``, 384 dims);
* a sliced version: the same graph followed by a Slice to 256 dims (a genuinely different model, built once);
* broken versions: a corrupt ``model.onnx`` and a manifest claiming the wrong dimension, which must fail to load.
"""

from __future__ import annotations

import asyncio
import json
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from artifact_contract import load_manifest, write_manifest
from service.inference.model_control import ACTIVE_FILE, ModelControl, ModelInUse
from service.inference.model_registry import ModelNotFound, ModelRegistry
from service.inference.onnx_encoder import ModelInfo, ModelLoadError
from service.metrics import Metrics
from service.settings import Settings
from tests.artifact_utils import NAME, corrupt_artifact, sliced_artifact, versioned_copy, wrong_dimension_artifact

pytestmark = pytest.mark.timeout(300)

SENTENCES = ["A man is playing a guitar.", "A woman is slicing an onion.", "Three dogs run across a snowy field."]


@pytest.fixture(scope="module")
def sliced(default_artifact, tmp_path_factory) -> Path:
    """A 256-dim sliced artifact (built once; copied into each test's models dir under the version it needs)."""
    return sliced_artifact(default_artifact, tmp_path_factory.mktemp("sliced"), NAME, "0", 256)


@pytest.fixture
def dirs(tmp_path) -> tuple[Path, Path]:
    return tmp_path / "models", tmp_path / "data"


def control(models: Path, data: Path, **kw) -> ModelControl:
    s = Settings(
        models_dir=str(models),
        data_dir=str(data),
        default_model=NAME,
        providers=["cpu"],
        intra_op_threads=1,
        inter_op_threads=1,
        max_batch_size=4,
        **kw,
    )
    metrics = Metrics()
    return ModelControl(s, ModelRegistry(metrics), metrics)


def run(mc: ModelControl, scenario) -> None:
    """Run ``await scenario()`` on a fresh loop, then stop the watcher and every batcher."""

    async def main() -> None:
        try:
            await scenario()
        finally:
            await mc.close()
            await mc.registry.close()

    asyncio.run(main())


def publish(src: Path, models: Path, version: str) -> Path:
    """Copy ``src`` to a staging dir, then rename it to ``models/minilm/<version>`` (an atomic publish)."""
    stage = versioned_copy(src, models.parent / "stage", NAME, version)
    dst = models / NAME / version
    dst.parent.mkdir(parents=True, exist_ok=True)
    os.rename(stage, dst)
    return dst


def persisted(data: Path) -> dict:
    return json.loads((data / ACTIVE_FILE).read_text())


async def embed(mc: ModelControl) -> np.ndarray:
    return (await mc.registry.active.batcher.submit(SENTENCES)).pooled


def test_startup_loads_the_newest_version_of_the_default(default_artifact, dirs):
    models, data = dirs
    for v in ("2", "9", "10"):
        versioned_copy(default_artifact, models, NAME, v)
    mc = control(models, data)

    async def scenario():
        lm = await mc.startup()
        assert lm.info.id == f"{NAME}:10"  # "10" > "9" > "2": versions compare numerically
        assert mc.registry.active is lm and [m.info.id for m in mc.registry.all()] == [f"{NAME}:10"]
        assert lm.info.dimension == 384 and lm.info.sha256 == load_manifest(default_artifact).sha256
        assert (await embed(mc)).shape == (3, 384)
        assert not (data / ACTIVE_FILE).exists()  # start-up restores a choice, it does not make one
        assert mc._poll_task is None  # explicit mode: no watcher

    run(mc, scenario)


def test_activation_is_persisted_and_restored_by_a_new_control(default_artifact, dirs):
    models, data = dirs
    versioned_copy(default_artifact, models, NAME, "1")
    versioned_copy(default_artifact, models, NAME, "2")
    first = control(models, data)

    async def choose_v1():
        assert (await first.startup()).info.id == f"{NAME}:2"
        lm, prev = await first.activate(NAME, "1")
        assert (lm.info.id, prev.id) == (f"{NAME}:1", f"{NAME}:2")

    run(first, choose_v1)
    state = persisted(data)
    assert (state["name"], state["version"]) == (NAME, "1")
    assert state["sha256"] == load_manifest(default_artifact).sha256
    assert not [p for p in data.iterdir() if p.name != ACTIVE_FILE]  # no temporary file left behind

    second = control(models, data)

    async def restart():
        assert (await second.startup()).info.id == f"{NAME}:1"  # not the newest: the persisted one
        assert second.read_persisted() == (NAME, "1")

    run(second, restart)


@pytest.mark.parametrize("state", ['{"name": "minilm", "version": "7"}', "{not json"])
def test_startup_falls_back_to_the_default_when_the_persisted_model_is_unusable(default_artifact, dirs, state):
    models, data = dirs
    versioned_copy(default_artifact, models, NAME, "3")
    data.mkdir()
    (data / ACTIVE_FILE).write_text(state)
    mc = control(models, data)

    async def scenario():
        assert (await mc.startup()).info.id == f"{NAME}:3"

    run(mc, scenario)


def test_activate_swaps_the_model_and_tells_listeners(default_artifact, sliced, dirs):
    models, data = dirs
    versioned_copy(default_artifact, models, NAME, "1")
    versioned_copy(sliced, models, NAME, "2")
    mc = control(models, data)
    calls: list[tuple[str | None, str]] = []

    async def broken(prev: ModelInfo | None, new: ModelInfo) -> None:
        raise RuntimeError("listener bug")

    async def record(prev: ModelInfo | None, new: ModelInfo) -> None:
        calls.append((prev.id if prev else None, new.id))

    mc.listeners += [broken, record]

    async def scenario():
        assert (await mc.startup()).info.dimension == 256  # v2, the newest, is the sliced model
        assert calls == []  # start-up is no activation
        cut = await embed(mc)
        lm, prev = await mc.activate(NAME, "1")  # the failing listener runs first and breaks nothing
        assert (prev.id, prev.dimension, lm.info.dimension) == (f"{NAME}:2", 256, 384)
        assert calls == [(f"{NAME}:2", f"{NAME}:1")]
        assert mc.registry.active is lm and persisted(data)["version"] == "1"
        full = await embed(mc)
        assert full.shape == (3, 384)
        np.testing.assert_allclose(cut, full[:, :256], atol=1e-4)  # the sliced model is the cut of the full one
        await mc.activate(NAME, "1")  # already active, same sha256: listeners are not told again
        assert calls == [(f"{NAME}:2", f"{NAME}:1")]
        await mc.activate(NAME)  # no version: the newest on disk
        assert mc.registry.active.info.id == f"{NAME}:2"
        assert calls[-1] == (f"{NAME}:1", f"{NAME}:2")

    run(mc, scenario)


def test_load_then_unload_rules(default_artifact, dirs):
    models, data = dirs
    versioned_copy(default_artifact, models, NAME, "1")
    mc = control(models, data)

    async def scenario():
        active = await mc.startup()
        publish(default_artifact, models, "2")
        lm = await mc.load(NAME, "2")
        assert mc.registry.active is active  # loading does not activate
        assert await mc.load(NAME, "2") is lm  # loading again is a no-op
        assert {m.info.id for m in mc.registry.all()} == {f"{NAME}:1", f"{NAME}:2"}
        assert not (data / ACTIVE_FILE).exists()

        with pytest.raises(ModelInUse, match="active model"):
            await mc.unload(NAME, "1")

        def collections() -> set[tuple[str, str]]:
            return {("news", f"{NAME}:2"), ("faq", f"{NAME}:1")}

        def failing() -> set[tuple[str, str]]:
            raise RuntimeError("in-use callback bug")

        mc.in_use += [failing, collections]
        assert mc.users_of(f"{NAME}:2") == {"news"}  # the failing callback is skipped
        with pytest.raises(ModelInUse, match=r"news") as e:
            await mc.unload(NAME, "2")
        assert "faq" not in str(e.value)
        assert lm in mc.registry.all()  # a refused unload leaves it loaded

        mc.in_use.remove(collections)
        assert await mc.unload(NAME) == [f"{NAME}:2"]  # no version: every non-active version of the name
        assert [m.info.id for m in mc.registry.all()] == [f"{NAME}:1"]
        with pytest.raises(ModelNotFound):
            await mc.unload(NAME, "2")
        with pytest.raises(ModelInUse, match="active model"):
            await mc.unload(NAME)  # only the active one is left
        with pytest.raises(ModelNotFound):
            await mc.load(NAME, "5")
        with pytest.raises(ModelNotFound):
            await mc.activate("no-such-model")

    run(mc, scenario)


def test_a_failed_load_keeps_the_active_model(default_artifact, dirs):
    models, data = dirs
    versioned_copy(default_artifact, models, NAME, "1")
    mc = control(models, data)
    told: list[str] = []

    async def record(prev: ModelInfo | None, new: ModelInfo) -> None:
        told.append(new.id)

    mc.listeners.append(record)
    stage = models.parent / "broken"
    corrupt_artifact(default_artifact, stage, NAME, "3")
    wrong_dimension_artifact(default_artifact, stage, NAME, "4", 256)
    mislabelled = versioned_copy(default_artifact, stage, NAME, "5")
    write_manifest(mislabelled, load_manifest(mislabelled).model_copy(update={"version": "6"}))

    async def scenario():
        active = await mc.startup()
        await mc.activate(NAME, "1")  # persists the choice; already active, so no listener is told
        before = persisted(data)
        want = await embed(mc)
        for v in ("3", "4", "5"):
            os.rename(stage / NAME / v, models / NAME / v)
        for v, needle in (("3", "cannot open model.onnx"), ("4", "256"), ("5", "manifest says minilm:6")):
            with pytest.raises(ModelLoadError, match=needle):
                await mc.activate(NAME, v)
            assert mc.registry.active is active
            assert f"{NAME}:{v}" in mc.failures and needle in mc.failures[f"{NAME}:{v}"].error
        assert [m.info.id for m in mc.registry.all()] == [f"{NAME}:1"]  # nothing half-loaded stays
        assert persisted(data) == before and told == []  # a failed activation tells no listener
        np.testing.assert_array_equal(await embed(mc), want)  # the old model still serves
        rows = {r["id"]: r for r in mc.available()}
        assert rows[f"{NAME}:1"]["active"] and rows[f"{NAME}:1"]["load_error"] is None
        assert "cannot open model.onnx" in rows[f"{NAME}:3"]["load_error"] and not rows[f"{NAME}:3"]["loaded"]

    run(mc, scenario)


def test_rescan_lists_new_versions_and_activates_only_when_asked(default_artifact, dirs):
    models, data = dirs
    versioned_copy(default_artifact, models, NAME, "1")
    mc = control(models, data)

    async def scenario():
        await mc.startup()
        res = await mc.rescan()
        assert res == {"available": [f"{NAME}:1"], "new": [], "activated": None, "errors": {}}
        assert mc.last_poll is not None

        publish(default_artifact, models, "2")
        res = await mc.rescan()  # explicit mode: report, do not activate
        assert (res["new"], res["activated"]) == ([f"{NAME}:2"], None)
        assert mc.registry.active.info.id == f"{NAME}:1" and len(mc.registry.all()) == 1

        publish(default_artifact, models, "0")  # older than the active one: never activated
        res = await mc.rescan(activate_new=True)
        assert (res["new"], res["activated"], res["errors"]) == ([f"{NAME}:0"], None, {})
        publish(default_artifact, models, "3")
        res = await mc.rescan(activate_new=True)
        assert (res["new"], res["activated"]) == ([f"{NAME}:3"], f"{NAME}:3")
        assert mc.registry.active.info.id == f"{NAME}:3" and persisted(data)["version"] == "3"
        assert f"{NAME}:0" not in {m.info.id for m in mc.registry.all()}

        bad = corrupt_artifact(default_artifact, models, NAME, "4")
        res = await mc.rescan(activate_new=True)
        assert res["activated"] is None and "cannot open model.onnx" in res["errors"][f"{NAME}:4"]
        first_failure = mc.failures[f"{NAME}:4"]
        res = await mc.rescan(activate_new=True)  # unchanged manifest: not retried
        assert (res["new"], res["errors"]) == ([], {}) and mc.failures[f"{NAME}:4"] is first_failure

        st = (bad / "manifest.json").stat()
        os.utime(bad / "manifest.json", (st.st_atime, st.st_mtime + 10))  # republished: tried again
        res = await mc.rescan(activate_new=True)
        assert res["new"] == [f"{NAME}:4"] and f"{NAME}:4" in res["errors"]

        shutil.rmtree(bad)  # removed: its failure is forgotten
        res = await mc.rescan(activate_new=True)
        assert f"{NAME}:4" not in res["available"] and f"{NAME}:4" not in mc.failures

        corrupt_artifact(default_artifact, models, NAME, "5")
        with pytest.raises(ModelLoadError):
            await mc.activate(NAME, "5")  # refused by hand first: the scan does not try it again
        res = await mc.rescan(activate_new=True)
        assert (res["new"], res["activated"], res["errors"]) == ([f"{NAME}:5"], None, {})
        rows = {r["id"]: (r["loaded"], r["active"]) for r in mc.available()}
        assert rows == {
            f"{NAME}:0": (False, False),
            f"{NAME}:1": (True, False),
            f"{NAME}:2": (False, False),
            f"{NAME}:3": (True, True),
            f"{NAME}:5": (False, False),
        }
        assert mc.registry.active.info.id == f"{NAME}:3"

    run(mc, scenario)


def test_poll_mode_activates_a_newly_published_newer_version(default_artifact, sliced, dirs):
    models, data = dirs
    versioned_copy(default_artifact, models, NAME, "1")
    mc = control(models, data, model_control="poll", model_poll_interval_s=0.05)

    async def until(cond, what: str) -> None:
        for _ in range(1200):  # a bound against hanging, not a speed requirement
            if cond():
                return
            await asyncio.sleep(0.05)
        raise AssertionError(f"never happened: {what}")

    async def scenario():
        await mc.startup()
        assert mc._poll_task is not None and not mc._poll_task.done()
        publish(sliced, models, "2")
        await until(lambda: mc.registry.active.info.id == f"{NAME}:2", "minilm:2 activated")
        assert mc.registry.active.info.dimension == 256 and persisted(data)["version"] == "2"
        assert (await embed(mc)).shape == (3, 256)

        publish(default_artifact, models, "0")  # older: seen, never activated
        stage = corrupt_artifact(default_artifact, models.parent / "stage-bad", NAME, "3")
        os.rename(stage, models / NAME / "3")
        await until(lambda: f"{NAME}:3" in mc.failures, "the corrupt minilm:3 recorded as failed")
        scan = mc.last_poll  # recorded mid-scan: wait for that scan (which also saw minilm:0) to finish
        await until(lambda: mc.last_poll != scan, "the scan that tried minilm:3 finished")
        assert mc.registry.active.info.id == f"{NAME}:2"  # the watcher survived the failure
        assert {m.info.id for m in mc.registry.all()} == {f"{NAME}:1", f"{NAME}:2"}
        assert not mc._poll_task.done()

    run(mc, scenario)
    assert mc._poll_task is None  # close() stopped the watcher
