"""Tokenization in a front process: :class:`FrontTokenizers`.

Behind fronts (``api_workers`` > 1) the core's tokenizer threads bounded a GPU deployment (docs/performance.md,
"Several serving processes on one port": 3.1-3.3 of its 4 threads busy on 128-token texts). A front that knows the
model a request will run tokenizes the texts itself, off its event loop, and sends the ids with the texts
(``service.http.inference.internal``); the core runs them as they are when they were made for the model that runs
the request (``service.inference.embedder.TokenIds``: its ``name:version`` and sha256), else tokenizes the texts.
So correctness never rests on the front: after a hot swap a front's ids for the previous model are ignored until
it learns the new one.

What a front knows is learnt from the core's answers: each ``/internal/embed`` answer names the model that ran it and
its artifact directory (``X-Model``, ``X-Model-Sha256``, ``X-Model-Path``), recorded under the request's ``model``
field (``""``: the active model); the artifact's ``tokenizer.json`` and ``manifest.json`` are then loaded in a thread
(the artifact is read-only and shared with the core), and the next request naming the same model is tokenized
here, with the model's prompt (``service.inference.prompts``) and the same cut (``TextTokenizer``). Requests of more
than :data:`MAX_CHARS` characters go to the core as texts: its tokenizer pool takes requests in turns, so a large one
does not hold up small ones; a front's single tokenizer thread would.
"""

from __future__ import annotations

import asyncio
import logging
import time
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from artifact_contract import Manifest, load_manifest
from service.inference.embedder import TokenIds
from service.inference.prompts import PromptNotFound, prompt_prefix, with_prefix
from service.inference.text_tokenizer import TextTokenizer
from service.metrics import Metrics

log = logging.getLogger("service.front")

#: requests with more characters than this (all texts, prompt excluded) are tokenized by the core
MAX_CHARS = 65_536
#: models whose tokenizer a front keeps (the least recently learnt beyond this are dropped)
MAX_MODELS = 8


@dataclass(frozen=True)
class _Model:
    """A model's tokenizer and manifest, loaded by a front."""

    id: str
    sha256: str
    text: TextTokenizer
    manifest: Manifest


class FrontTokenizers:
    """The tokenizers of the models a front has seen the core run (module docstring).

    Args:
        metrics: the front's metrics (``embed_tokenization_duration_seconds{model}`` per tokenizer call).
    """

    def __init__(self, metrics: Metrics) -> None:
        self.metrics = metrics
        self._named: dict[str, tuple[str, str]] = {}  # request's model field -> (name:version, sha256) that ran it
        self._models: dict[tuple[str, str], _Model] = {}
        self._loading: set[tuple[str, str]] = set()
        self._pool = ThreadPoolExecutor(1, thread_name_prefix="front-tok")

    def close(self) -> None:
        """Stop the tokenizer thread (a call running finishes in the background)."""
        self._pool.shutdown(wait=False, cancel_futures=True)

    def learn(self, requested: str | None, model_id: str, sha256: str, path: str) -> None:
        """Record that the core ran a request naming ``requested`` (None: the active model) with the model
        ``model_id`` / ``sha256`` of the artifact at ``path``; its tokenizer is loaded in the background if new."""
        key = (model_id, sha256)
        self._named[requested or ""] = key
        if key in self._models or key in self._loading or not path:
            return
        self._loading.add(key)
        task = asyncio.get_running_loop().run_in_executor(self._pool, _load, model_id, sha256, path)
        task.add_done_callback(lambda f: self._loaded(key, f))

    def _loaded(self, key: tuple[str, str], f: asyncio.Future) -> None:
        self._loading.discard(key)
        if f.cancelled():
            return
        if (e := f.exception()) is not None:  # the core tokenizes this model's requests, as without a front
            log.warning("front: no tokenizer for %s (%s); the core tokenizes its requests", key[0], e)
            return
        self._models[key] = f.result()
        live = set(self._named.values())
        for old in [k for k in self._models if k not in live][: max(0, len(self._models) - MAX_MODELS)]:
            del self._models[old]

    async def tokens(self, texts: list[str], options: dict[str, Any]) -> TokenIds | None:
        """The token ids of ``texts`` for the model the request names (``options``: ``Embedder.encode``'s keyword
        arguments), as the core would make them; None when this front does not know that model's tokenizer yet,
        the request is over :data:`MAX_CHARS`, or its prompt is not the model's (the core answers that)."""
        m = self._models.get(self._named.get(options.get("model") or "", ("", "")))
        if m is None or sum(map(len, texts)) > MAX_CHARS:
            return None
        try:
            prefix = prompt_prefix(m.manifest, m.id, name=options.get("prompt_name"), role=options.get("prompt_role"))
        except PromptNotFound:
            return None
        truncate, direction = options.get("truncate", True), options.get("truncation_direction", "right")
        prompted = with_prefix(prefix, texts)
        try:
            ids, seconds = await asyncio.get_running_loop().run_in_executor(
                self._pool, _tokenize, m.text, prompted, truncate, direction
            )
        except RuntimeError:  # the pool is shut down (the front is stopping): the core tokenizes
            return None
        except Exception as e:  # an input the tokenizer refuses: the core tokenizes it and answers as alone
            log.warning("front: tokenizing a request for %s failed (%s); the core tokenizes it", m.id, e)
            return None
        self.metrics.tokenization_duration.labels(m.id).observe(seconds)
        return TokenIds(m.id, m.sha256, ids)


def _tokenize(text: TextTokenizer, texts: list[str], truncate: bool, direction: str) -> tuple[list, float]:
    """``text.tokenize(...)``'s ids and the seconds the call took (in the tokenizer thread)."""
    t0 = time.perf_counter()
    ids = text.tokenize(texts, truncate, direction).ids
    return ids, time.perf_counter() - t0


def _load(model_id: str, sha256: str, path: str) -> _Model:
    """The tokenizer and manifest of the artifact at ``path``. Raises ValueError when it is not the model named
    (``model_id``, ``sha256``) or cannot be read (``ArtifactError`` is a ValueError)."""
    manifest = load_manifest(path)
    if f"{manifest.name}:{manifest.version}" != model_id or manifest.sha256 != sha256:
        raise ValueError(f"{path} holds {manifest.name}:{manifest.version}, not the model the core ran")
    return _Model(model_id, sha256, TextTokenizer(Path(path), manifest.max_seq_length), manifest)
