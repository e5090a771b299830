# Part 4 of docker/smoke.sh, sourced by it (its functions, variables and teardown apply): the scale-out stack,
# docker-compose.yml + docker-compose.scale.yml with 2 replicas of `embed` on the milvus backend, nginx and Milvus.
# shellcheck shell=bash disable=SC2154

log "== part 4: the scale-out stack (2 replicas, nginx, Milvus)"

# --- nginx: the image the compose file names if it is in local storage, else a stand-in from Debian's package ----
STANDIN_LABEL=redundancy-embed.stand-in
standin_of() { podman image inspect "$1" --format "{{index .Labels \"$STANDIN_LABEL\"}}" 2>/dev/null; }
if podman image exists "$NGINX_IMAGE" && [ -z "$(standin_of "$NGINX_IMAGE")" ]; then
  note "nginx: the image $NGINX_IMAGE from local storage"
elif podman image exists "$NGINX_IMAGE"; then
  v=$(podman run --rm --entrypoint nginx "$NGINX_IMAGE" -v 2>&1 | sed -n 's/.*nginx\///p')
  note "nginx: $NGINX_IMAGE cannot be pulled here; the stand-in an earlier run built: $(standin_of "$NGINX_IMAGE") (nginx $v)"
else
  t=$SECONDS
  mkdir -p "$TMP/nginx-standin"
  cat >"$TMP/nginx-standin/docker-entrypoint.sh" <<'SH'
#!/bin/sh
# What the official nginx image's entrypoint does with the project's files: source the executable
# /docker-entrypoint.d/*.envsh, then render /etc/nginx/templates/*.template into /etc/nginx/conf.d/ by envsubst,
# for the variables defined in the environment only.
set -eu
for f in $(find /docker-entrypoint.d/ -follow -type f -name '*.envsh' 2>/dev/null | sort -V); do
  if [ -x "$f" ]; then echo "$0: sourcing $f"; . "$f"; else echo "$0: ignoring $f, not executable"; fi
done
defined=$(env | sed -n 's/^\([A-Za-z_][A-Za-z0-9_]*\)=.*/${\1}/p' | tr '\n' ' ')
for t in /etc/nginx/templates/*.template; do
  [ -f "$t" ] || continue
  envsubst "$defined" <"$t" >"/etc/nginx/conf.d/$(basename "$t" .template)"
  echo "$0: rendered $t"
done
exec "$@"
SH
  cat >"$TMP/nginx-standin/Containerfile" <<'CF'
FROM localhost/debian:bookworm
ARG STANDIN=""
LABEL redundancy-embed.stand-in="${STANDIN}"
RUN apt-get update && apt-get install -y --no-install-recommends nginx curl gettext-base \
 && rm -rf /var/lib/apt/lists/* /etc/nginx/sites-enabled/default \
 && ln -sf /dev/stdout /var/log/nginx/access.log && ln -sf /dev/stderr /var/log/nginx/error.log \
 && mkdir -p /etc/nginx/templates /docker-entrypoint.d
COPY docker-entrypoint.sh /docker-entrypoint.sh
RUN chmod 755 /docker-entrypoint.sh
ENTRYPOINT ["/docker-entrypoint.sh"]
STOPSIGNAL SIGQUIT
CMD ["nginx", "-g", "daemon off;"]
CF
  case "$NGINX_IMAGE" in */*) ref=docker.io/$NGINX_IMAGE ;; *) ref=docker.io/library/$NGINX_IMAGE ;; esac
  what="Debian bookworm's nginx package on localhost/debian:bookworm, tagged $ref"
  if podman build -q --network host --build-arg "STANDIN=$what" -t "$ref" "$TMP/nginx-standin" \
    >"$TMP/nginx-build.log" 2>&1; then
    v=$(podman run --rm --entrypoint nginx "$ref" -v 2>&1 | sed -n 's/.*nginx\///p')
    note "nginx: $NGINX_IMAGE cannot be pulled here; a stand-in built now: $what (nginx $v)"
    timing "build the nginx stand-in (Debian's package)" $((SECONDS - t))
  else
    tail -n 20 "$TMP/nginx-build.log"
    fail "nginx stand-in builds"
  fi
fi

milvus_healthy() {  # TIMING-LABEL: polls Milvus's health check (podman runs none by itself here)
  local c t0=$SECONDS
  c=$(project_containers "$PROJECT_SCALE" | grep -E '[_-]milvus[_-]1$' | head -n1)
  while [ $((SECONDS - t0)) -lt 300 ]; do
    podman healthcheck run "$c" >/dev/null 2>&1 && { timing "$1" $((SECONDS - t)); return 0; }
    sleep 1
  done
  fail "$1: not healthy after 300 s"
}

