#!/usr/bin/env bash
# Deployment smoke test with podman (not part of CI: it builds images and starts containers; minutes).
#
#   bash ../shared/containers/setup.sh     # on the project's machines: podman + local base images (no registry)
#   make artifact                          # models/all-minilm-l6-v2/, which the containers mount
#   bash docker/smoke.sh                   # SMOKE_NO_CACHE=1 for cold builds; SMOKE_SKIP_SCALE=1 without part 4
#
# 1. builds the CPU image (docker/Dockerfile: the default, model-free target; the `baked` target; EXTRAS=milvus) and
#    the Milvus image (docker/Dockerfile.milvus), prints their sizes above the base (limit for the default image:
#    SMOKE_LIMIT_MB, 300) and the default image's layers, checks that no image holds torch;
# 2. runs the default image on a loopback port with the models directory mounted read-only and an API key: waits
#    for /ready, embeds, `podman healthcheck run`, console;
# 3. brings up the Compose stack (podman-compose; Grafana too when its image is in local storage), checks that
#    Prometheus scrapes the service (target up), sends traffic, runs every PromQL expression of the Grafana
#    dashboard against that Prometheus, hot-swaps a model published into the mounted models directory (admin
#    API), and checks that collections, the new model and the active choice survive `compose down` / `up`;
# 4. brings up the scale-out stack (docker-compose.scale.yml: 2 replicas on the milvus backend, nginx, Milvus;
#    nginx is built locally from Debian's package when its image is not in local storage): /ready through nginx,
#    requests through nginx reach both replicas (X-Replica), a collection created and filled through nginx is read
#    back through each replica directly, Prometheus scrapes both, a stopped replica is routed around, a new model
#    version published into the shared models directory switches both replicas and the collection is re-embedded
#    once, and the collection survives `compose down` / `up` (Milvus's named volume);
# 5. tears everything down (containers, the stacks' volumes; the images stay) and prints each check, the sizes
#    and the timings. Exit status 0 only when every check passed.
set -uo pipefail
cd "$(dirname "$0")/.."
ROOT=$PWD
if [ -z "${CONTAINERS_CONF:-}" ] && [ -f /etc/containers/containers.conf.d-local.conf ]; then
  export CONTAINERS_CONF=/etc/containers/containers.conf.d-local.conf  # written by ../shared/containers/setup.sh
fi
IMAGE=${SMOKE_IMAGE:-redundancy-embed:cpu}
IMAGE_BAKED=${IMAGE}-baked
# the images the scale-out file names (built here under those names, so Compose finds them)
service_image() { awk -v s="  $1:" '$0==s{f=1; next} f && /^  [a-z]/{f=0} f && $1=="image:"{print $2; exit}' docker/docker-compose.scale.yml; }
IMAGE_MILVUS_CLIENT=$(service_image embed)
MILVUS_IMAGE=$(service_image milvus)
NGINX_IMAGE=$(service_image nginx)
BASE=$(awk '/^FROM /{print $2; exit}' docker/Dockerfile)
MODEL=${MODEL:-all-minilm-l6-v2}
LIMIT_MB=${SMOKE_LIMIT_MB:-300}
PORT=${SMOKE_PORT:-18080}
export EMBED_PUBLISH_PORT=${SMOKE_COMPOSE_PORT:-18081}
export PROMETHEUS_PORT=${SMOKE_PROMETHEUS_PORT:-19090}
export GRAFANA_PORT=${SMOKE_GRAFANA_PORT:-13000}
SCALE_PORT=${SMOKE_SCALE_PORT:-18082}
SCALE_PROMETHEUS_PORT=${SMOKE_SCALE_PROMETHEUS_PORT:-19091}
SCALE_GRAFANA_PORT=${SMOKE_SCALE_GRAFANA_PORT:-13001}
EMBED_API_KEYS="smoke-$(python3 -c 'import secrets; print(secrets.token_hex(12))')"
GRAFANA_ADMIN_PASSWORD=$(python3 -c 'import secrets; print(secrets.token_hex(12))')
export EMBED_API_KEYS GRAFANA_ADMIN_PASSWORD
PROJECT=redundancy-embed-smoke
PROJECT_SCALE=redundancy-embed-smoke-scale
CONTAINER=redundancy-embed-smoke
NEW_MODEL=minilm-smoke
TMP=$(mktemp -d)
chmod 755 "$TMP"  # the containers' user (uid 10001) reads the models directories below it
MODELS_SINGLE=$TMP/models-single
MODELS_SCALE=$TMP/models-scale
T_START=$(date +%s)
RESULTS=()
TIMES=()
SIZES=()
FAILED=0
NO_CACHE=()
COLD=""
if [ "${SMOKE_NO_CACHE:-0}" = 1 ]; then NO_CACHE=(--no-cache); COLD=" (cold, --no-cache)"; fi

