#!/usr/bin/env bash
# SciFact fine-tuning and reranker training on a lent GPU (issue: rerank and domain fine-tuning), after a --training
# kit is stashed (python bench/device/kit.py --training; bench/device/kit.sh stash .device/load-k):
#   bash bench/device/scifact.sh train     install, then both jobs side by side on the one GPU:
#       finetune: bench/quality/scifact_finetune.py, plain and 3R x 5 seeds, 10 runs at once (1 CPU thread each)
#       rerank:   train-reranker with each loss (bce, mnrl, lambda), BM25 + dense negatives, 256 tokens, at once;
#                 then bench/quality/rerank_offline.py: every model on the test claims' cached first stages
#     and packs the logs, the tables and the best reranker by dev nDCG@10 (fp16 parts) into $OUT
#   bash bench/device/scifact.sh encoder   packs the best fine-tuned bi-encoder by dev nDCG@10 into $OUT (a second
#     call, back to back: one call returns at most 64 MiB)
# Expects .device/extra/first_stage.json (bench/quality/rerank_eval.py's cache) carried beside the load.
# SMOKE=1: a few steps on a slice, no install (checks the script here, on the CPU, with the project's venv).
set -u
FT=(); RR=(); RO=()
if [ "${SMOKE:-}" = 1 ]; then
  FT=(--train-arg=--max_steps=2 --train-arg=--data.max_queries=30 --train-arg=--data.max_corpus=200
      --train-arg=--max_seq_length=64 --train-arg=--eval_every=1 --train-arg=--batch_size=8 --seeds 1,2)
  RR=(--max-steps 4 --max-queries 30 --max-corpus 200 --max-seq-length 64 --eval-steps 2); RO=(--max-queries 3 --max-length 64)
fi
OUT=${OUT:-/tmp/scifact-out}
W=${WORK:-/tmp/work}
mkdir -p "$OUT" "$W"
export W
[ "${SMOKE:-}" = 1 ] || export PYTHONPATH=/tmp/site SHARED_DATA_DIR=/tmp/shared/data
export PYTHONUNBUFFERED=1 TOKENIZERS_PARALLELISM=false \
  OMP_NUM_THREADS=1 HF_HUB_OFFLINE=1 JAX_PLATFORMS=cpu XLA_PYTHON_CLIENT_PREALLOCATE=false USE_JAX=0 USE_FLAX=0 USE_TF=0
log() { echo "== $(date -u +%T) $* (load $(cut -d' ' -f1-3 /proc/loadavg))"; }

case ${1:-} in
  train)
    { log install; [ "${SMOKE:-}" = 1 ] || bash bench/device/kit.sh install-training || exit 1
      nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv
      echo "cpus $(getconf _NPROCESSORS_ONLN): $(grep -m1 'model name' /proc/cpuinfo)"
    } 2>&1 | tee "$OUT/session.log"
    ( log finetune
      timeout -s INT 330 python3 -m bench.quality.scifact_finetune --root $W/ft --seeds 1,2,3,4,5 --parallel 10 \
        --train-arg=--threads=1 --train-arg=--eval_batch_size=128 "${FT[@]}" --json $W/finetune.json
      log "finetune done" ) > $W/finetune.log 2>&1 &
    for loss in bce mnrl lambda; do
      case $loss in bce) steps=1600; bs=32 ;; mnrl) steps=500; bs=16 ;; lambda) steps=800; bs=8 ;; esac
      ( log "reranker $loss"
        timeout -s INT 300 python3 -m training train-reranker --output-dir $W/rr-$loss --loss $loss \
          --negatives bm25+dense --max-seq-length 256 --max-steps $steps --batch-size $bs --lr 2e-5 \
          --eval-steps 200 --no-resume "${RR[@]}"
        log "reranker $loss done" ) > $W/rr-$loss.log 2>&1 &
    done
    wait
    log "training done" | tee -a "$OUT/session.log"
    models=(); for loss in bce mnrl lambda; do [ -f $W/rr-$loss/model/done.json ] && models+=(--model $loss=$W/rr-$loss/model); done
    timeout -s INT 120 python3 -m bench.quality.rerank_offline --first-stage .device/extra/first_stage.json "${models[@]}" \
      --batch-size 256 "${RO[@]}" --json $W/rerank_test.json 2>&1 | tee -a "$OUT/session.log"
    best=$(python3 - <<'PY'
import json, os, pathlib
dev = {}
for d in pathlib.Path(os.environ["W"]).glob("rr-*/model/done.json"):
    dev[d.parent.parent.name] = json.loads(d.read_text())["dev"].get("scifact-dev_ndcg@10", -1)
print(max(dev, key=dev.get) if dev else "")
PY
)
    log "best reranker by dev: ${best:-none}" | tee -a "$OUT/session.log"
    [ -n "$best" ] && python3 bench/device/halve.py pack $W/$best/model "$OUT/reranker-$best"
    tar -czf "$OUT/logs.tar.gz" -C $W --exclude='*.safetensors' --exclude='checkpoints' --exclude='best' \
      --exclude='checkpoint' --exclude='*.bin' --exclude='*.pt' . 2>/dev/null
    ls -la "$OUT"
    ;;
  encoder)
    best=$(python3 - <<'PY'
import json, os, pathlib
dev = {}
for r in pathlib.Path(os.environ["W"], "ft").glob("*/results.json"):
    dev[r.parent.name] = next(v for k, v in json.loads(r.read_text())["scores"].items() if k.endswith("-dev-ndcg@10"))
print(max(dev, key=dev.get) if dev else "")
PY
)
    log "best bi-encoder by dev: ${best:-none}"
    [ -n "$best" ] && python3 bench/device/halve.py pack $W/ft/$best/best "$OUT/encoder-$best"
    ls -la "$OUT"
    ;;
  *) echo "usage: $0 train|encoder" >&2; exit 2 ;;
esac