# --- up: a versioned models directory (models/<name>/<version>/) shared by the replicas ------------------------
V1=$(python3 -c "import json; print(json.load(open('models/$MODEL/manifest.json'))['version'])")
V2=$((V1 + 1))
mkdir -p "$MODELS_SCALE/$MODEL" && cp -r "models/$MODEL" "$MODELS_SCALE/$MODEL/$V1"
SCALE_SERVICES=(milvus embed nginx prometheus)
podman image exists "$GRAFANA_IMAGE" && SCALE_SERVICES+=(grafana)
SURL=http://127.0.0.1:$SCALE_PORT
SPROM=http://127.0.0.1:$SCALE_PROMETHEUS_PORT
t=$SECONDS
scale down -v >/dev/null 2>&1
scale up -d "${SCALE_SERVICES[@]}" >"$TMP/scale-up.log" 2>&1 || { tail -n 30 "$TMP/scale-up.log"; fail "scale: compose up"; }
milvus_healthy "scale: up -> Milvus healthy (new volume)"
if wait_ready "$SURL" 300; then pass "scale: /ready through nginx"; else fail "scale: /ready through nginx"; scale logs | tail -n 40; fi
timing "scale: up (Milvus, 2 replicas, nginx) -> /ready through nginx" $((SECONDS - t))
mapfile -t REPS < <(replicas)
check "scale: 2 replicas of embed running (${REPS[*]})" [ "${#REPS[@]}" = 2 ]
declare -A HOST_OF
ready=0
for c in "${REPS[@]}"; do
  HOST_OF[$c]=$(podman inspect "$c" --format '{{.Config.Hostname}}')
  for _ in $(seq 1 120); do podman exec "$c" python -m service.healthcheck >/dev/null 2>&1 && { ready=$((ready + 1)); break; }; sleep 1; done
done
check "scale: both replicas ready ($ready of ${#REPS[@]}; hostnames ${HOST_OF[*]})" [ "$ready" = 2 ]
timing "scale: up -> both replicas ready" $((SECONDS - t))
restarts() {  # WHEN: a note with each container's restart count
  local r c
  r="milvus=$(podman inspect "$(project_containers "$PROJECT_SCALE" | grep -E '[_-]milvus[_-]1$' | head -n1)" \
    --format '{{.RestartCount}}' 2>/dev/null)"
  for c in $(replicas); do r+=", embed_${c##*[_-]embed[_-]}=$(podman inspect "$c" --format '{{.RestartCount}}')"; done
  if echo "$r" | grep -qE '=[1-9]'; then
    note "scale: restarts $1 ($r): podman-compose starts the replicas without waiting for Milvus's health check (it ignores depends_on's condition); a replica that cannot reach Milvus exits and its restart policy starts it again"
  else
    note "scale: no container restarted $1 ($r)"
  fi
}
restarts "during start-up"

spread() {  # N METHOD PATH [JSON] through nginx -> X-Replica of each 200 in $TMP/seen, their count in $OK
  : >"$TMP/seen"
  OK=0
  for _ in $(seq 1 "$1"); do
    req "$2" "$SURL$3" "${4:-}" "${AUTH[@]}"
    [ "$CODE" = 200 ] && { OK=$((OK + 1)); header x-replica >>"$TMP/seen"; }
  done
  DIST=$(sort "$TMP/seen" | uniq -c | awk '{printf "%s%s x%s", s, $2, $1; s=", "}')
}
both=$(for c in "${REPS[@]}"; do echo "${HOST_OF[$c]}"; done | sort | tr '\n' ' ')
spread 20 GET /v1/models
check "scale: 20 requests through nginx reach both replicas ($OK answered; X-Replica: $DIST)" \
  [ "$OK:$(sort -u "$TMP/seen" | tr '\n' ' ')" = "20:$both" ]

# --- a collection written through nginx, read through each replica directly --------------------------------------
req PUT "$SURL/collections/smoke" '{"index": "hnsw", "metric": "cosine"}' "${AUTH[@]}"
check "scale: create collection through nginx (HTTP $CODE, by $(header x-replica))" [ "$CODE" = 200 ]
t=$SECONDS
req PUT "$SURL/collections/smoke/points" "@$TMP/points.json" "${AUTH[@]}"
check "scale: upsert $N STS-B sentences through nginx (HTTP $CODE, $(jbody 'd.get("upserted")' 2>/dev/null) upserted, by $(header x-replica))" \
  [ "$CODE" = 200 ]