log() { printf '%s  %s\n' "$(date +%H:%M:%S)" "$*"; }
pass() { RESULTS+=("PASS  $1"); log "PASS  $1"; }
fail() { RESULTS+=("FAIL  $1"); log "FAIL  $1"; FAILED=1; }
note() { RESULTS+=("NOTE  $1"); log "NOTE  $1"; }
check() { local name=$1; shift; if "$@"; then pass "$name"; else fail "$name"; fi; }
timing() { TIMES+=("$(printf '%-66s %5ss' "$1" "$2")"); log "time  $1: $2 s"; }
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

# --- HTTP inside a container, on its own port (a replica directly, not through nginx): same outputs as req
# (the key comes from the container's own EMBED_API_KEYS)
RPY='import json, os, sys, urllib.error, urllib.request
m, path, data = sys.argv[1], sys.argv[2], sys.argv[3]
key = os.environ.get("EMBED_API_KEYS", "").split(",")[0]
r = urllib.request.Request("http://127.0.0.1:8000" + path, method=m, data=data.encode() or None,
                           headers={"Authorization": "Bearer " + key, "Content-Type": "application/json"})
try:
    with urllib.request.urlopen(r, timeout=120) as resp:
        code, body, hdrs = resp.status, resp.read(), resp.headers
except urllib.error.HTTPError as e:
    code, body, hdrs = e.code, e.read(), e.headers
print(json.dumps({"code": code, "headers": "".join(f"{k}: {v}\n" for k, v in hdrs.items()), "body": body.decode()}))'
rreq() {  # CONTAINER METHOD PATH [JSON]
  podman exec "$1" python -c "$RPY" "$2" "$3" "${4:-}" >"$TMP/rout" 2>"$TMP/rerr" || { CODE=000; return; }
  CODE=$(python3 -c "import json; d=json.load(open('$TMP/rout')); open('$TMP/body','w').write(d['body']); \
open('$TMP/hdr','w').write(d['headers']); print(d['code'])" 2>/dev/null) || CODE=000
}

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

