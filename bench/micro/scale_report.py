"""The records of ``scale_bench`` and their tables: ``--mode dense``'s from its ``results.json``
(:func:`dense_table`); ``--mode hybrid``'s: ``results.jsonl`` (one line per finished
measurement), the ingest rate from ``ingest.jsonl`` (one line per acknowledged upsert) and the markdown tables
printed at the end (:mod:`bench.micro.scale_hybrid` says what each measurement is)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

from bench.micro import scale_docs as docs

KINDS = ("dense", "bm25", "hybrid")
PHASES = ("none", "indexed")  # without payload indexes, then with them


class Results:
    """``results.jsonl``: one JSON object per finished measurement, ``{"key": ..., ...}``; the last line of a key
    wins."""

    def __init__(self, path: Path) -> None:
        self.path, self.d, self.new = path, {}, []
        if path.exists():
            for line in path.read_text().splitlines():
                if line.strip():
                    rec = json.loads(line)
                    self.d[rec["key"]] = rec

    def __contains__(self, key: str) -> bool:
        return key in self.d

    def get(self, key: str) -> dict | None:
        return self.d.get(key)

    def put(self, key: str, **values) -> dict:
        rec = {"key": key, **values}
        self.d[key] = rec
        self.new.append(key)
        with open(self.path, "a") as f:
            f.write(json.dumps(rec) + "\n")
        return rec


def ingest_rate(work: Path) -> dict:
    """Documents/s over the sessions that sent them: acknowledged documents / sum of each session's wall time."""
    recs = [json.loads(x) for x in (work / "ingest.jsonl").read_text().splitlines() if x.strip()]
    wall: dict[str, float] = {}
    n = 0
    for r in recs[1:]:
        wall[r["session"]] = max(wall.get(r["session"], 0.0), r["t"])
        n += r["end"] - r["start"]
    secs = sum(wall.values())
    return {"docs": n, "seconds": round(secs, 1), "sessions": len(wall), "docs_per_s": round(n / max(secs, 1e-9))}


def stats(lat: np.ndarray) -> dict:
    return {f"p{q}_ms": round(float(np.percentile(lat, q)), 1) for q in (50, 95)} | {
        "mean_ms": round(float(lat.mean()), 1)
    }


def _cell(r: dict | None, *keys: str) -> str:
    return " / ".join(f"{r[k]:,}" if r and r.get(k) is not None else "—" for k in keys)


