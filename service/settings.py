"""Service settings: one pydantic-settings model, read from ``EMBED_*`` environment variables.

Precedence (highest first): command-line flags (``python -m service --help``),
environment variables (``EMBED_MAX_BATCH_TOKENS=8192``), field defaults.
Every field has a default, so ``Settings()`` always works.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Literal

from pydantic import Field, field_validator, model_validator
from pydantic_settings import BaseSettings, NoDecode, SettingsConfigDict

from service.device_defaults import BATCHING_DEFAULTS, GPU_API_WORKERS_MAX

#: read consistency levels, strongest first (Milvus docs, "Consistency Level")
ReadConsistencyLevel = Literal["strong", "bounded", "eventual"]


def _split_csv(v: object) -> object:
    """Accept ``"a,b"`` (env/CLI) as well as a list for list-valued settings."""
    if isinstance(v, str):
        v = v.strip()
        if v.startswith("["):
            import json

            return json.loads(v)
        return [p.strip() for p in v.split(",") if p.strip()]
    return v


MILVUS_MAX_PAYLOAD_BYTES = 32768


class Settings(BaseSettings):
    """Everything the service can be told. Env prefix ``EMBED_``; list fields take comma-separated strings.

    Batching limits are counted in tokens *after* padding to the longest input of a
    batch (``batch_len x max_len``) and in inputs (sentences).
    """

    model_config = SettingsConfigDict(env_prefix="EMBED_", extra="ignore", protected_namespaces=())

    host: str = Field("127.0.0.1", description="interface to bind")
    port: int = Field(8000, ge=0, le=65535, description="TCP port")
    qdrant_grpc_port: int = Field(
        0, ge=0, le=65535, description="TCP port of Qdrant's gRPC API on the same host (0: off; Qdrant uses 6334)"
    )
    models_dir: str = Field("models", description="artifact store (models/<name>/ or models/<name>/<version>/)")
    default_model: str = Field(
        "all-minilm-l6-v2", description="artifact loaded at start and used when a request names no model"
    )
    rerank_models: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="reranker artifacts (manifest task 'reranker') loaded at start, comma-separated, served by "
        "/rerank, /v1/rerank and /v2/rerank (a request naming none gets the first); more: POST /admin/models/<name>/load",
    )
    data_dir: str = Field("data", description="writable state (collections)")
    max_batch_tokens: int = Field(
        0,
        ge=0,
        description="token budget of one inference batch (padded tokens); a request arriving meanwhile waits for "
        "the running batch, so this bounds its wait (0: the model's first provider's default, CPU 2048, CUDA 32768)",
    )
    max_batch_size: int = Field(
        0,
        ge=0,
        description="most inputs in one inference batch (0: the model's first provider's default, CPU 16, CUDA 256)",
    )
    max_client_batch_size: int = Field(512, gt=0, description="most inputs in one request (more: 413)")
    max_request_tokens: int = Field(
        131072, gt=0, description="most tokens (after truncation) in one request's inputs together (more: 413)"
    )
    max_queue_size: int = Field(
        1024, gt=0, description="most requests admitted and not yet answered, per model (more: 429)"
    )
    max_payload_bytes: int = Field(2 * 1024 * 1024, gt=0, description="largest request body in bytes (more: 413)")
    qdrant_max_payload_bytes: int = Field(
        32 * 1024 * 1024,
        gt=0,
        description="largest request body under /qdrant in bytes (more: 413); Qdrant's own "
        "default (max_request_size_mb 32), which qdrant-client's batch uploads assume",
    )
    intra_op_threads: int = Field(0, ge=0, description="ONNX Runtime intra-op threads (0 = ORT default)")
    inter_op_threads: int = Field(0, ge=0, description="ONNX Runtime inter-op threads (0 = ORT default)")
    batch_overhead_tokens: int = Field(
        -1,
        ge=-1,
        description="fixed cost of one inference batch in padded-token equivalents; windows are cut "
        "into batches minimising padded tokens + this per batch (0: as many batches as it takes to pad nothing; "
        "-1: the model's first provider's default, CPU 16, CUDA 256)",
    )
    inference_workers: int = Field(
        1, ge=1, le=64, description="inference batches run at once per model (each uses intra_op_threads)"
    )
    tokenizer_threads: int = Field(
        2,
        ge=1,
        le=64,
        description="threads tokenizing requests per model, off the event loop (each call also spreads a chunk's "
        "texts over the tokenizers library's own thread pool); a GPU serving many clients may need more",
    )
    ort_arena_shrink_tokens: int = Field(
        2048,
        ge=0,
        description="after an inference batch of more than this many padded tokens, ONNX Runtime's CPU memory arena "
        "returns its free memory to the OS (else it keeps the largest batch's peak for good; 0: after every batch)",
    )
    ort_spinning: bool = Field(
        False,
        description="let ORT worker threads spin-wait between ops (helps on dedicated cores, hurts on shared ones)",
    )
    providers: Annotated[list[str], NoDecode] = Field(
        default_factory=lambda: ["auto"],
        description="ORT execution providers in order (cpu, cuda, tensorrt or ORT's names); 'auto' = CUDA when it "
        "works, else CPU (logged); providers named explicitly must all initialise, or the model does not load",
    )
    api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list, repr=False, description="accepted 'Authorization: Bearer' keys; empty = no auth"
    )
    admin_api_keys: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        repr=False,
        description="keys for /admin routes; empty = the api_keys; neither set = admin routes disabled (403)",
    )
    api_keys_file: str | None = Field(
        None,
        repr=False,
        description="file of API keys, one per line (# comments), added to api_keys; keeps keys out of "
        "the command line, which other users of the host can read (ps)",
    )
    admin_api_keys_file: str | None = Field(
        None, repr=False, description="file of admin API keys, added to admin_api_keys"
    )
    request_timeout_s: float = Field(
        60.0,
        gt=0,
        description="time budget of a request (not /admin nor collection snapshots): past it the request answers 503 request_timeout and "
        "its queued inputs are dropped; a client that disconnects has its queued inputs dropped at once",
    )
    api_workers: int = Field(
        0,
        ge=0,
        le=64,
        description="HTTP front processes sharing the port: 1 = one process serves everything; N > 1 = N fronts parse "
        "and answer the embedding routes (/v1/embeddings, /embed) and pass every other request to one core process, "
        "which owns the models, batchers and collections and listens on a private Unix socket (service.supervisor); "
        f"0 = by the device: half the host's cores (2-{GPU_API_WORKERS_MAX}) where the providers run on an NVIDIA "
        "GPU, else 1 (docs/performance.md, "
        "'Several serving processes on one port')",
    )
    front_tokenization: bool = Field(
        True,
        description="with api_workers > 1, fronts tokenize the embedding requests of models they have seen the core "
        "run (up to 64k characters) and send the token ids with the texts; the core uses them only for the model they "
        "were made for (service.front.tokenizing). false: the core tokenizes everything",
    )
    front_inference: bool = Field(
        False,
        description="with api_workers > 1, each front loads the embedding models the core has loaded (same artifacts "
        "and providers) and runs the embedding requests that resolve to them itself, as the core would; the core "
        "still decides which model answers (service.front.local_models); on a CPU give each front intra_op_threads = "
        "cores / api_workers (docs/performance.md). false: the core runs every batch",
    )
    drain_s: float = Field(
        5.0, ge=0, description="after SIGTERM, seconds /ready answers 503 while requests are still served"
    )
    graceful_timeout_s: float = Field(
        30.0, gt=0, description="after the drain, seconds in-flight requests get to finish before the exit"
    )
    model_control: Literal["explicit", "poll"] = Field(
        "explicit",
        description="'explicit': models change only through /admin routes; 'poll': also watch models_dir "
        "and activate a newly published, newer version of the active model",
    )
    model_poll_interval_s: float = Field(2.0, gt=0, description="seconds between scans of models_dir in poll mode")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field("info", description="log level")
    replica_header: bool = Field(
        False,
        description="send 'X-Replica: <hostname>' on every response (tells replicas apart behind a load balancer)",
    )

    # Collections (nearest-neighbour search); env EMBED_COLLECTIONS_*, flags --collections-*
    collections_backend: Literal["embedded", "milvus"] = Field(
        "embedded",
        description="where collections live: 'embedded' (SQLite + FAISS in this process, under data_dir) or "
        "'milvus' (a Milvus server or cluster at collections_milvus_uri, shared by several replicas)",
    )
    collections_milvus_uri: str = Field(
        "http://127.0.0.1:19530", description="milvus backend: the Milvus server or cluster proxy"
    )
    collections_milvus_token: str | None = Field(
        None, description="milvus backend: 'user:password' or an API token (pass it by environment, not a flag)"
    )
    collections_milvus_prefix: str = Field(
        "embed_",
        pattern=r"^[A-Za-z_][A-Za-z0-9_]{0,31}$",
        description="milvus backend: prefix of every Milvus collection this service uses (replicas share one)",
    )
    collections_milvus_refresh_s: float = Field(
        1.0, gt=0, description="milvus backend: how old a replica's view of the shared registry may get (seconds)"
    )
    collections_milvus_claim_ttl_s: float = Field(
        15.0, gt=0, description="milvus backend: a re-embedding claim lapses this long after its holder's last renewal"
    )
    collections_milvus_claim_settle_s: float = Field(
        1.0, ge=0, description="milvus backend: how long a claim waits for earlier claims to become visible"
    )
    collections_milvus_write_timeout_s: float = Field(
        10.0, gt=0, description="milvus backend: the longest a Milvus call may take (seconds)"
    )
    collections_read_consistency: ReadConsistencyLevel = Field(
        "strong",
        description="milvus backend: the consistency of reads (search, point reads, counts) that name none: 'strong' "
        "sees every acknowledged write, 'bounded' may miss the last common.gracefulTime of Milvus (5 s by default) "
        "and does not wait for Milvus's time tick, 'eventual' never waits; a write's 'sequence' passed as "
        "'after_sequence' reads that write on any replica. The embedded backend is always strong",
    )
    collections_snapshot_every: int = Field(
        200, ge=1, description="writes (upsert/delete requests) after which a FAISS snapshot is written"
    )
    collections_snapshot_interval_s: float = Field(
        60.0, gt=0, description="seconds after which pending writes are snapshotted anyway"
    )
    collections_snapshots_dir: str | None = Field(
        None,
        description="embedded backend: where collection snapshots (backups, POST /collections/{name}/snapshots) are "
        "kept, a folder per collection (default <data_dir>/snapshots; another volume keeps them off the data's disk)",
    )
    collections_snapshot_max_bytes: int = Field(
        32 * 2**30,
        ge=1,
        description="embedded backend: the largest collection snapshot accepted from an upload or a download "
        "(bytes written, not bytes on the wire)",
    )
    collections_snapshot_download_timeout_s: float = Field(
        3600.0, gt=0, description="longest a snapshot download for a recovery from a URL may take (seconds)"
    )
    collections_snapshot_idle_timeout_s: float = Field(
        60.0,
        gt=0,
        description="a snapshot upload or download that sends no byte for this long is stopped (seconds)",
    )
    collections_snapshot_url_prefixes: Annotated[list[str], NoDecode] = Field(
        default_factory=list,
        description="URL prefixes a snapshot recovery may download from (end each with '/'); empty = any http(s) "
        "URL (recovery from a location needs an admin key either way)",
    )
    sparse_bm25_path: str | None = Field(
        None,
        description="the qdrant/bm25 sparse model's directory (english.txt stopwords, config.json; a snapshot of the "
        "Qdrant/bm25 model repository works); default: the one bundled with the service (NLTK's English stopwords)",
    )
    sparse_workers: int | None = Field(
        None,
        ge=0,
        le=64,
        description="processes that tokenise the documents of server-side sparse models (qdrant/bm25), in batches of "
        "at least 32 texts, beside the serving process (0: on its worker threads); default (None): 1 on a machine with "
        "2 or more cores, else 0",
    )
    collections_maintenance_interval_s: float = Field(
        0.5, gt=0, description="how often the background task checks for due work"
    )
    collections_exact_filter_threshold: int = Field(
        20000,
        ge=0,
        description="searches over at most this many points (a filter's matches, or a vector's whole index) are exact "
        "(brute force)",
    )
    collections_max_points_per_request: int = Field(1024, ge=1, description="most points in one upsert (more: 413)")
    collections_max_top_k: int = Field(1000, ge=1, description="largest top_k of a search")
    collections_max_payload_bytes: int = Field(
        32768,
        ge=1,
        description="largest payload of one point, as compact UTF-8 JSON (more: 422), the same on both backends; at "
        "most 32768 on the milvus backend (its JSON field holds 65,536 bytes as its client encodes them, which can "
        "double a payload: '/' is escaped)",
    )
    collections_max_filter_values: int = Field(
        1024,
        ge=1,
        le=16384,
        description="most values in one payload filter (each compared value, range bound, $exists/$empty, listed "
        "id and full-text token counts one; more: 422 invalid_filter), the same on both backends",
    )
    collections_max_response_bytes: int = Field(
        32 * 1024 * 1024,
        ge=1024,
        description="most bytes of hits in one search or search/batch response (texts and payloads as stored, plus "
        "64 per hit; more: 413 response_too_large), the same on both backends; under /qdrant one budget per request "
        "also counts the vectors returned (with_vector) and bounds scroll and retrieve",
    )
    collections_max_batch_searches: int = Field(256, ge=1, description="most searches in one /search/batch request")
    collections_max_mmr_candidates: int = Field(
        1000,
        ge=1,
        description="largest candidates_limit of an MMR query (its n x n similarity matrix is computed per request); "
        "at most collections_max_top_k",
    )
    collections_max_concurrent_reranks: int = Field(
        2,
        ge=1,
        description="most searches with 'rerank' of one collection scored at once (the others wait their turn), so "
        "one collection's reranked searches never fill the reranker's queue for every other caller",
    )
    collections_max_formula_work: int = Field(
        2_000_000,
        ge=1,
        description="most condition checks of one formula query: the values of its conditions' filters (each at least "
        "one) times the points its prefetches may return (more: 422 before any work)",
    )
    collections_max_order_scan: int = Field(
        100_000,
        ge=1,
        description="most points an order_by scan reads when no index serves it (a key into arrays or nested objects): "
        "more matching points than this is 422; narrow the filter",
    )
    collections_worker_threads: int = Field(8, ge=2, description="threads for SQLite/FAISS work")
    collections_embed_chunk: int = Field(256, ge=1, description="texts per embedder call during an upsert")
    collections_faiss_threads: int = Field(
        1,
        ge=1,
        description="OpenMP threads per FAISS call (searches already run in parallel threads); an IVF search splits "
        "its lists over them (fewer concurrent searches: set it to the cores)",
    )
    collections_reembed_rate: float = Field(
        0.0,
        ge=0,
        description="most points per second a background re-embedding embeds (0 = unlimited); bounds its cost to live traffic during a model swap",
    )

    @field_validator(
        "providers", "api_keys", "admin_api_keys", "rerank_models", "collections_snapshot_url_prefixes", mode="before"
    )
    @classmethod
    def _csv(cls, v: object) -> object:
        return _split_csv(v)

    @model_validator(mode="after")
    def _read_key_files(self) -> Settings:
        for field, path in (("api_keys", self.api_keys_file), ("admin_api_keys", self.admin_api_keys_file)):
            if path:
                try:
                    lines = Path(path).read_text(encoding="utf-8").splitlines()
                except OSError as e:
                    raise ValueError(f"{field}_file {path!r} cannot be read: {e.strerror}") from None
                keys = [x.strip() for x in lines if x.strip() and not x.strip().startswith("#")]
                setattr(self, field, [*getattr(self, field), *(k for k in keys if k not in getattr(self, field))])
        return self

    @model_validator(mode="after")
    def _milvus_payload_cap(self) -> Settings:
        if self.collections_backend == "milvus" and self.collections_max_payload_bytes > MILVUS_MAX_PAYLOAD_BYTES:
            raise ValueError(
                f"collections_max_payload_bytes={self.collections_max_payload_bytes}: the milvus backend stores at "
                f"most {MILVUS_MAX_PAYLOAD_BYTES} (its JSON field holds 65,536 bytes as pymilvus encodes them)"
            )
        return self

    @field_validator("log_level", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v

    def batching(self, providers: list[str]) -> dict[str, int]:
        """``max_batch_tokens``, ``max_batch_size`` and ``batch_overhead_tokens`` for a model running on
        ``providers`` (ONNX Runtime's names, first = where the graph runs): the values set, else the first
        provider's :data:`BATCHING_DEFAULTS` (CPU's for a provider it does not list)."""
        table = BATCHING_DEFAULTS.get(providers[0] if providers else "", BATCHING_DEFAULTS["CPUExecutionProvider"])
        return {
            "max_batch_tokens": self.max_batch_tokens or table["max_batch_tokens"],
            "max_batch_size": self.max_batch_size or table["max_batch_size"],
            "batch_overhead_tokens": table["batch_overhead_tokens"]
            if self.batch_overhead_tokens < 0
            else self.batch_overhead_tokens,
        }

    def limits(self, providers: list[str]) -> dict[str, int]:
        """The request/batching limits, as reported by ``GET /info`` for a model running on ``providers``."""
        batching = self.batching(providers)
        return {
            "max_batch_tokens": batching["max_batch_tokens"],
            "max_batch_size": batching["max_batch_size"],
            "max_client_batch_size": self.max_client_batch_size,
            "max_request_tokens": self.max_request_tokens,
            "max_queue_size": self.max_queue_size,
            "max_payload_bytes": self.max_payload_bytes,
        }