timing "scale: upsert $N sentences into Milvus" $((SECONDS - t))
req POST "$SURL/collections/smoke/search" "$QJSON" "${AUTH[@]}"
STOP=$(jbody 'd[0]["id"]' 2>/dev/null)
check "scale: search through nginx finds the query sentence first (id $STOP)" [ "$(jbody 'd[0]["text"]' 2>/dev/null)" = "$QUERY" ]
PROBE=$(cat "$TMP/probe.txt")
for c in "${REPS[@]}"; do
  rreq "$c" GET /collections/smoke/points/17
  check "scale: point 17 read through replica ${HOST_OF[$c]} directly (HTTP $CODE, X-Replica $(header x-replica))" \
    [ "$CODE:$(jbody 'd["text"]' 2>/dev/null)" = "200:$PROBE" ]
  rreq "$c" POST /collections/smoke/search "$QJSON"
  check "scale: search through replica ${HOST_OF[$c]} directly: same first hit (id $(jbody 'd[0]["id"]' 2>/dev/null))" \
    [ "$(jbody 'd[0]["id"]' 2>/dev/null)" = "$STOP" ]
done

# --- Prometheus: every replica scraped; the dashboard counts the shared collection once -------------------------
t=$SECONDS
n=""
while [ $((SECONDS - t)) -lt 120 ]; do
  prom_query "$SPROM" 'count(up{job="embed"} == 1)'
  n=$(jbody 'd["data"]["result"][0]["value"][1]' 2>/dev/null)
  [ "$n" = 2 ] && break
  sleep 2
done
prom_query "$SPROM" 'up{job="embed"}'
check "scale: prometheus scrapes both replicas (targets up: $(jbody '", ".join(r["metric"]["instance"] + "=" + r["value"][1] for r in d["data"]["result"])' 2>/dev/null))" \
  [ "$n" = 2 ]
POINTS_EXPR=$(python3 -c 'import json,sys; print(next(json.loads(l)["expr"] for l in open(sys.argv[1]) if json.loads(l)["panel"] == "Points per collection"))' "$TMP/exprs.jsonl")
pts=""
per=""
t=$SECONDS
while [ $((SECONDS - t)) -lt 90 ]; do  # until both replicas have been scraped since the upsert
  prom_query "$SPROM" 'embed_collection_points{collection="smoke"}'
  per=$(jbody '", ".join(r["metric"]["instance"] + "=" + r["value"][1] for r in d["data"]["result"])' 2>/dev/null)
  [ "$(echo "$per" | grep -o "=$N" | wc -l)" = 2 ] && break
  sleep 3
done
prom_query "$SPROM" "$POINTS_EXPR"
pts=$(jbody '",".join(r["value"][1] for r in d["data"]["result"] if r["metric"]["collection"] == "smoke")' 2>/dev/null)
check "scale: dashboard 'Points per collection' = $pts, expected $N (each replica reports the shared collection: $per)" \
  [ "$pts:$(echo "$per" | grep -o "=$N" | wc -l)" = "$N:2" ]

# --- a stopped replica is routed around; restarted, it is found again by DNS -------------------------------------
DOWN=${REPS[0]}
UPC=${REPS[1]}
podman stop -t 10 "$DOWN" >/dev/null 2>>"$TMP/podman.err"
spread 20 POST /v1/embeddings '{"input": "Is the other replica there?"}'
check "scale: replica ${HOST_OF[$DOWN]} stopped: 20 requests through nginx, $OK answered, by $DIST" \
  [ "$OK:$(sort -u "$TMP/seen")" = "20:${HOST_OF[$UPC]}" ]
t=$SECONDS
podman start "$DOWN" >/dev/null 2>>"$TMP/podman.err"
for _ in $(seq 1 120); do podman exec "$DOWN" python -m service.healthcheck >/dev/null 2>&1 && break; sleep 1; done
sleep 6  # nginx caches the DNS answer 5 s
spread 20 GET /v1/models
check "scale: replica restarted (ready in $((SECONDS - t - 6)) s): requests reach both again ($DIST)" \
  [ "$OK:$(sort -u "$TMP/seen" | tr '\n' ' ')" = "20:$both" ]

