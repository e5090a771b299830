#!/usr/bin/env bash
# The GPU issue's measurements as one prepared script, run on a lent GPU machine after the kit's loads are stashed
# (docs/gpu.md "Order of work"): bash bench/device/session.sh STAGE...
#   install  the kit (bench/device/kit.sh install: wheels, artifacts, data, the CUDA check)
#   info     nvidia-smi's name/driver/memory, versions, cores and load
#   parity   the service on CUDA with the fp32, fp16 and fused fp16 artifacts against the CPU fp32 one (STS-B test)
#   serve    bench/serving/gpu_serve.py: fp16 artifact, GPU-sized batches, 1/8/32/128 clients, sentence-transformers fp16
#   serve4   the same with 4 service processes (--replicas 4) and without the baseline
#   serve-fused, serve4-fused  the serve points on the fused fp16 graph, 1 and 4 processes (no baseline)
#   serve-tok8   4 fronts, the core tokenizing with 8 threads (front tokenization off): the other remedy for its
#            tokenizer bound, beside fronts-tok's runs
#   fronts8  8 fronts (front tokenization on), fronts-tok's points
#   front-inf  8 fronts feeding the core against 8 fronts running the models themselves (--front-inference), twice
#   serve-fi   the serve points (1/32/128 clients) with --front-inference, against sentence-transformers fp16
#   workers2   front-inf's points with the core running 2 inference batches at once (--inference-workers=2), once:
#            against front-inf's false arms (does the host side of one run overlap another's GPU time?)
#            (front-inf, serve-fi, the rerank and swap stages run the GPU deployment's own defaults: the CUDA batch
#            limits by provider, 2 tokenizer threads a model, 8 fronts on 16 cores; the older stages keep GPU_BATCHING)
#   serve-fronts the serve points with one core process and 4 front processes on one port (--api-workers 4): the
#            core's event-loop ms/request and the throughput against serve (1 process) and serve4 (4 replicas)
#   fronts-ab    the short A/B: 32/128 clients, STS-B and 128 tokens, 4 s a point, --api-workers 1 then 4
#   fronts-tok   tokenization in the fronts, A/B: 4 fronts with --front-tokenization false then true, twice
#            (32/128 clients, STS-B and 128 tokens, 4 s a point; tok busy core / fronts in the table)
#   shape    bench/serving/batch_shape_bench.py: run / I/O binding / CUDA graphs by batch shape, three artifacts
#   peer     bench/serving/peer_serve.py: the service (fp16, GPU batching) beside Infinity's torch and ONNX engines on
#            the same GPU and sentence-transformers fp16; 32/128 clients x 3 repeats (needs a kit.py --with infinity kit)
#   peer-torch  the same with Infinity's torch engine only (its ONNX engine runs unfused: ~2 min less)
#   rerank   bench/serving/rerank_serve.py: /rerank of 100 SciFact abstracts (256-token pairs) and a hybrid search
#            (dense + BM25, 100 each, DBSF, top 50 reranked) at 1 and 16 clients (a kit with scifact-reranker-tiny);
#            rerank16: the same with the reranker converted to fp16 on the device; rerank-w1: one service process;
#            rerank-tok4: /rerank only, 4 tokenizer threads a model (GPU_BATCHING's, which the 2026-11-27/28 rows ran)
#   train    bench/serving/swap_bench.py --train: SimCSE + 3R on CUDA published into a serving GPU service (poll mode)
#   swap     bench/serving/swap_bench.py: minilm:1 -> minilm:2 activated under load on the GPU deployment's defaults
#            (8 fronts on 16 cores), 1,000 points re-embedded; swap-fi: the same with --front-inference
# Each stage writes its JSON under $OUT and its output to $OUT/session.log; a stage is stopped by SIGINT at its
# limit (the benches stop the services they started on KeyboardInterrupt), and the next one runs regardless.
set -u
OUT=${OUT:-/tmp/session-out}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site SHARED_DATA_DIR=/tmp/shared/data PYTHONUNBUFFERED=1
# the batch limits a GPU wants (docs/gpu.md step 3: the CPU's 16 inputs / 2048 tokens / 16 overhead tokens are
# CPU measurements); 256 x 128 tokens per batch, and a per-batch cost of 256 padded tokens
GPU_BATCHING=(--server-arg=--max-batch-size=256 --server-arg=--max-batch-tokens=32768
  --server-arg=--batch-overhead-tokens=256 --server-arg=--tokenizer-threads=4)

