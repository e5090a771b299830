"""The Milvus connection of the milvus backend: every call bounded in time, outages detected once and answered fast.

* :class:`BoundedClient` wraps pymilvus's ``MilvusClient`` and gives every RPC ``timeout=`` whole seconds
  (``collections_milvus_write_timeout_s`` rounded up): pymilvus's retry loop honours only an ``int`` timeout
  (``pymilvus.decorators.retry_on_rpc_failure``); with a float or none it retries an unreachable server 75 times with
  back-off, about 3.5 minutes, which is how a Milvus outage used to hang requests and shutdown.
* :func:`classify` sorts pymilvus's exceptions into *unavailable* (connection refused, deadline exceeded, retries run
  out: Milvus cannot be reached), *not ready* and *not loaded* (Milvus answered with a status code of
  :data:`RETRY_LATER`: it is starting, stopping, rebalancing, throttling, or loading a collection's segments, e.g. for
  ~20 s after a restart) and the rest (a genuine error of the request or of this service). The backend answers the
  first three 503 ``backend_unavailable`` with ``Retry-After``; only *unavailable* opens the :class:`Breaker` (a
  Milvus that answers "channel not available" is reachable: its next answer may be a good one).
* :class:`Breaker`: once a call found Milvus unavailable — its own error says so, or it was slow (past
  :data:`SUSPECT_S`) and a fresh connection got no answer either — every call fails at once (503
  ``backend_unavailable`` with ``Retry-After``), the ones already waiting included, until a probe on a *fresh*
  connection succeeds. A slow answer alone never opens it: a busy Milvus is not a dead one.
* While the breaker is open the service keeps no connection to Milvus (:meth:`BoundedClient.release`): a gRPC
  channel left open keeps its *subchannel* in gRPC's global subchannel pool, which every new channel to the same
  address with the same options (pymilvus fixes them) shares, reconnect back-off included (1.6x from 1 s, up to
  120 s). With the old connection open across a 150 s outage, a fresh connection reached the restarted Milvus 10-12 s
  after another process did (up to 2 minutes after a longer outage); with it closed, in 0.2 s
  (``bench/milvus_reconnect.py``).
"""

from __future__ import annotations

import base64
import math
import threading
import time
from collections.abc import Callable
from typing import Any
from urllib.parse import urlparse

import grpc
from pymilvus import MilvusClient, MilvusException
from pymilvus.grpc_gen import milvus_pb2, milvus_pb2_grpc

from service.collections.errors import BackendUnavailable

#: MilvusClient methods that run locally (no RPC, no timeout argument)
_LOCAL = frozenset({"prepare_index_params", "create_schema", "close"})

