"""A front's own models (``service.front.local_models``) follow the core's published registry
(``service.front.published``): written by the core's real ``ModelRegistry``, read by ``LocalModels`` in one process
(no server): a published model is loaded and run, one the core drops is closed, a model that cannot be loaded leaves
the request to the core and is not tried again per request."""

from __future__ import annotations

import asyncio
import json

import numpy as np

from service.front.local_models import LocalModels
from service.front.published import MODELS_FILE, publish, read
from service.inference.embedder import Embedder
from service.inference.model_registry import ModelRegistry, load_model
from service.metrics import Metrics
from service.settings import Settings


async def _until(cond, seconds: float = 60.0) -> None:
    deadline = asyncio.get_running_loop().time() + seconds
    while not cond():
        assert asyncio.get_running_loop().time() < deadline
        await asyncio.sleep(0.05)


def test_a_front_follows_the_cores_registry(default_artifact, tmp_path):
    settings = Settings(models_dir=str(default_artifact.parent), intra_op_threads=1)
    path = tmp_path / MODELS_FILE

    async def go() -> None:
        core = ModelRegistry(Metrics())
        core.listeners.append(lambda r: publish(path, r))
        core.add(await load_model(settings, Metrics(), default_artifact.name), activate=True)
        model_id = core.active.info.id
        assert read(path).resolve(None).id == model_id and read(path).resolve("nope") is None
        local = LocalModels(settings, Metrics(), path)
        try:
            assert local.get(None) is None  # not loaded yet: the core runs the request
            await _until(lambda: local.get(None) is not None)
            lm = local.get(None)
            assert lm.info.sha256 == core.active.info.sha256 and local.get(model_id) is lm
            texts = ["A man is playing a guitar.", "A woman slices an onion."]
            here = (await Embedder(None).encode(texts, model=lm)).embeddings  # type: ignore[arg-type]
            there = (await Embedder(core).encode(texts)).embeddings
            np.testing.assert_allclose(here, there, atol=1e-6)
            await core.close()  # the core drops every model: the front closes its copy
            assert local.get(None) is None and read(path).models == ()
            await _until(lambda: lm.batcher._closed)
        finally:
            await local.close()

    asyncio.run(go())


def test_a_model_that_cannot_load_is_left_to_the_core(tmp_path, caplog):
    path = tmp_path / MODELS_FILE
    bogus = {"id": "m:1", "name": "m", "version": "1", "sha256": "0" * 64, "path": str(tmp_path / "gone")}
    bogus["reranker"] = False
    path.write_text(json.dumps({"active": "m:1", "models": [bogus]}))

    async def go() -> None:
        local = LocalModels(Settings(models_dir=str(tmp_path)), Metrics(), path)
        try:
            assert local.get(None) is None
            await _until(lambda: "cannot run m:1 here" in caplog.text)
            for _ in range(20):  # later requests, and the file replaced meanwhile, neither load it again nor fail
                assert local.get(None) is None and local.get("m") is None
                tmp = tmp_path / "next.json"
                tmp.write_text(path.read_text())
                tmp.replace(path)
            await asyncio.sleep(0.1)
            assert caplog.text.count("cannot run m:1 here") == 1
        finally:
            await local.close()

    asyncio.run(go())