prom_query() {  # PROM_URL EXPR -> JSON in $TMP/body
  curl -sS -o "$TMP/body" -G --data-urlencode "query=$2" "$1/api/v1/query" 2>/dev/null
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
compose() { MODELS_HOST_DIR=$MODELS_SINGLE "${PC[@]}" -p "$PROJECT" -f docker/docker-compose.yml "$@"; }
scale() {
  MODELS_HOST_DIR=$MODELS_SCALE EMBED_REPLICAS=2 EMBED_PUBLISH_PORT=$SCALE_PORT PROMETHEUS_PORT=$SCALE_PROMETHEUS_PORT \
    GRAFANA_PORT=$SCALE_GRAFANA_PORT "${PC[@]}" -p "$PROJECT_SCALE" -f docker/docker-compose.yml \
    -f docker/docker-compose.scale.yml "$@"
}
project_containers() { podman ps -a --filter "label=io.podman.compose.project=$1" --format '{{.Names}}'; }
embed_container() { podman ps -a --format '{{.Names}}' | grep -E "^${PROJECT}[_-]embed[_-]1$" | head -n1; }
replicas() { podman ps --filter "label=io.podman.compose.project=$PROJECT_SCALE" \
  --filter "label=io.podman.compose.service=embed" --format '{{.Names}}' | sort; }

teardown() {
  log "teardown"
  podman rm -f -v "$CONTAINER" >/dev/null 2>&1
  compose down -v >"$TMP/down.log" 2>&1 || cat "$TMP/down.log"
  scale down -v >"$TMP/down-scale.log" 2>&1 || cat "$TMP/down-scale.log"
  for p in "$PROJECT" "$PROJECT_SCALE"; do
    for c in $(project_containers "$p"); do podman rm -f -v "$c" >/dev/null 2>&1; done
  done
  for v in models collections prometheus grafana milvus; do
    podman volume rm -f "${PROJECT}_$v" "${PROJECT_SCALE}_$v" >/dev/null 2>&1
  done
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

# --- 1. builds and sizes -------------------------------------------------------------------------------------------
build() {  # LABEL podman-build-arguments... (context: the repository root)
  local label=$1 t=$SECONDS
  shift
  log "building $label"
  if podman build --format docker --network host "${NO_CACHE[@]}" "$@" . >"$TMP/build.log" 2>&1; then
    pass "builds: $label"
  else
    tail -n 40 "$TMP/build.log"
    fail "builds: $label"
    return 1
  fi
  timing "build $label$COLD" $((SECONDS - t))
}
size_above() {  # IMAGE BASE LABEL [layers] -> bytes above the base in $ABOVE; lines for the summary in SIZES
  python3 - "$@" >"$TMP/sizes" <<'PY'
import json, subprocess, sys
image, base, label = sys.argv[1:4]
def run(*a): return subprocess.check_output(["podman", *a], text=True)
def size(i): return int(run("image", "inspect", i, "--format", "{{.Size}}"))
def mb(n): return f"{n / 1e6:.1f} MB"
above = size(image) - size(base)
print(f"SIZE {label} ({image}): {mb(size(image))}, {mb(above)} above its base {base} ({mb(size(base))})")
if len(sys.argv) > 4:
    h_img, h_base = json.loads(run("history", "--format", "json", image)), json.loads(run("history", "--format", "json", base))
    print("SIZE   layers above the base (newest first):")
    for l in h_img[: len(h_img) - len(h_base)]:
        if l["size"]:  # metadata-only steps (ENV, USER, CMD...) are 0 B
            print(f"SIZE   {mb(l['size']):>9}  {' '.join(l['CreatedBy'].split())[:100]}")
print(f"ABOVE {above}")
PY
  while IFS= read -r l; do SIZES+=("$l"); log "$l"; done < <(sed -n 's/^SIZE //p' "$TMP/sizes")
  ABOVE=$(sed -n 's/^ABOVE //p' "$TMP/sizes")
}
no_torch() {  # IMAGE
  podman run --rm --entrypoint python "$1" -c '
import importlib.util, subprocess, sys
bad = [m for m in ("torch", "transformers", "sentence_transformers", "onnxruntime_gpu") if importlib.util.find_spec(m)]
pkgs = subprocess.run([sys.executable, "-m", "pip", "list", "--format=freeze"], capture_output=True, text=True).stdout
bad += [p for p in pkgs.split() if p.lower().startswith(("torch", "nvidia-", "triton"))]
print("forbidden:", bad or "none"); sys.exit(1 if bad else 0)' >"$TMP/notorch" 2>&1
  check "$1 has no torch/CUDA packages ($(tail -n1 "$TMP/notorch"))" grep -q "forbidden: none" "$TMP/notorch"
}

build "CPU image, default target (no model)" -f docker/Dockerfile -t "$IMAGE" || { summary; exit 1; }
size_above "$IMAGE" "$BASE" "default CPU image" layers
ABOVE_DEFAULT=$ABOVE
check "default image $(mb "$ABOVE_DEFAULT") above its base <= $LIMIT_MB MB" [ "$ABOVE_DEFAULT" -le $((LIMIT_MB * 1000000)) ]
models_in_image=$(podman run --rm --entrypoint sh "$IMAGE" -c 'ls -A /models | wc -l' 2>/dev/null)
check "default image holds no model (/models has $models_in_image entries)" [ "$models_in_image" = 0 ]
no_torch "$IMAGE"
if build "CPU image, --target baked (MODEL=$MODEL)" -f docker/Dockerfile --target baked --build-arg "MODEL=$MODEL" \
  -t "$IMAGE_BAKED"; then
  size_above "$IMAGE_BAKED" "$BASE" "baked CPU image"
  note "baked image: $(mb "$ABOVE") above the base = the default image + $(mb $((ABOVE - ABOVE_DEFAULT))) (models/$MODEL)"
  podman run --rm --entrypoint python "$IMAGE_BAKED" -c "from artifact_contract import load_manifest; \
print(load_manifest('/models/$MODEL').name)" >"$TMP/baked" 2>&1
  check "baked image carries models/$MODEL ($(tail -n1 "$TMP/baked"))" [ "$(tail -n1 "$TMP/baked")" = "$MODEL" ]
fi
if build "CPU image, EXTRAS=milvus" -f docker/Dockerfile --build-arg EXTRAS=milvus -t "$IMAGE_MILVUS_CLIENT"; then
  size_above "$IMAGE_MILVUS_CLIENT" "$BASE" "CPU image with the milvus client"
  note "milvus-client image: $(mb "$ABOVE") above the base = the default image + $(mb $((ABOVE - ABOVE_DEFAULT))) ([milvus] extra)"
  podman run --rm --entrypoint python "$IMAGE_MILVUS_CLIENT" -c "import importlib.util, pymilvus; \
print('pymilvus', pymilvus.__version__, 'milvus_lite', 'present' if importlib.util.find_spec('milvus_lite') else 'absent')" \
    >"$TMP/pymilvus" 2>&1
  check "milvus-client image imports pymilvus ($(tail -n1 "$TMP/pymilvus"))" grep -q "milvus_lite absent" "$TMP/pymilvus"
  no_torch "$IMAGE_MILVUS_CLIENT"
fi
if build "Milvus 2.3.5 standalone image (docker/Dockerfile.milvus)" -f docker/Dockerfile.milvus -t "$MILVUS_IMAGE"; then
  size_above "$MILVUS_IMAGE" "$BASE" "Milvus standalone image"
fi

# --- 2. the image alone, models mounted read-only ----------------------------------------------------------------
podman rm -f -v "$CONTAINER" >/dev/null 2>&1
t=$SECONDS
podman run -d --name "$CONTAINER" -p "127.0.0.1:$PORT:8000" -v "$ROOT/models:/models:ro" \
  -e EMBED_API_KEYS="$EMBED_API_KEYS" "$IMAGE" >/dev/null \
  2>>"$TMP/podman.err"  # (podman here warns that it has no systemd for health-check timers)
URL=http://127.0.0.1:$PORT
if wait_ready "$URL" 180; then pass "container (models/ mounted read-only) /ready"; else fail "container /ready"; podman logs "$CONTAINER" | tail -n 30; fi
timing "container start -> /ready" $((SECONDS - t))
req POST "$URL/v1/embeddings" '{"input": ["A man is playing a guitar.", "A woman is slicing an onion."]}' "${AUTH[@]}"
check "embeds with the key (200, 2 x $(jbody 'len(d["data"][0]["embedding"])' 2>/dev/null) dims, X-Model $(header x-model))" \
  [ "$CODE:$(header x-model)" = "200:$MODEL:1" ]
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
mkdir -p "$MODELS_SINGLE" && cp -r "models/$MODEL" "$MODELS_SINGLE/"
t=$SECONDS
compose down -v >/dev/null 2>&1
compose up -d "${SERVICES[@]}" >"$TMP/up.log" 2>&1 || { tail -n 30 "$TMP/up.log"; fail "compose up"; }
URL=http://127.0.0.1:$EMBED_PUBLISH_PORT
PROM=http://127.0.0.1:$PROMETHEUS_PORT
if wait_ready "$URL" 180; then pass "compose: embed /ready"; else fail "compose: embed /ready"; compose logs embed | tail -n 30; fi
timing "compose up -> embed /ready" $((SECONDS - t))

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
check "prometheus: target found by DNS and up (up{job=\"embed\"}=$up; targets: $health)" [ "$up" = 1 ]
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
(tmp / "probe.txt").write_text(sents[17 % len(sents)])
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
  prom_query "$PROM" "$expr"
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

# hot-swap: publish a new model version into the mounted models directory, activate it through the admin API
publish() {  # SRC_DIR MODELS_DIR NAME VERSION: staged under a hidden name, then renamed into place (atomic)
  local stage="$2/.stage-$3-$4"
  mkdir -p "$stage"
  for f in "$1"/*; do [ "$(basename "$f")" = manifest.json ] || cp "$f" "$stage/"; done
  python3 - "$1/manifest.json" "$stage/manifest.json" "$3" "$4" <<'PY'
import json, sys
m = json.load(open(sys.argv[1]))
m.update(name=sys.argv[3], version=sys.argv[4])
json.dump(m, open(sys.argv[2], "w"), indent=2)
PY
  mkdir -p "$2/$3"
  mv "$stage" "$2/$3/$4"
}
publish "models/$MODEL" "$MODELS_SINGLE" "$NEW_MODEL" 2
check "published $NEW_MODEL:2 into the mounted models directory" [ -f "$MODELS_SINGLE/$NEW_MODEL/2/manifest.json" ]
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
prom_query "$PROM" "$RE_EXPR"
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
compose down -v >"$TMP/down2.log" 2>&1  # frees the CPU for part 4

if [ "${SMOKE_SKIP_SCALE:-0}" = 1 ]; then
  RESULTS+=("SKIP  scale-out stack (SMOKE_SKIP_SCALE=1)")
  summary
  exit $FAILED
fi
# shellcheck source=docker/smoke_scale.sh
. docker/smoke_scale.sh
summary
exit $FAILED