# --- a new model version in the shared models directory: both replicas switch, one re-embeds -----------------
t=$SECONDS
publish "$MODELS_SCALE/$MODEL/$V1" "$MODELS_SCALE" "$MODEL" "$V2"
log "published $MODEL:$V2 into the shared models directory; waiting for both replicas (model control: poll)"
switched=0
while [ $((SECONDS - t)) -lt 300 ]; do
  switched=0
  for c in "${REPS[@]}"; do
    rreq "$c" GET /collections/smoke
    [ "$(jbody 'd["model"]["version"] + ":" + str((d.get("reembedding") or {}).get("state"))' 2>/dev/null)" = "$V2:completed" ] &&
      switched=$((switched + 1))
  done
  [ "$switched" = 2 ] && break
  sleep 1
done
timing "scale: publish $MODEL:$V2 -> both replicas see the collection switched" $((SECONDS - t))
info=$(jbody '"count " + str(d["count"]) + ", re-embedded by " + str(d["reembedding"].get("owner")) + " in " + str(d["reembedding"].get("seconds")) + " s"' 2>/dev/null)
check "scale: collection on $MODEL:$V2 through both replicas directly ($switched of 2; $info)" [ "$switched" = 2 ]
models=""
for c in "${REPS[@]}"; do
  rreq "$c" POST /v1/embeddings '{"input": "A man is playing a guitar."}'
  models+="${HOST_OF[$c]}=$(header x-model) "
done
check "scale: both replicas answer with $MODEL:$V2 ($models)" \
  [ "$(echo "$models" | grep -o "=$MODEL:$V2" | wc -l)" = 2 ]
runs=0
who=""
for c in "${REPS[@]}"; do
  k=$(podman logs "$c" 2>&1 | grep -c "collection smoke: re-embedding from $MODEL:$V1 to $MODEL:$V2")
  runs=$((runs + k))
  [ "$k" -gt 0 ] && who+="${HOST_OF[$c]} "
done
check "scale: the re-embedding ran once ($runs run(s), on ${who:-none})" [ "$runs" = 1 ]
req POST "$SURL/collections/smoke/search" "$QJSON" "${AUTH[@]}"
check "scale: search through nginx after the switch finds the query sentence first (id $(jbody 'd[0]["id"]' 2>/dev/null))" \
  [ "$(jbody 'd[0]["text"]' 2>/dev/null)" = "$QUERY" ]
STOP=$(jbody 'd[0]["id"]' 2>/dev/null)

# --- compose down / up: the collection stays (Milvus's named volume) ---------------------------------------------
req GET "$SURL/collections/smoke" "" "${AUTH[@]}"
COUNT=$(jbody 'd["count"]' 2>/dev/null)
t=$SECONDS
scale down >"$TMP/scale-down1.log" 2>&1 || { tail -n 20 "$TMP/scale-down1.log"; fail "scale: compose down"; }
left=$(project_containers "$PROJECT_SCALE" | tr '\n' ' ')
check "scale: compose down removed every container (left: ${left:-none})" [ -z "$left" ]
for c in $left; do podman rm -f "$c" >/dev/null 2>&1; done
check "scale: the Milvus volume ${PROJECT_SCALE}_milvus is kept" podman volume exists "${PROJECT_SCALE}_milvus"
scale up -d "${SCALE_SERVICES[@]}" >"$TMP/scale-up2.log" 2>&1 || { tail -n 20 "$TMP/scale-up2.log"; fail "scale: compose up (again)"; }
milvus_healthy "scale: down + up -> Milvus healthy (existing volume)"
if wait_ready "$SURL" 300; then pass "scale: down/up: /ready through nginx again"; else fail "scale: down/up: /ready through nginx again"; fi
timing "scale: compose down + up -> /ready through nginx" $((SECONDS - t))
restarts "during the restart"
req GET "$SURL/collections/smoke" "" "${AUTH[@]}"
check "scale: collection survived down/up (HTTP $CODE, $(jbody 'd["count"]' 2>/dev/null) points, was $COUNT; model $(jbody 'd["model"]["name"] + ":" + d["model"]["version"]' 2>/dev/null))" \
  [ "$CODE:$(jbody 'd["count"]' 2>/dev/null):$(jbody 'd["model"]["version"]' 2>/dev/null)" = "200:$COUNT:$V2" ]
mapfile -t REPS < <(replicas)
same=0
for c in "${REPS[@]}"; do
  for _ in $(seq 1 120); do podman exec "$c" python -m service.healthcheck >/dev/null 2>&1 && break; sleep 1; done
  rreq "$c" POST /collections/smoke/search "$QJSON"
  [ "$(jbody 'd[0]["id"]' 2>/dev/null)" = "$STOP" ] && same=$((same + 1))
done
check "scale: after down/up, search through each of the ${#REPS[@]} new replicas: same first hit ($same agree)" [ "$same" = 2 ]