#: Milvus status codes that mean "not ready / not available now, retry": the request is fine and Milvus answered, but
#: cannot serve it yet. ``code -> (kind, Milvus's name)``; kind ``not_loaded`` also asks Milvus to load the collections
#: again, ``not_ready`` only answers 503. The codes are Milvus's ``merr`` codes (``pkg/util/merr/errors.go``, Milvus
#: 2.3+), which pymilvus 2.4 raises as ``MilvusException.code`` (``check_status``: ``status.code``). Every one of them
#: but 12 and 106 (Milvus 2.4+) is in the 2.3.5 server this project runs; Milvus marks most of them retriable itself.
RETRY_LATER: dict[int, tuple[str, str]] = {
    1: ("not_ready", "service not ready"),  # a component starting or stopping ("... Abnormal": Milvus is quitting)
    2: ("not_ready", "service unavailable"),
    4: ("not_ready", "request limit exceeded"),
    8: ("not_ready", "rate limit exceeded"),  # pymilvus retries it until the call's timeout, then raises it
    11: ("not_ready", "time tick long delay"),  # writes held back while Milvus's time tick lags
    12: ("not_ready", "service resource insufficient"),
    101: ("not_loaded", "collection not loaded"),
    103: ("not_loaded", "collection not fully loaded"),
    106: ("not_loaded", "collection on recovering"),
    201: ("not_loaded", "partition not loaded"),
    202: ("not_loaded", "partition not fully loaded"),
    401: ("not_ready", "replica not available"),
    501: ("not_ready", "channel lacks"),
    503: ("not_ready", "channel not available"),  # e.g. the query path of a Milvus resumed after a SIGSTOP, quitting
    601: ("not_ready", "segment not loaded"),
    602: ("not_ready", "segment lacks"),
    902: ("not_ready", "node offline"),
    903: ("not_ready", "node lacks"),
    904: ("not_ready", "node not match"),  # a restarted node before the dead one's session expired
    905: ("not_ready", "node not available"),
}
#: the same conditions in Milvus's legacy ``commonpb.ErrorCode`` (``MilvusException.compatible_code``), read only when a
#: status carries no ``merr`` code (``code`` 0): older paths of Milvus 2.3 set only this one
RETRY_LATER_LEGACY: dict[int, tuple[str, str]] = {
    45: ("not_ready", "NotShardLeader"),
    46: ("not_ready", "NoReplicaAvailable"),
    49: ("not_ready", "RateLimit"),
    55: ("not_ready", "TimeTickLongDelay"),
    56: ("not_ready", "NotReadyServe"),
    57: ("not_ready", "NotReadyCoordActivating"),
    100: ("not_ready", "DataCoordNA"),
}
NOT_LOADED = tuple(c for c, (kind, _) in RETRY_LATER.items() if kind == "not_loaded")
LOAD_TIMEOUT_S = 60  # creating or loading a collection (not on a request's path): Milvus may take seconds
SUSPECT_S = 1.0  # a request-path call this slow starts a reachability check (Breaker.suspect)
REACH_TIMEOUT_S = 3.0  # that check's connection and call


def long_call(fn: Any) -> Any:
    """Mark a function that makes several Milvus calls or waits on purpose (creating, deleting, re-embedding, claim
    settling): :meth:`~.backend.MilvusBackend.run` does not cut it at one call's timeout."""
    fn.long_call = True
    return fn


def connect(uri: str, token: str | None, timeout_s: float) -> MilvusClient:
    """A new ``MilvusClient`` (its own gRPC channel), connected within ``timeout_s``.

    Raises:
        pymilvus.MilvusException: Milvus did not answer.
    """
    return MilvusClient(uri=uri, token=token or "", timeout=timeout_s)


def allocate_timestamp(uri: str, token: str | None, timeout: float) -> int:
    """A fresh Milvus hybrid timestamp (physical milliseconds << 18 | a logical counter) from Milvus's timestamp
    oracle: the ``AllocTimestamp`` RPC of Milvus's ``MilvusService`` (milvus.proto), which pymilvus's
    ``MilvusClient`` does not wrap, on a gRPC channel opened for the call and closed after it.

    A timestamp allocated after a write was acknowledged is at least that write's (the oracle is monotonic), so it
    is a read-your-writes token: a read whose guarantee timestamp it is sees the write. The channel is not kept: an
    open channel across a Milvus crash holds its subchannel's reconnect back-off, which new channels to the same
    address share (see the module docstring).

    Raises:
        grpc.RpcError: Milvus unreachable or past ``timeout``; pymilvus.MilvusException: Milvus refused.
    """
    u = urlparse(uri if "://" in uri else f"http://{uri}")
    target = f"{u.hostname}:{u.port or 19530}"
    meta = [("authorization", base64.b64encode(token.encode()).decode())] if token else []
    channel = (
        grpc.secure_channel(target, grpc.ssl_channel_credentials())
        if u.scheme == "https"
        else grpc.insecure_channel(target)
    )
    try:
        r = milvus_pb2_grpc.MilvusServiceStub(channel).AllocTimestamp(
            milvus_pb2.AllocTimestampRequest(), timeout=timeout, metadata=meta
        )
    finally:
        channel.close()
    if r.status.code or r.status.error_code:  # as pymilvus's check_status raises it
        raise MilvusException(r.status.code, f"AllocTimestamp: {r.status.reason}", r.status.error_code)
    return int(r.timestamp)


