"""Fairness of batch formation (service.inference.fair_queue), on the real ONNX artifact and real STS-B sentences.

A small request that arrives while a big one is being embedded is answered before the big one finishes (the
batcher used to run every batch already formed from a window first); no request starves; every input is placed
exactly once within the batch limits. Assertions are on order and composition, never on time.
"""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from service.inference.batcher import Batcher
from service.inference.fair_queue import FairQueue, Job
from service.inference.onnx_encoder import OnnxModel
from service.metrics import Metrics
from training.data.sts import load_task

pytestmark = pytest.mark.timeout(300)


@pytest.fixture(scope="module")
def model(default_artifact: Path) -> OnnxModel:
    m = OnnxModel(default_artifact, providers=["CPUExecutionProvider"], intra_op_threads=1, inter_op_threads=1)
    m.warm_up(batch_size=2)
    return m


@pytest.fixture(scope="module")
def sentences() -> list[str]:
    s = load_task("STSBenchmark")
    return list(dict.fromkeys(s.sent1 + s.sent2))


@pytest.fixture(scope="module")
def long_texts(sentences) -> list[str]:
    """Real text of the model's maximum length (truncated): 40 consecutive STS-B sentences each."""
    return [" ".join(sentences[i : i + 40]) for i in range(0, 40 * 40, 40)]


def _job(model: OnnxModel, texts: list[str]) -> Job:
    return Job(model.tokenize(texts), None, None, remaining=len(texts))


def test_small_request_is_answered_before_a_big_one_finishes(model, sentences, long_texts):
    """Big: 40 inputs of ~256 tokens in batches of 4 (10 batches). A one-sentence request submitted once the big
    one's first batch runs completes first, and both get the embeddings a single batch would give."""
    assert all(n == model.info.max_seq_length for n in model.tokenize(long_texts).lengths)

    async def go() -> list[str]:
        b = Batcher(model, Metrics(), max_batch_tokens=4096, max_batch_size=4, max_queue_size=8)
        b.start()
        done: list[str] = []
        try:
            big = asyncio.ensure_future(b.submit(long_texts))
            big.add_done_callback(lambda _: done.append("big"))
            while not b._running:  # the big request's first batch is running
                await asyncio.sleep(0.005)
            small = asyncio.ensure_future(b.submit(sentences[:1]))
            small.add_done_callback(lambda _: done.append("small"))
            r_big, r_small = await asyncio.gather(big, small)
        finally:
            await b.close()
        np.testing.assert_allclose(r_big.pooled, model.run(*model.pad(model.tokenize(long_texts).ids)), atol=1e-4)
        np.testing.assert_allclose(r_small.pooled, model.run(*model.pad(model.tokenize(sentences[:1]).ids)), atol=1e-4)
        return done

    assert asyncio.run(go()) == ["small", "big"]


def test_turns_rotate_and_inputs_are_placed_once_within_limits(model, sentences, long_texts):
    """Two big requests and a small one, queued in that order: the small one goes first (it fits in one batch: the
    priority lane), then the big ones in turn, the second in the third batch at the latest (one turn per request
    ahead of it, not all the first one's batches); every input is placed once."""
    q = FairQueue(max_batch_size=4, max_batch_tokens=1024, overhead=16)
    a, b, small = _job(model, long_texts[:20]), _job(model, long_texts[20:]), _job(model, sentences[5:6])
    for j in (a, b, small):
        q.add(j)
    batches = []
    while batch := q.next_batch():
        batches.append(batch)
    owners = [{id(j) for j, _ in batch} for batch in batches]
    assert len(batches) >= 10 and id(small) in owners[0]
    assert id(a) in owners[0] | owners[1]
    assert id(b) in owners[0] | owners[1] | owners[2]  # b does not wait for all of a's batches
    placed = sorted((id(j), i) for batch in batches for j, i in batch)
    assert placed == sorted((id(j), i) for j in (a, b, small) for i in range(j.n))
    for batch in batches:
        lens = [len(j.tokens.ids[i]) for j, i in batch]
        assert len(batch) <= 4 and (len(batch) * max(lens) <= 1024 or len(batch) == 1)


def test_a_stream_of_small_requests_does_not_starve_a_big_one(model, sentences, long_texts):
    """A new one-sentence request arrives after every batch (each one in the priority lane); the big request still
    advances every other turn."""
    q = FairQueue(max_batch_size=4, max_batch_tokens=4096, overhead=16)
    big = _job(model, long_texts[:16])  # 4 batches on its own
    q.add(big)
    formed = 0
    while big.live:
        assert q.next_batch()
        formed += 1
        q.add(_job(model, sentences[formed : formed + 1]))
        assert formed <= 2 * 4 + 1, "the big request is starved"
    assert big.unplaced == 0


def test_cancelled_request_is_skipped(model, sentences, long_texts):
    q = FairQueue(max_batch_size=4, max_batch_tokens=4096, overhead=16)
    big, small = _job(model, long_texts[:16]), _job(model, sentences[:3])
    q.add(big)
    assert {id(j) for j, _ in q.next_batch()} == {id(big)}
    q.add(small)
    big.failed = True  # the client went away
    rest = []
    while batch := q.next_batch():
        rest.extend(batch)
    assert sorted(i for _, i in rest) == [0, 1, 2] and {id(j) for j, _ in rest} == {id(small)}


def _padded_cost_reference(lengths: np.ndarray, max_batch_size: int, max_batch_tokens: int, overhead: int) -> float:
    """The exhaustive dynamic programme over every cut position of the sorted ``lengths``: the least
    ``sum(padded tokens) + overhead x n_batches`` within the limits (a single input may exceed the token limit)."""
    n = len(lengths)
    best = np.zeros(n + 1)
    for end in range(1, n + 1):
        best[end] = min(
            best[s] + (end - s) * lengths[end - 1] + overhead
            for s in range(max(0, end - max_batch_size), end)
            if (end - s) * lengths[end - 1] <= max_batch_tokens or end - s == 1
        )
    return float(best[n])


