#!/usr/bin/env bash
# Deployment smoke test with podman (not part of CI: it builds images and starts containers; minutes).
#
#   bash ../shared/containers/setup.sh     # on the project's machines: podman + local base images (no registry)
#   make artifact                          # models/all-minilm-l6-v2/, which the image copies in
#   bash docker/smoke.sh                   # SMOKE_NO_CACHE=1 for a cold build
#
# 1. builds the CPU image (docker/Dockerfile), prints its size and the layers above the base (limit
#    SMOKE_LIMIT_MB, 300), checks it holds no torch;
# 2. runs it on a loopback port with an API key: waits for /ready, embeds, `podman healthcheck run`, console;
# 3. brings up the Compose stack (podman-compose; Grafana too when its image is in local storage), checks that
#    Prometheus scrapes the service (target up), sends traffic, runs every PromQL expression of the Grafana
#    dashboard against that Prometheus, hot-swaps a model published into the mounted models volume (admin API),
#    and checks that collections, the new model and the active choice survive `compose down` / `up`;
# 4. tears everything down (containers, the stack's volumes; the image stays) and prints each check, the sizes
#    and the timings. Exit status 0 only when every check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
if [ -z "${CONTAINERS_CONF:-}" ] && [ -f /etc/containers/containers.conf.d-local.conf ]; then
  export CONTAINERS_CONF=/etc/containers/containers.conf.d-local.conf  # written by ../shared/containers/setup.sh
fi
IMAGE=${SMOKE_IMAGE:-redundancy-embed:cpu}
BASE=$(awk '/^FROM /{print $2; exit}' docker/Dockerfile)
MODEL=${MODEL:-all-minilm-l6-v2}
LIMIT_MB=${SMOKE_LIMIT_MB:-300}
PORT=${SMOKE_PORT:-18080}
export EMBED_PUBLISH_PORT=${SMOKE_COMPOSE_PORT:-18081}
export PROMETHEUS_PORT=${SMOKE_PROMETHEUS_PORT:-19090}
export GRAFANA_PORT=${SMOKE_GRAFANA_PORT:-13000}
EMBED_API_KEYS="smoke-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
GRAFANA_ADMIN_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
export EMBED_API_KEYS GRAFANA_ADMIN_PASSWORD
PROJECT=redundancy-embed-smoke
CONTAINER=redundancy-embed-smoke
NEW_MODEL=minilm-smoke
TMP=$(mktemp -d)
T_START=$(date +%s)
RESULTS=()
TIMES=()
FAILED=0

log() { printf '%s  %s\n' "$(date +%H:%M:%S)" "$*"; }
pass() { RESULTS+=("PASS  $1"); log "PASS  $1"; }
fail() { RESULTS+=("FAIL  $1"); log "FAIL  $1"; FAILED=1; }
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name"; fi; }
timing() { TIMES+=("$(printf '%-44s %6ss' "$1" "$2")"); log "time  $1: $2 s"; }
mb() { python3 -c "print(f'{$1 / 1e6:.1f} MB')"; }