def answering_client(uri: str, token: str | None, timeout_s: float) -> MilvusClient | None:
    """A fresh connection to Milvus (a new channel, see the module docstring) that answered ``list_collections``
    within ``timeout_s``, or None (the connection closed)."""
    try:
        c = connect(uri, token, timeout_s)
    except Exception:
        return None
    try:
        c.list_collections(timeout=max(1, math.ceil(timeout_s)))
        return c
    except Exception:
        c.close()
        return None


def reachable(uri: str, token: str | None, timeout_s: float) -> bool:
    """Whether a fresh connection to Milvus answers within ``timeout_s`` (:func:`answering_client`, then closed)."""
    c = answering_client(uri, token, timeout_s)
    if c is not None:
        c.close()
    return c is not None


class BoundedClient:
    """A ``MilvusClient`` whose RPCs all carry ``timeout`` (an int, see the module docstring) unless given one, and
    whose connection :meth:`replace` can swap for a fresh one; :meth:`timestamp` asks Milvus's timestamp oracle.

    Args:
        client: the connected ``MilvusClient``.
        timeout_s: every call's timeout.
        uri, token: where :meth:`timestamp` connects (those of ``client``).
    """

    def __init__(self, client: MilvusClient, timeout_s: float, uri: str = "", token: str | None = None) -> None:
        self._client = client
        self.timeout = max(1, math.ceil(timeout_s))
        self._uri, self._token = uri, token
        self._lock = threading.Lock()
        self._released = False  # the current connection's close is scheduled (release)

    def timestamp(self) -> int:
        """A Milvus timestamp allocated now (see :func:`allocate_timestamp`)."""
        return allocate_timestamp(self._uri, self._token, self.timeout)

    def replace(self, client: MilvusClient) -> None:
        """Use ``client`` from now on; the old connection closes once calls still on it are past their timeout
        (closing it at once fails them with "Cannot invoke RPC on closed channel"), unless :meth:`release` did."""
        with self._lock:
            old, self._client = self._client, client
            released, self._released = self._released, False
        if not released:
            self._close_later(old)

    def release(self) -> None:
        """Close the current connection once calls still on it are past their timeout (once until :meth:`replace`).

        For while Milvus is unreachable (the breaker open: no call reaches the connection): an open channel keeps its
        gRPC subchannel's reconnect back-off alive for every new channel to Milvus (see the module docstring). Calls
        on the connection after it closed fail with "Cannot invoke RPC on closed channel"."""
        with self._lock:
            if self._released:
                return
            self._released = True
        self._close_later(self._client)

    def _close_later(self, client: MilvusClient) -> None:
        def _close() -> None:
            try:
                client.close()
            except Exception:
                pass

        t = threading.Timer(self.timeout + 5.0, _close)
        t.daemon = True
        t.start()

    def __getattr__(self, name: str) -> Any:
        attr = getattr(self._client, name)
        if name in _LOCAL or name.startswith("_") or not callable(attr):
            return attr

        def call(*args: Any, **kw: Any) -> Any:
            kw.setdefault("timeout", self.timeout)
            return attr(*args, **kw)

        return call


def retry_later(e: MilvusException) -> tuple[str, str] | None:
    """``(kind, Milvus's name)`` when ``e`` carries a status code of :data:`RETRY_LATER` (or, without one, of
    :data:`RETRY_LATER_LEGACY`), else None."""
    code = e.code if isinstance(e.code, int) else None  # pymilvus puts a grpc method there after retries on RpcError
    if code:
        return RETRY_LATER.get(code)
    compatible = getattr(e, "compatible_code", None)
    return RETRY_LATER_LEGACY.get(compatible) if isinstance(compatible, int) else None


def _chain(e: BaseException, depth: int = 4) -> list[BaseException]:
    """``e`` and the exceptions it was raised from or while handling, nearest first."""
    out = [e]
    while len(out) < depth:
        nxt = next((x for x in (out[-1].__cause__, out[-1].__context__) if x is not None and x not in out), None)
        if nxt is None:
            break
        out.append(nxt)
    return out