def test_cut_window_is_optimal_and_within_limits():
    """The cut over the few candidate points costs what the exhaustive programme over every position does, on
    random windows and on real STS-B lengths at GPU-sized limits."""
    from service.inference.fair_queue import cut_window
    from service.inference.onnx_encoder import Tokenized

    rng = np.random.default_rng(0)
    s = load_task("STSBenchmark")
    stsb = np.array([len(t.split()) + 2 for t in dict.fromkeys(s.sent1)])  # word counts: real length spreads
    cases = [
        (rng.integers(1, rng.integers(2, 60), rng.integers(1, 80)), int(rng.integers(1, 20)),
         int(rng.integers(1, 400)), int(rng.integers(0, 40)))
        for _ in range(400)
    ] + [(rng.choice(stsb, 1024), 256, 16384, 16), (rng.choice(stsb, 256), 16, 2048, 16), (np.full(300, 128), 64, 8192, 0)]  # fmt: skip
    for lengths, max_batch_size, max_batch_tokens, overhead in cases:
        job = Job(Tokenized([np.zeros(int(n), dtype=np.int64) for n in lengths]), None, None, remaining=len(lengths))
        batches = cut_window([(job, i) for i in range(len(lengths))], max_batch_size=max_batch_size,
                             max_batch_tokens=max_batch_tokens, overhead=overhead)  # fmt: skip
        assert sorted(i for b in batches for _, i in b) == list(range(len(lengths)))
        cost = 0
        for b in batches:
            size, longest = len(b), max(int(lengths[i]) for _, i in b)
            assert size <= max_batch_size and (size * longest <= max_batch_tokens or size == 1)
            cost += size * longest + overhead
        assert cost == _padded_cost_reference(np.sort(lengths), max_batch_size, max_batch_tokens, overhead)


class _GatedModel:
    """``model`` whose ``tokenize`` records each call's first text and thread, and (while ``gate`` is set) makes the
    calls meet at ``barrier`` (several chunks running at once) or wait for ``release``."""

    def __init__(self, model: OnnxModel, barrier=None, release=None) -> None:
        self._model, self.barrier, self.release = model, barrier, release
        self.calls: list[tuple[str, str]] = []
        self.info, self.char_budget = model.info, model.char_budget

    def tokenize(self, texts, truncate=True, direction="right"):
        import threading

        self.calls.append((texts[0], threading.current_thread().name))
        if self.barrier is not None:
            self.barrier.wait()
        if self.release is not None:
            assert self.release.wait(60)
        return self._model.tokenize(texts, truncate=truncate, direction=direction)


async def _until(cond, what: str) -> None:
    """Poll ``cond()`` until true; fail naming ``what`` after ~20 s (a guard against hanging, not a timing check)."""
    for _ in range(20_000):
        if cond():
            return
        await asyncio.sleep(0.001)
    raise AssertionError(f"never happened: {what}")


def test_a_lone_request_is_tokenized_on_every_idle_thread(model, sentences):
    """A request of ~15 chunks alone with 2 tokenizer threads: its first two chunks run at the same time (they meet
    at a barrier: one chunk at a time would leave the first waiting until the barrier breaks), on two threads, and
    the ids are those of one tokenize call over all the texts."""
    import threading

    texts = sentences[:1500]
    gated = _GatedModel(model, barrier=threading.Barrier(2, timeout=10))

    async def go():
        b = Batcher(gated, Metrics(), max_batch_tokens=4096, max_batch_size=16, max_queue_size=8, tokenizer_threads=2)
        try:
            first = asyncio.ensure_future(b._tokenize_fairly(texts, True))
            await _until(lambda: len(gated.calls) >= 2 or first.done(), "two chunks started")
            gated.barrier = None  # the first two met: the rest run freely
            return await first
        finally:
            await b.close(0)

    got = asyncio.run(go())
    assert len(gated.calls) >= 10 and len({t for _, t in gated.calls[:2]}) == 2
    assert all(np.array_equal(g, w) for g, w in zip(got.ids, model.tokenize(texts).ids, strict=True))


def test_a_newcomer_takes_the_next_free_tokenizer_thread(model, sentences):
    """A big request holds both tokenizer threads; a one-sentence request arriving meanwhile gets the next thread that
    frees (it has no chunk running), before the big request's third chunk; then the big one finishes."""
    import threading

    release = threading.Event()
    gated = _GatedModel(model, release=release)
    big, small = sentences[:1500], [sentences[2000]]

    async def go():
        b = Batcher(gated, Metrics(), max_batch_tokens=4096, max_batch_size=16, max_queue_size=8, tokenizer_threads=2)
        try:
            t_big = asyncio.ensure_future(b._tokenize_fairly(big, True))
            await _until(lambda: len(gated.calls) >= 2, "both threads hold one of the big request's chunks")
            t_small = asyncio.ensure_future(b._tokenize_fairly(small, True))
            await _until(lambda: b._tok_pool.waiting >= 2, "the small request waits for a thread, as the big one")
            gated.release = None
            release.set()
            return await asyncio.gather(t_big, t_small)
        finally:
            release.set()
            await b.close(0)

    r_big, r_small = asyncio.run(go())
    firsts = [t for t, _ in gated.calls]
    assert firsts.index(small[0]) == 2, "the newcomer waited for more than the chunks already running"
    assert all(np.array_equal(g, w) for g, w in zip(r_big.ids, model.tokenize(big).ids, strict=True))
    assert np.array_equal(r_small.ids[0], model.tokenize(small).ids[0])
