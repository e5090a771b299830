"""Fetching a snapshot named by a recovery's ``location`` (Qdrant's ``SnapshotRecover.location``,
https://api.qdrant.tech/api-reference/snapshots/recover-from-snapshot): a ``file://`` URL inside the snapshots
directory, or an ``http(s)://`` URL downloaded into its ``.downloads`` folder.

A download is bounded: by size (``collections_snapshot_max_bytes``, counted in the bytes written, never in the bytes
on the wire: a body sent with a ``Content-Encoding`` is refused, nothing is decompressed), by total time
(``collections_snapshot_download_timeout_s``) and by silence (``collections_snapshot_idle_timeout_s`` without a
byte); it is the caller's task, so it stops when the request that asked for it is abandoned, and its file is removed
on every path but success. With ``collections_snapshot_url_prefixes`` set, the URL and every redirect must start
with one of those prefixes. The ``api_key`` given is sent (Qdrant's ``api-key`` header) to the location's own
origin only, never to where a redirect leads elsewhere.

Every failure of the download itself (a name that does not resolve, a refused or reset connection, a port that does
not speak HTTP, a status other than 200, a body too large, too slow or encoded) answers one message: what the
server can reach is not told to the client (the reason is logged).
"""

from __future__ import annotations

import asyncio
import logging
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import unquote, urlsplit

import httpx

from service.collections.errors import InvalidCollectionRequest

log = logging.getLogger("service.collections")
DOWNLOADS = ".downloads"  # under the snapshots directory: snapshots being received (downloaded or uploaded)
MAX_LOCATION_CHARS = 8192  # a longer location is refused before it is parsed
MAX_REDIRECTS = 5
UNREACHABLE = (
    "the snapshot could not be fetched from this location (unreachable, refused, not answered with 200, encoded, "
    "larger than collections_snapshot_max_bytes or slower than the snapshot timeouts); the server log says which"
)


@dataclass(frozen=True)
class FetchLimits:
    """The bounds of a download (see the module docstring): ``max_bytes`` (bytes written), ``timeout_s`` (the whole
    download), ``idle_s`` (longest wait for the next byte), ``prefixes`` (allowed URL prefixes; empty: any)."""

    max_bytes: int
    timeout_s: float
    idle_s: float
    prefixes: tuple[str, ...] = ()

    @classmethod
    def of(cls, settings: Any) -> FetchLimits:
        """The limits a backend's ``CollectionSettings`` view holds (``collections_snapshot_*``)."""
        return cls(
            int(settings.snapshot_max_bytes),
            float(settings.snapshot_download_timeout_s),
            float(settings.snapshot_idle_timeout_s),
            tuple(settings.snapshot_url_prefixes or ()),
        )


class _Failed(Exception):
    """A download failure; its text is logged, never answered."""


def _invalid(message: str) -> InvalidCollectionRequest:
    return InvalidCollectionRequest(message, param="location")


def download_path(directory: Path) -> Path:
    """A fresh file name for a snapshot being received (downloaded or uploaded), in ``directory/.downloads``."""
    dest = directory / DOWNLOADS / f"{uuid.uuid4().hex}.snapshot"
    dest.parent.mkdir(parents=True, exist_ok=True)
    return dest


def local_file(location: str, directory: Path) -> Path | None:
    """The file a ``file://`` ``location`` names inside ``directory``; None for an ``http(s)://`` location.

    Raises:
        InvalidCollectionRequest: ``invalid_value``: longer than :data:`MAX_LOCATION_CHARS`, not a URL, another
            scheme, a NUL byte, a path outside ``directory`` or no file there.
    """
    if len(location) > MAX_LOCATION_CHARS:
        raise _invalid(f"location is longer than {MAX_LOCATION_CHARS} characters")
    try:
        u = urlsplit(location)
        _ = u.port  # a bad port or bracketed host raises here
    except ValueError as e:
        raise _invalid(f"location is not a valid URL: {e}") from None
    if u.scheme in ("http", "https"):
        if not u.hostname:
            raise _invalid("an http(s) location needs a host")
        return None
    if u.scheme != "file":
        raise _invalid("location must be a file://, http:// or https:// URL")
    path = unquote(u.path)
    if "\0" in path:
        raise _invalid("a file location cannot hold a NUL byte")
    root = directory.resolve()
    try:
        p = Path(path).resolve()
    except (OSError, ValueError, RuntimeError) as e:
        raise _invalid(f"the file location cannot be resolved: {e}") from None
    if not p.is_relative_to(root):
        raise _invalid(f"a file location must lie inside {root}")
    if not p.is_file():
        raise _invalid(f"no snapshot file at {p}")
    return p


