"""The batcher's domain exceptions (``service.http.errors.ERROR_TABLE`` maps each to its HTTP answer): a full
queue (429), an input or a request over its token limit (413), a failed batch (500), a batcher shutting down (503)."""

from __future__ import annotations


class QueueFull(Exception):
    """The batcher already holds ``max_queue_size`` unanswered requests."""


class InputTooLong(Exception):
    """An input has more tokens than ``max_seq_length`` and truncation was off.

    Attributes: ``index`` (position in the request), ``n_tokens`` (a lower bound when ``at_least``: only the
    text's first ``char_budget`` characters were tokenized), ``max_tokens``.
    """

    def __init__(self, index: int, n_tokens: int, max_tokens: int, at_least: bool = False) -> None:
        count = f"at least {n_tokens}" if at_least else str(n_tokens)
        super().__init__(f"input[{index}] has {count} tokens, more than the model's maximum of {max_tokens}")
        self.index, self.n_tokens, self.max_tokens, self.at_least = index, n_tokens, max_tokens, at_least


class RequestTooLarge(Exception):
    """A request's inputs have more tokens in all (after truncation) than ``max_request_tokens``.

    Attributes: ``n_tokens``, ``max_tokens``; ``param`` (the request field) is set by the embedder.
    """

    def __init__(self, n_tokens: int, max_tokens: int) -> None:
        super().__init__(
            f"the inputs have {n_tokens} tokens in all, more than max_request_tokens={max_tokens}; "
            "send them in several requests"
        )
        self.n_tokens, self.max_tokens, self.param = n_tokens, max_tokens, "input"


class BatchFailed(RuntimeError):
    """Inference failed for a batch holding some of this request's inputs."""


class BatcherClosed(RuntimeError):
    """The batcher is shutting down and takes no new work."""