# --- HTTP: req METHOD URL [JSON] [extra curl args] -> status code in $CODE, body in $TMP/body, headers in $TMP/hdr
req() {
  local method=$1 url=$2 data=${3:-}
  shift $(($# < 3 ? $# : 3))
  local args=(-sS -X "$method" -o "$TMP/body" -D "$TMP/hdr" -w '%{http_code}' --max-time 120 "$@")
  [ -n "$data" ] && args+=(-H 'Content-Type: application/json' --data-binary "$data")
  CODE=$(curl "${args[@]}" "$url" 2>"$TMP/curl.err") || CODE=000
}
AUTH=(-H "Authorization: Bearer $EMBED_API_KEYS")
jbody() { python3 -c "import json,sys; d=json.load(open('$TMP/body')); print($1)"; }
header() { tr -d '\r' <"$TMP/hdr" | awk -v h="$(echo "$1" | tr 'A-Z' 'a-z')" -F': ' 'tolower($1)==h{print $2}'; }

wait_ready() {  # URL TIMEOUT -> seconds waited in $WAITED
  local t0=$SECONDS
  while [ $((SECONDS - t0)) -lt "$2" ]; do
    req GET "$1/ready"
    if [ "$CODE" = 200 ]; then WAITED=$((SECONDS - t0)); return 0; fi
    sleep 1
  done
  WAITED=$((SECONDS - t0))
  return 1
}

# --- compose -------------------------------------------------------------------------------------------------
if command -v podman-compose >/dev/null 2>&1; then
  PC=(podman-compose)
else
  PCVENV=${XDG_CACHE_HOME:-$HOME/.cache}/redundancy-embed/podman-compose
  if [ ! -x "$PCVENV/bin/podman-compose" ]; then
    log "installing podman-compose into $PCVENV"
    python3 -m venv "$PCVENV" && "$PCVENV/bin/pip" install -q podman-compose
  fi
  PC=("$PCVENV/bin/podman-compose")
fi
compose() { "${PC[@]}" -p "$PROJECT" -f docker/docker-compose.yml "$@"; }
embed_container() { podman ps -a --format '{{.Names}}' | grep -E "^${PROJECT}[_-]embed[_-]1$" | head -n1; }

teardown() {
  log "teardown"
  podman rm -f -v "$CONTAINER" >/dev/null 2>&1
  compose down -v >"$TMP/down.log" 2>&1 || cat "$TMP/down.log"
  for v in models collections prometheus grafana; do podman volume rm -f "${PROJECT}_$v" >/dev/null 2>&1; done
  rm -rf "$TMP"
}
trap teardown EXIT

summary() {
  echo
  echo "== redundancy-embed deployment smoke test: $(date -u '+%Y-%m-%d %H:%M UTC')"
  echo "machine: $(lscpu | sed -n 's/^Model name:[[:space:]]*//p' | head -n1), $(nproc) CPUs; $(podman --version); $("${PC[@]}" version 2>/dev/null | grep -m1 -i 'podman-compose')"
  echo "-- sizes"
  printf '%s\n' "${SIZES[@]}"
  echo "-- timings"
  printf '%s\n' "${TIMES[@]}"
  echo "-- checks"
  printf '%s\n' "${RESULTS[@]}"
  echo "total: $(($(date +%s) - T_START)) s; $(printf '%s\n' "${RESULTS[@]}" | grep -c '^PASS') passed, $(printf '%s\n' "${RESULTS[@]}" | grep -c '^FAIL') failed"
}

# --- 0. preconditions ------------------------------------------------------------------------------------------
command -v podman >/dev/null || { echo "podman not found: run ../shared/containers/setup.sh (or install podman)"; exit 2; }
[ -f "models/$MODEL/manifest.json" ] || { echo "models/$MODEL missing: run 'make artifact' first"; exit 2; }
SIZES=()

# --- 1. build ----------------------------------------------------------------------------------------------------
log "building $IMAGE from docker/Dockerfile (base $BASE)"
t=$SECONDS
build_args=(--format docker --network host -f docker/Dockerfile -t "$IMAGE" --build-arg "MODEL=$MODEL")
[ "${SMOKE_NO_CACHE:-0}" = 1 ] && build_args+=(--no-cache)
if podman build "${build_args[@]}" . >"$TMP/build.log" 2>&1; then
  pass "image builds (podman build${SMOKE_NO_CACHE:+, --no-cache})"
else
  tail -n 40 "$TMP/build.log"; fail "image builds"; summary; exit 1
fi
timing "build CPU image$([ "${SMOKE_NO_CACHE:-0}" = 1 ] && echo ' (cold, --no-cache)')" $((SECONDS - t))
python3 - "$IMAGE" "$BASE" "models/$MODEL" "$LIMIT_MB" >"$TMP/sizes" <<'PY'
import json, subprocess, sys
from pathlib import Path
image, base, model_dir, limit = sys.argv[1], sys.argv[2], Path(sys.argv[3]), float(sys.argv[4])
def run(*a): return subprocess.check_output(["podman", *a], text=True)
def size(i): return int(run("image", "inspect", i, "--format", "{{.Size}}"))
def mb(n): return f"{n / 1e6:.1f} MB"
h_img, h_base = json.loads(run("history", "--format", "json", image)), json.loads(run("history", "--format", "json", base))
layers = h_img[: len(h_img) - len(h_base)]  # newest first
artifact = sum(f.stat().st_size for f in model_dir.iterdir() if f.is_file())
art_layer = next((l for l in layers if abs(l["size"] - artifact) < 2e6), None)
above = size(image) - size(base)
runtime = above - (art_layer["size"] if art_layer else 0)
print(f"SIZE image {image}: {mb(size(image))}; base {base}: {mb(size(base))}")
print(f"SIZE above the base: {mb(above)} = runtime layers {mb(runtime)} + the baked-in artifact {mb(above - runtime)}")
print("SIZE layers above the base (newest first):")
for l in layers:
    if l["size"]:  # metadata-only steps (ENV, USER, CMD...) are 0 B
        print(f"SIZE   {mb(l['size']):>9}  {' '.join(l['CreatedBy'].split())[:100]}")
print(f"ABOVE {above}")
print(f"RUNTIME {runtime}")
PY
sed -n 's/^SIZE //p' "$TMP/sizes" | while IFS= read -r l; do log "$l"; done
while IFS= read -r l; do SIZES+=("$l"); done < <(sed -n 's/^SIZE //p' "$TMP/sizes")
above=$(sed -n 's/^ABOVE //p' "$TMP/sizes")
runtime=$(sed -n 's/^RUNTIME //p' "$TMP/sizes")
check "runtime layers above the base <= $LIMIT_MB MB ($(mb "$runtime"); the artifact adds $(mb $((above - runtime))))" \
  [ "$runtime" -le $((LIMIT_MB * 1000000)) ]
if [ "$above" -gt $((LIMIT_MB * 1000000)) ]; then
  RESULTS+=("NOTE  with the baked-in artifact the image is $(mb "$above") above its base, over $LIMIT_MB MB")
fi
podman run --rm --entrypoint python "$IMAGE" -c '
import importlib.util, subprocess, sys
bad = [m for m in ("torch", "transformers", "sentence_transformers", "onnxruntime_gpu") if importlib.util.find_spec(m)]
pkgs = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
bad += [p for p in pkgs.split() if p.lower().startswith(("torch", "nvidia-", "triton"))]
print("forbidden:", bad or "none"); sys.exit(1 if bad else 0)' >"$TMP/notorch" 2>&1
check "image has no torch/CUDA packages ($(tail -n1 "$TMP/notorch"))" grep -q "forbidden: none" "$TMP/notorch"

# --- 2. the image alone -------------------------------------------------------------------------------------------
podman rm -f -v "$CONTAINER" >/dev/null 2>&1
t=$SECONDS
podman run -d --name "$CONTAINER" -p "127.0.0.1:$PORT:8000" -e EMBED_API_KEYS="$EMBED_API_KEYS" "$IMAGE" >/dev/null \
  2>>"$TMP/podman.err"  # (podman here warns that it has no systemd for health-check timers)
URL=http://127.0.0.1:$PORT
if wait_ready "$URL" 180; then pass "container /ready"; else fail "container /ready"; podman logs "$CONTAINER" | tail -n 30; fi
timing "container start -> /ready" $((SECONDS - t))
req POST "$URL/v1/embeddings" '{"input": ["A man is playing a guitar.", "A woman is slicing an onion."]}' "${AUTH[@]}"
check "embeds with the key (200, 2 x $(jbody 'len(d["data"][0]["embedding"])' 2>/dev/null) dims, X-Model $(header x-model))" \
  [ "$CODE" = 200 ]
req POST "$URL/v1/embeddings" '{"input": "no key"}'
check "refuses a request without the key (HTTP $CODE)" [ "$CODE" = 401 ]
podman healthcheck run "$CONTAINER" >"$TMP/hc" 2>&1
hc=$?
check "podman healthcheck run: exit $hc ($(podman inspect "$CONTAINER" --format '{{.State.Health.Status}}' 2>/dev/null))" [ "$hc" = 0 ]
req GET "$URL/console/"
check "console served without a key (HTTP $CODE)" [ "$CODE" = 200 ]
podman rm -f -v "$CONTAINER" >/dev/null 2>>"$TMP/podman.err"

# --- 3. the Compose stack -----------------------------------------------------------------------------------------
GRAFANA_IMAGE=$(sed -n 's/^[[:space:]]*image:[[:space:]]*\(grafana\/[^[:space:]]*\).*/\1/p' docker/docker-compose.yml)
SERVICES=(embed prometheus)
if podman image exists "$GRAFANA_IMAGE"; then
  SERVICES+=(grafana)
else
  RESULTS+=("SKIP  grafana: image $GRAFANA_IMAGE is not in local storage and no registry is reachable")
fi
t=$SECONDS
compose down -v >/dev/null 2>&1
compose up -d "${SERVICES[@]}" >"$TMP/up.log" 2>&1 || { tail -n 30 "$TMP/up.log"; fail "compose up"; }
URL=http://127.0.0.1:$EMBED_PUBLISH_PORT
PROM=http://127.0.0.1:$PROMETHEUS_PORT
if wait_ready "$URL" 180; then pass "compose: embed /ready"; else fail "compose: embed /ready"; compose logs embed | tail -n 30; fi
timing "compose up -> embed /ready" $((SECONDS - t))
EMBED=$(embed_container)

up=""
t=$SECONDS
while [ $((SECONDS - t)) -lt 120 ]; do
  req GET "$PROM/api/v1/query?query=up%7Bjob%3D%22embed%22%7D"
  up=$(jbody '",".join(r["value"][1] for r in d["data"]["result"])' 2>/dev/null)
  [ "$up" = 1 ] && break
  sleep 2
done
req GET "$PROM/api/v1/targets"
health=$(jbody '",".join(t["labels"]["job"] + "=" + t["health"] for t in d["data"]["activeTargets"])' 2>/dev/null)
check "prometheus: target up (up{job=\"embed\"}=$up; targets: $health)" [ "$up" = 1 ]
timing "prometheus: first successful scrape" $((SECONDS - t))

# traffic: a collection of STS-B test sentences (or a few built-in ones), searches, embeddings, similarity, a 413
python3 - "$TMP" "${SHARED_DATA_DIR:-$ROOT/../shared/data}" <<'PY'
import csv, json, sys
from pathlib import Path
tmp, data = Path(sys.argv[1]), Path(sys.argv[2]) / "sts" / "STSBenchmark" / "sts-test.csv"
sents = []
if data.exists():
    with open(data, encoding="utf-8") as f:
        for row in csv.reader(f, delimiter="\t", quoting=csv.QUOTE_NONE):
            if len(row) >= 7:
                sents += [row[5], row[6]]
sents = list(dict.fromkeys(sents))[:300] or [
    "A man is playing a guitar.", "A woman is slicing an onion.", "A plane is taking off.", "A cat sits on a mat.",
    "Stocks fell sharply after the rate rise.", "A chef is cooking pasta.", "Two dogs run on the beach."]
(tmp / "points.json").write_text(json.dumps({"points": [{"id": i, "text": s, "payload": {"row": i}} for i, s in enumerate(sents)]}))
(tmp / "query.txt").write_text(sents[len(sents) // 2])
(tmp / "n.txt").write_text(str(len(sents)))
(tmp / "big.json").write_text(json.dumps({"input": ["x"] * 513}))
PY
N=$(cat "$TMP/n.txt")
QUERY=$(cat "$TMP/query.txt")
QJSON=$(python3 -c 'import json,sys; print(json.dumps({"query": sys.argv[1], "top_k": 5}))' "$QUERY")
req PUT "$URL/collections/smoke" '{"index": "hnsw", "metric": "cosine"}' "${AUTH[@]}"
check "create collection (HTTP $CODE)" [ "$CODE" = 200 ]
t=$SECONDS
req PUT "$URL/collections/smoke/points" "@$TMP/points.json" "${AUTH[@]}"
check "upsert $N STS-B sentences (HTTP $CODE, $(jbody 'd.get("upserted")' 2>/dev/null) upserted)" [ "$CODE" = 200 ]
timing "upsert $N sentences (embed + durable write)" $((SECONDS - t))
for _ in 1 2 3 4 5 6 7 8; do req POST "$URL/collections/smoke/search" "$QJSON" "${AUTH[@]}"; done
TOP=$(jbody 'd[0]["id"]' 2>/dev/null)
check "search finds the query sentence first (id $TOP, score $(jbody 'round(d[0]["score"], 4)' 2>/dev/null))" \
  [ "$(jbody 'd[0]["text"]' 2>/dev/null)" = "$QUERY" ]
req POST "$URL/collections/smoke/search/batch" "{\"searches\": [$QJSON, $QJSON]}" "${AUTH[@]}"
for _ in 1 2 3; do req POST "$URL/similarity" '{"pairs": [["A cat sits on the mat.", "A cat is sitting on a rug."]]}' "${AUTH[@]}"; done
req POST "$URL/v1/embeddings" "@$TMP/big.json" "${AUTH[@]}"
check "513 inputs refused (HTTP $CODE)" [ "$CODE" = 413 ]
log "waiting 40 s: two more scrapes, so rate() over 1m has samples after the traffic"
sleep 40

# every dashboard expression against Prometheus
python3 docker/grafana/exprs.py >"$TMP/exprs.jsonl"
: >"$TMP/expr_results"  # status <TAB> series <TAB> panel [ref]
while IFS= read -r line; do
  expr=$(python3 -c 'import json,sys; print(json.loads(sys.argv[1])["expr"])' "$line")
  title=$(python3 -c 'import json,sys; e=json.loads(sys.argv[1]); print(e["panel"] + " [" + e["ref"] + "]")' "$line")
  curl -sS -o "$TMP/body" -G --data-urlencode "query=$expr" "$PROM/api/v1/query" 2>/dev/null
  st=$(jbody 'd["status"]' 2>/dev/null)
  n=$(jbody 'len(d["data"]["result"])' 2>/dev/null)
  printf '%s\t%s\t%s\n' "${st:-error}" "${n:-0}" "$title" >>"$TMP/expr_results"
done <"$TMP/exprs.jsonl"
awk -F'\t' '{printf "  %-8s %3s series  %s\n", $1, $2, $3}' "$TMP/expr_results"
n_expr=$(wc -l <"$TMP/expr_results")
n_ok=$(awk -F'\t' '$1=="success"' "$TMP/expr_results" | wc -l)
n_data=$(awk -F'\t' '$1=="success" && $2>0' "$TMP/expr_results" | wc -l)
check "dashboard: all $n_expr PromQL expressions run on Prometheus ($n_ok succeeded, $n_data returned series)" \
  [ "$n_ok" = "$n_expr" ]
for must in "Request rate by route [A]" "Latency p50 / p99 by route [B]" "Points per collection [A]" \
  "Search latency p50 / p99 by index type [B]" "Active model [A]" "Queue depth [A]" \
  "Inference time per batch p50 / p99 [B]" "Snapshot age / writes since snapshot [A]"; do
  check "dashboard: '$must' has data" \
    awk -F'\t' -v t="$must" '$3==t && $1=="success" && $2>0 {found=1} END {exit !found}' "$TMP/expr_results"
done

# hot-swap: publish a new model version into the mounted models volume, activate it through the admin API
VOL=$(podman volume inspect "${PROJECT}_models" --format '{{.Mountpoint}}')
DEST="$VOL/$NEW_MODEL/2"
mkdir -p "$DEST"
for f in models/"$MODEL"/*; do [ "$(basename "$f")" = manifest.json ] || cp "$f" "$DEST/"; done
python3 - "models/$MODEL/manifest.json" "$DEST/manifest.json" "$NEW_MODEL" <<'PY'
import json, os, sys
m = json.load(open(sys.argv[1]))
m.update(name=sys.argv[3], version="2")
tmp = sys.argv[2] + ".tmp"
with open(tmp, "w") as f:
    json.dump(m, f, indent=2)
    f.flush(); os.fsync(f.fileno())
os.replace(tmp, sys.argv[2])  # the manifest last: the artifact is complete once it appears
PY
chown -R --reference="$VOL" "$VOL/$NEW_MODEL"
check "published $NEW_MODEL:2 into the models volume ($VOL)" [ -f "$DEST/manifest.json" ]
req POST "$URL/admin/models/reload" "" "${AUTH[@]}"
t=$SECONDS
req POST "$URL/admin/models/$NEW_MODEL/activate" '{"version": "2"}' "${AUTH[@]}"
check "activate $NEW_MODEL:2 via /admin (HTTP $CODE)" [ "$CODE" = 200 ]
timing "activate (load + warm-up + canary)" $((SECONDS - t))
req POST "$URL/v1/embeddings" '{"input": "A man is playing a guitar."}' "${AUTH[@]}"
check "requests answered by the new model (X-Model $(header x-model))" [ "$(header x-model)" = "$NEW_MODEL:2" ]
t=$SECONDS
state=""
while [ $((SECONDS - t)) -lt 300 ]; do
  req GET "$URL/collections/smoke" "" "${AUTH[@]}"
  state=$(jbody '(d["reembedding"] or {}).get("state")' 2>/dev/null)
  [ "$state" = completed ] || [ "$state" = failed ] && break
  sleep 1
done
check "collection re-embedded with $NEW_MODEL:2 (state $state, model $(jbody 'd["model"]["name"] + ":" + d["model"]["version"]' 2>/dev/null))" \
  [ "$state" = completed ]
timing "re-embed $N points" $((SECONDS - t))
RE_EXPR=$(python3 -c 'import json,sys; print(next(json.loads(l)["expr"] for l in open(sys.argv[1]) if json.loads(l)["panel"] == "Re-embedding progress"))' "$TMP/exprs.jsonl")
log "waiting 20 s for a scrape after the re-embedding"
sleep 20
curl -sS -o "$TMP/body" -G --data-urlencode "query=$RE_EXPR" "$PROM/api/v1/query" 2>/dev/null
progress=$(jbody '",".join(r["metric"]["collection"] + "=" + r["value"][1] for r in d["data"]["result"])' 2>/dev/null)
check "dashboard: re-embedding progress after the swap ($progress)" [ "$progress" = "smoke=1" ]

# persistence: compose down (volumes kept) and up again
req GET "$URL/collections/smoke" "" "${AUTH[@]}"
COUNT=$(jbody 'd["count"]' 2>/dev/null)
t=$SECONDS
compose down >"$TMP/down1.log" 2>&1 || { tail -n 20 "$TMP/down1.log"; fail "compose down"; }
compose up -d "${SERVICES[@]}" >"$TMP/up2.log" 2>&1 || { tail -n 20 "$TMP/up2.log"; fail "compose up (again)"; }
if wait_ready "$URL" 180; then pass "compose down/up: embed /ready again"; else fail "compose down/up: embed /ready again"; fi
timing "compose down + up -> /ready" $((SECONDS - t))
req GET "$URL/collections/smoke" "" "${AUTH[@]}"
after=$(jbody 'd["count"]' 2>/dev/null)
check "collection survived down/up (HTTP $CODE, $after points, was $COUNT)" [ "$CODE:$after" = "200:$COUNT" ]
req POST "$URL/collections/smoke/search" "$QJSON" "${AUTH[@]}"
check "search after restart: same first hit (id $(jbody 'd[0]["id"]' 2>/dev/null))" [ "$(jbody 'd[0]["id"]' 2>/dev/null)" = "$TOP" ]
req POST "$URL/v1/embeddings" '{"input": "still there?"}' "${AUTH[@]}"
check "active model survived down/up (X-Model $(header x-model))" [ "$(header x-model)" = "$NEW_MODEL:2" ]

summary
exit $FAILED