def _allowed(url: str, prefixes: tuple[str, ...]) -> bool:
    return not prefixes or any(url.startswith(p) for p in prefixes)


async def fetch(location: str, directory: Path, limits: FetchLimits, api_key: str | None = None) -> tuple[Path, bool]:
    """The local file of snapshot ``location``: ``(path, downloaded)``; a downloaded file is the caller's to delete.

    Raises:
        InvalidCollectionRequest: ``invalid_value`` (:func:`local_file`; an http(s) URL outside
            ``limits.prefixes``) or ``snapshot_unreachable`` (any failure of the download: one message).
    """
    p = local_file(location, directory)
    if p is not None:
        return p, False
    if not _allowed(location, limits.prefixes):
        raise _invalid("location is not under an allowed URL prefix (collections_snapshot_url_prefixes)")
    dest = download_path(directory)
    try:
        async with asyncio.timeout(limits.timeout_s):
            await _download(location, dest, limits, api_key)
    except (_Failed, httpx.HTTPError, httpx.InvalidURL, TimeoutError, ValueError, OSError) as e:
        dest.unlink(missing_ok=True)
        log.warning("snapshot download from %r failed: %s: %s", location[:200], type(e).__name__, e)
        raise InvalidCollectionRequest(UNREACHABLE, param="location", code="snapshot_unreachable") from None
    except BaseException:  # cancelled: the request was abandoned
        dest.unlink(missing_ok=True)
        raise
    return dest, True


async def _download(url: str, dest: Path, limits: FetchLimits, api_key: str | None) -> None:
    """GET ``url`` into ``dest`` within ``limits`` (redirects followed by hand, each checked). Raises _Failed or
    httpx's errors."""
    origin = httpx.URL(url).copy_with(path="/", query=None, fragment=None)
    timeout = httpx.Timeout(limits.idle_s)
    async with httpx.AsyncClient(timeout=timeout, follow_redirects=False) as client:
        for _ in range(MAX_REDIRECTS + 1):
            target = httpx.URL(url)
            same_origin = target.copy_with(path="/", query=None, fragment=None) == origin
            headers = {"accept-encoding": "identity"}
            if api_key and same_origin:
                headers["api-key"] = api_key
            async with client.stream("GET", target, headers=headers) as r:
                if r.is_redirect:
                    url = str(target.join(r.headers.get("location", "")))
                    if httpx.URL(url).scheme not in ("http", "https") or not _allowed(url, limits.prefixes):
                        raise _Failed(f"redirect to {url[:200]!r}, outside the allowed locations")
                    continue
                if r.status_code != 200:
                    raise _Failed(f"status {r.status_code}")
                encoding = r.headers.get("content-encoding", "identity").strip().lower()
                if encoding not in ("", "identity"):
                    raise _Failed(f"Content-Encoding {encoding!r} (only identity is accepted)")
                declared = r.headers.get("content-length")
                if declared is not None and declared.isdigit() and int(declared) > limits.max_bytes:
                    raise _Failed(f"Content-Length {declared} > collections_snapshot_max_bytes={limits.max_bytes}")
                await _write(r, dest, limits.max_bytes)
                return
        raise _Failed(f"more than {MAX_REDIRECTS} redirects")


async def _write(r: httpx.Response, dest: Path, max_bytes: int) -> None:
    """Stream the raw body of ``r`` (never decoded) into ``dest``, at most ``max_bytes``."""
    n = 0
    with open(dest, "wb") as f:
        async for chunk in r.aiter_raw(1 << 20):
            n += len(chunk)
            if n > max_bytes:
                raise _Failed(f"the body exceeds collections_snapshot_max_bytes={max_bytes}")
            await asyncio.to_thread(f.write, chunk)