stage() {  # stage NAME SECONDS COMMAND...
  local name=$1 limit=$2
  shift 2
  echo "== $(date -u +%T) $name (limit ${limit}s; load $(cut -d' ' -f1-3 /proc/loadavg))"
  timeout -s INT -k 15 "$limit" "$@"
  echo "== $(date -u +%T) $name: exit $? (load $(cut -d' ' -f1-3 /proc/loadavg))"
}

ab_fronts() {  # ab_fronts TAG FLAG FRONTS [ARG...]: --FLAG=false then true behind FRONTS fronts, twice (32/128
  local tag=$1 flag=$2 n=$3 rep v  # clients, 4 s a point); ARG...: the service's other arguments (GPU_BATCHING)
  shift 3
  for rep in 1 2; do
    for v in false true; do
      stage "$tag-$v-$rep" 110 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda \
        --peak-tflops 989 "$@" --server-arg=--api-workers=$n --server-arg=--$flag=$v \
        --clients 32,128 --inputs stsb,128 --seconds 4 --warmup 2 --pool 4096 --skip-st \
        --json "$OUT/gpu_serve_${tag}_${v}_$rep.json"
    done
  done
}

for s in "$@"; do
  case $s in
    install) stage install 180 bash bench/device/kit.sh install || exit 1 ;;
    info)
      nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
      nvidia-smi | grep -o 'CUDA Version: [0-9.]*'
      python3 -c "import onnxruntime as o, torch, sentence_transformers as s; print('onnxruntime', o.__version__, o.get_available_providers(), 'torch', torch.__version__, 'sentence-transformers', s.__version__)"
      echo "cpus $(nproc): $(grep -m1 'model name' /proc/cpuinfo)"
      ;;
    parity)
      stage parity 240 python3 -m bench.compat.provider_parity --artifact all-minilm-l6-v2 --artifact all-minilm-l6-v2-fp16 \
        --artifact all-minilm-l6-v2-fp16-fused --providers cuda --expect-provider CUDAExecutionProvider \
        --json "$OUT/parity.json"
      ;;
    serve)
      stage serve 240 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda --peak-tflops 989 \
        "${GPU_BATCHING[@]}" --clients 1,8,32,128 --inputs stsb,128 --seconds 5 --warmup 2 --pool 4096 --json "$OUT/gpu_serve.json"
      ;;
    serve4)
      stage serve4 200 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda --peak-tflops 989 \
        "${GPU_BATCHING[@]}" --replicas 4 --clients 32,128 --inputs stsb,128 --seconds 5 --pool 4096 --skip-st \
        --json "$OUT/gpu_serve_r4.json"
      ;;
    serve-fused|serve4-fused)
      n=1; [ "$s" = serve4-fused ] && n=4
      stage "$s" 150 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16-fused --providers cuda --peak-tflops 989 \
        "${GPU_BATCHING[@]}" --replicas $n --clients 8,32,128 --inputs stsb,128 --seconds 5 --pool 4096 --skip-st \
        --json "$OUT/gpu_serve_fused_r$n.json"
      ;;
    serve-fronts)
      stage serve-fronts 200 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda \
        --peak-tflops 989 "${GPU_BATCHING[@]}" --server-arg=--api-workers=4 --clients 1,8,32,128 --inputs stsb,128 \
        --seconds 5 --pool 4096 --skip-st --json "$OUT/gpu_serve_fronts4.json"
      ;;
    fronts-ab)  # the short A/B of one process against one core + 4 fronts, back to back on the same machine
      for n in 1 4; do
        stage "fronts-ab-$n" 110 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda \
          --peak-tflops 989 "${GPU_BATCHING[@]}" --server-arg=--api-workers=$n --clients 32,128 --inputs stsb,128 \
          --seconds 4 --warmup 2 --pool 4096 --skip-st --json "$OUT/gpu_serve_ab_w$n.json"
      done
      ;;
    fronts-tok)  # does tokenizing in the fronts lift the core's tokenizer bound? alternating, two repeats
      ab_fronts fronttok front-tokenization 4 "${GPU_BATCHING[@]}"
      ;;
    serve-tok8)  # the other remedy for the core's tokenizer bound: 4 fronts, the core tokenizes with 8 threads
      stage serve-tok8 120 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda --peak-tflops 989 \
        "${GPU_BATCHING[@]}" --server-arg=--tokenizer-threads=8 --server-arg=--api-workers=4 \
        --server-arg=--front-tokenization=false --clients 32,128 --inputs stsb,128 --seconds 4 --warmup 2 \
        --pool 4096 --skip-st --json "$OUT/gpu_serve_tok8.json"
      ;;
    fronts8)  # N = 8 fronts (tokenizing in the fronts, the default), the fronts-tok points
      stage fronts8 110 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda \
        --peak-tflops 989 "${GPU_BATCHING[@]}" --server-arg=--api-workers=8 --clients 32,128 --inputs stsb,128 \
        --seconds 4 --warmup 2 --pool 4096 --skip-st --json "$OUT/gpu_serve_fronts8.json"
      ;;
    front-inf)  # the fronts running the models themselves (--front-inference) against 8 fronts feeding the core, A/B x2
      ab_fronts frontinf front-inference 8
      ;;
    serve-fi)  # the serve points with --front-inference and the sentence-transformers baseline in the same run
      stage serve-fi 200 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda \
        --peak-tflops 989 --server-arg=--api-workers=8 --server-arg=--front-inference=true \
        --clients 1,32,128 --inputs stsb,128 --seconds 4 --warmup 2 --pool 4096 --json "$OUT/gpu_serve_fi.json"
      ;;
    workers2)
      stage workers2 110 python3 -m bench.serving.gpu_serve --artifact all-minilm-l6-v2-fp16 --providers cuda \
        --peak-tflops 989 --server-arg=--api-workers=8 --server-arg=--inference-workers=2 --clients 32,128 \
        --inputs stsb,128 --seconds 4 --warmup 2 --pool 4096 --skip-st --json "$OUT/gpu_serve_workers2.json"
      ;;
    shape)
      stage shape 150 python3 -m bench.serving.batch_shape_bench --providers cuda --artifact models/all-minilm-l6-v2-fp16 \
        --artifact models/all-minilm-l6-v2-fp16-fused --artifact models/all-minilm-l6-v2 --rounds 20 \
        --json "$OUT/batch_shape.json"
      ;;
    peer|peer-torch)
      eng=(); [ "$s" = peer-torch ] && eng=(--engine torch)
      stage "$s" 420 python3 -m bench.serving.peer_serve "${eng[@]}" --artifact all-minilm-l6-v2-fp16 --providers cuda \
        "${GPU_BATCHING[@]}" --peer-batch-size 256 --clients 32,128 --inputs stsb,128 --seconds 4 --repeats 3 \
        --warmup 3 --pool 4096 --json "$OUT/peer_serve.json"
      cp /tmp/peer-serve-*/infinity-*.log "$OUT"/ 2>/dev/null
      ;;
    rerank|rerank16|rerank-w1|rerank-tok4)
      dt=(); [ "$s" = rerank16 ] && dt=(--reranker-dtype fp16)
      [ "$s" = rerank-w1 ] && dt=(--server-arg=--api-workers=1)  # one process: no front's proxy hop
      [ "$s" = rerank-tok4 ] && dt=("${GPU_BATCHING[@]}" --skip-hybrid)
      stage "$s" 180 python3 -m bench.serving.rerank_serve --encoder all-minilm-l6-v2-fp16 \
        --reranker scifact-reranker-tiny --providers cuda --seconds 8 --warmup 3 "${dt[@]}" --json "$OUT/$s.json"
      ;;
    swap|swap-fi)
      extra=(); [ "$s" = swap-fi ] && extra=(--server-arg=--front-inference=true)
      stage "$s" 120 python3 -m bench.serving.swap_bench --server-arg=--providers=cuda "${extra[@]}" --clients 16 \
        --batch 32 --points 1000 --seconds 6 --json "$OUT/$s.json"
      ;;
    train)
      stage train 240 python3 -m bench.serving.swap_bench --train configs/simcse_3r.yaml --train-arg=--max_steps=300 \
        --train-arg=--device=cuda --server-arg=--providers=cuda --points 1000 --seconds 8 --json "$OUT/swap_train.json"
      ;;
    *) echo "unknown stage $s" >&2 ;;
  esac
done 2>&1 | tee -a "$OUT/session.log"