def table(works: list[Path]) -> str:
    """The markdown tables of the finished measurements in these work directories."""
    out, sizes, lat = [], [], []
    for w in works:
        res = Results(w / "results.jsonl")
        s, ing, aft = res.get("setup") or {}, res.get("ingest"), res.get("after_ingest")
        sess = [r for k, r in sorted(res.d.items()) if k.startswith("session/")]
        for r in sess:
            out.append(
                f"- N={s.get('docs', 0):,}: {r['date']} UTC, {r['cpu']}, load average before "
                f"{'/'.join(f'{x:.2f}' for x in r['load_before'])}, after "
                f"{'/'.join(f'{x:.2f}' for x in r['load_after'])} (measured: {r.get('measured', '?')}; {s.get('queries')} queries, 1 client, prefetch {s.get('prefetch')})"
            )
        last = sess[-1] if sess else {}
        if (tr := res.get("trained")) and tr.get("waited_after_ingest_s"):
            out.append(
                f"- N={s.get('docs', 0):,}: the dense index trained {tr['waited_after_ingest_s']:,} s after the ingest"
            )
        rec = [_cell(res.get(f"lat/{p}/dense/{f}"), "recall_at_10") for f in docs.FILTERS for p in PHASES]
        schema = (res.get("indexes/indexed") or {}).get("payload_schema")
        sizes.append(
            f"| {s.get('docs', 0):,} | {s.get('dense')} | {s.get('index')} {s.get('index_params', '')} "
            f"| {_cell(ing, 'docs_per_s')} "
            f"| {_cell(aft, 'disk_mib')} | {_cell(aft, 'rss_mib', 'peak_rss_mib')} "
            f"| {_cell(last.get('after_queries'), 'rss_mib', 'peak_rss_mib')} "
            f"| {_cell(res.get('lat/none/dense/none'), 'recall_at_10')} | {' | '.join(rec)} "
            f"| {'yes' if schema else 'no'} |"
        )
        ex = [_cell(res.get(f"truth/{f}"), "p50_ms", "p95_ms") for f in ["none", *docs.FILTERS]]
        lat.append(f"| {s.get('docs', 0):,} | dense, exact | — | {' | '.join(ex)} |")
        for kind in KINDS:
            for p in PHASES:
                fs = ["none", *docs.FILTERS] if p == "none" else list(docs.FILTERS)
                cells = ["—"] * (p != "none") + [_cell(res.get(f"lat/{p}/{kind}/{f}"), "p50_ms", "p95_ms") for f in fs]
                lat.append(
                    f"| {s.get('docs', 0):,} | {kind} | {'yes' if p == 'indexed' else 'no'} | {' | '.join(cells)} |"
                )
    head1 = (
        "| N documents | dense vectors | dense index | ingest docs/s | disk MiB | server RSS / peak MiB after "
        "ingest | after queries | dense recall@10 vs exact: no filter | 1 %, no payload index | 1 %, indexed "
        "| 0.1 %, no payload index | 0.1 %, indexed | payload_schema reported |\n|" + "---|" * 13
    )
    head2 = (
        "| N documents | query | payload index | p50 / p95 ms, no filter | 1 % filter | 0.1 % filter |\n|" + "---|" * 6
    )
    return "\n".join([*out, "", head1, *sizes, "", head2, *lat])


def dense_table(res: dict, filters: list[str]) -> str:
    """The markdown table of a finished (or partial) ``scale_bench --mode dense`` run's ``results.json`` (its
    filtered searches named ``filters``)."""
    s, r2 = res.get("search", {}), res.get("search_after_restart", {})

    def cell(d: dict, *keys: str) -> str:
        return " / ".join(str(d[k]) if d and d.get(k) is not None else "—" for k in keys)

    load = [", ".join(f"{x:.2f}" for x in res.get(k) or []) for k in ("load_before", "load_after")]
    head = [
        f"{res.get('date')}, {res.get('cpu')}, load average before {load[0]}, after {load[1]}",
        "",
        "| N points | ingest points/s | disk MiB (x float32 vectors) | RSS / peak MiB | recall@10 | 1 client p50 / p99 ms | 4 clients p50 / p99 ms, queries/s "
        "| 0.1 % filter p50 / p99 ms, recall | 1 % | 10 % | start after clean stop s | after SIGKILL s | recall@10 after restart |",
        "|" + "---|" * 13,
    ]
    flt = [
        f"{cell(s.get(f'filtered_{n}'), 'p50_ms', 'p99_ms')}, {cell(s.get(f'filtered_{n}'), 'recall_at_10')}"
        for n in filters
    ]
    f32 = res.get("points", 0) * 384 * 4 / 2**20
    ratio = f"{res['disk_mb'] / f32:.2f}x" if res.get("disk_mb") and f32 else "—"
    row = (
        f"| {res.get('points', 0):,} | {cell(res.get('ingest'), 'points_per_s')} | {res.get('disk_mb', '—')} ({ratio}) "
        f"| {cell(res.get('after_ingest'), 'rss_mb', 'peak_rss_mb')} | {s.get('recall_at_10', '—')} "
        f"| {cell(s.get('search_1'), 'p50_ms', 'p99_ms')} | {cell(s.get('search_4'), 'p50_ms', 'p99_ms', 'queries_per_s')} "
        f"| {' | '.join(flt)} | {res.get('start_s_after_clean_stop', '—')} | {res.get('start_s_after_sigkill', '—')} "
        f"| {r2.get('recall_at_10', '—')} |"
    )
    return "\n".join([*head, row])