def classify(e: BaseException) -> str | None:
    """``"unavailable"`` (Milvus unreachable), ``"not_ready"``, ``"not_loaded"`` (Milvus answered: retry later, see
    :data:`RETRY_LATER`) or None (any other error) for an exception a Milvus call raised."""
    if isinstance(e, grpc.RpcError):
        code = e.code() if callable(getattr(e, "code", None)) else None
        return "unavailable" if code in (grpc.StatusCode.UNAVAILABLE, grpc.StatusCode.DEADLINE_EXCEEDED) else None
    if not isinstance(e, MilvusException):
        return None
    # pymilvus's retry loop re-raises a rate limit past its timeout as a new exception without the legacy code; the
    # one it was handling stays its __context__ (its __cause__ is itself: pymilvus raises ``e from e``)
    known = None
    for x in _chain(e):
        if not isinstance(x, MilvusException):
            break
        known = retry_later(x)
        if known is not None or (isinstance(x.code, int) and x.code):  # a code of its own: that one tells
            break
    if known is not None:
        return known[0]
    if "not loaded" in (e.message or "") or "not fully loaded" in (e.message or ""):
        return "not_loaded"
    text = f"{e.message} {e.__cause__!r}"
    if any(
        s in text for s in ("Retry timeout", "Retry run out", "UNAVAILABLE", "DEADLINE_EXCEEDED", "Fail connecting")
    ):
        return "unavailable"
    return None


def retry_later_error(e: MilvusException, kind: str) -> BackendUnavailable:
    """The answer to a call Milvus answered "retry later" (``kind`` ``not_loaded`` or ``not_ready``, see
    :func:`classify`): 503 with ``Retry-After`` 2 s while loading, else 1 s."""
    if kind == "not_loaded":
        return BackendUnavailable(
            "the vector store (Milvus) is still loading this collection (after a restart); retry shortly", 2.0
        )
    return BackendUnavailable(
        f"the vector store (Milvus) cannot serve this now (code {e.code}: {e.message}); retry", 1.0
    )


class Breaker:
    """Whether Milvus is known to be unreachable: opened by a call that found it so, closed by a probe.

    Args:
        retry_after_s: what the 503's ``Retry-After`` suggests.
    """

    def __init__(self, retry_after_s: float = 1.0) -> None:
        self.open_since: float | None = None
        self.reason = ""
        self.retry_after_s = retry_after_s
        self._lock = threading.Lock()
        self._checking, self._checked_at = False, 0.0

    def suspect(self, reachable: Callable[[], bool]) -> None:
        """A call is slow: check on a thread of its own (the backend's may all be stuck on a dead server) whether
        Milvus answers a fresh connection, and open the breaker if it does not. At most one check at a time and
        one a second; none while open."""
        with self._lock:
            if self.open_since is not None or self._checking or time.monotonic() - self._checked_at < 1.0:
                return
            self._checking = True

        def check() -> None:
            try:
                ok = reachable()
            finally:
                with self._lock:
                    self._checking, self._checked_at = False, time.monotonic()
            if not ok:
                self.trip("a call was slow and a fresh connection got no answer")

        threading.Thread(target=check, daemon=True, name="milvus-suspect").start()

    def trip(self, reason: str) -> None:
        """Record that Milvus was found unreachable."""
        with self._lock:
            if self.open_since is None:
                self.open_since, self.reason = time.monotonic(), reason

    def reset(self) -> bool:
        """Milvus answered again; True when it had been unreachable."""
        with self._lock:
            was, self.open_since = self.open_since is not None, None
            return was

    def check(self) -> None:
        """Raises :class:`BackendUnavailable` while open."""
        since = self.open_since
        if since is not None:
            raise BackendUnavailable(
                f"the vector store (Milvus) is unreachable since {time.monotonic() - since:.1f} s ({self.reason}); "
                "retry later",
                retry_after_s=self.retry_after_s,
            )
