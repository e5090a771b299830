#!/usr/bin/env bash
# The device side of bench/device/kit.py (run on the lent GPU machine, from the repository root).
#   bash bench/device/kit.sh stash .device/load-3   # copy a carried load into /tmp/kit (kept while it stays warm)
#   bash bench/device/kit.sh verify                 # reassemble + sha256-check every file (also runs here)
#   bash bench/device/kit.sh install                # verify, install, check CUDA (and a peer's wheels: /tmp/peer-NAME)
#   bash bench/device/kit.sh install-training       # a --training kit: verify, install, check torch on CUDA
# `install` puts the wheels in /tmp/site, the artifacts in models/, the data in /tmp/shared/data (use: export
# PYTHONPATH=/tmp/site SHARED_DATA_DIR=/tmp/shared/data), and prints
# onnxruntime's version and providers, the CUDA libraries its CUDA provider links (readelf) and the driver's CUDA
# version (nvidia-smi); it fails when a part is missing, a checksum differs, the CUDA majors differ or the service's
# loader cannot open the default artifact on CUDA.
set -euo pipefail
KIT=${KIT_DIR:-/tmp/kit}
case "${1:-}" in
  stash)
    mkdir -p "$KIT"
    cp "$2"/* "$KIT"/
    echo "stashed $2: $(ls "$KIT" | wc -l) files in $KIT, $(du -sh "$KIT" | cut -f1)"
    ;;
  verify|install|install-training)
    python3 - "$KIT" <<'EOF'
import hashlib, json, sys
from pathlib import Path
kit = Path(sys.argv[1])
desc = json.loads((kit / "kit.json").read_text())
for f in desc["files"]:
    parts = [kit / name for _, name in f["parts"]]
    missing = [p.name for p in parts if not p.exists()]
    if missing:
        sys.exit(f"{f['name']}: parts missing {missing} (stash every load first)")
    out = kit / "files" / f["name"]
    out.parent.mkdir(exist_ok=True)
    h = hashlib.sha256()
    with open(out, "wb") as dst:
        for p in parts:
            b = p.read_bytes()
            h.update(b)
            dst.write(b)
    if h.hexdigest() != f["sha256"]:
        sys.exit(f"{f['name']}: sha256 differs")
print(f"reassembled {len(desc['files'])} files")
EOF
    [ "$1" = verify ] && exit 0
    python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target /tmp/site \
      "$KIT"/files/*.whl
    if [ "$1" = install-training ]; then
      mkdir -p /tmp/shared/data && tar -xzf "$KIT"/files/shared-data.tar.gz -C /tmp/shared/data
      PYTHONPATH=/tmp/site python3 -c "
import torch, sentence_transformers as s, transformers as t, datasets, bm25s, training.trainer, training.reranker
from training.st_dir import default_model_dir
print('torch', torch.__version__, 'cuda', torch.cuda.is_available(), torch.cuda.get_device_name(0) if torch.cuda.is_available() else '',
      'sentence-transformers', s.__version__, 'transformers', t.__version__, 'datasets', datasets.__version__, 'encoder', default_model_dir())
"
      exit 0
    fi
    mkdir -p models
    for t in "$KIT"/files/artifact-*.tar; do tar -xf "$t" -C models; done
    mkdir -p /tmp/shared/data && tar -xzf "$KIT"/files/shared-data.tar.gz -C /tmp/shared/data
    # onnxruntime-gpu's CUDA provider links CUDA 13 and loads cuDNN 9; here they come from the machine's nvidia-* pip
    # packages (torch's), not from a system CUDA. The service calls onnxruntime.preload_dlls() (ONNX Runtime docs,
    # "CUDA Execution Provider"), which looks for them in site-packages/nvidia beside the onnxruntime package, i.e.
    # /tmp/site: link the machine's nvidia folder there, so that the service finds them as it would on a plain
    # `pip install onnxruntime-gpu[cuda,cudnn]`
    nv=$(python3 -c 'import importlib.util as u; print(list(u.find_spec("nvidia").submodule_search_locations)[0])')
    ln -sfn "$nv" /tmp/site/nvidia
    echo "linked /tmp/site/nvidia -> $nv ($(ls "$nv" | tr '\n' ' '))"
    export PYTHONPATH=/tmp/site
    python3 -c "import onnxruntime as o; print('onnxruntime', o.__version__, o.get_available_providers())"
    # every module the service imports resolves with the machine's packages + the kit's (a missing dependency of a
    # carried wheel shows here, not in a later call)
    python3 -c "import service.app, service.__main__, bench.serving.gpu_serve, bench.compat.provider_parity, bench.serving.batch_shape_bench, bench.serving.peer_serve; print('service imports: ok')"
    find -L "$nv" \( -name 'libcudart.so.*' -o -name 'libcublas.so.*' -o -name 'libcudnn.so.*' \) 2>/dev/null | sed 's/^/  found /'
    lib=$(find /tmp/site/onnxruntime -name 'libonnxruntime_providers_cuda.so' | head -1)
    need=$( (readelf -d "$lib" 2>/dev/null || true) | grep -o 'libcudart\.so\.[0-9]*' | head -1 || true)
    driver=$(nvidia-smi | grep -o 'CUDA Version: [0-9]*' | grep -o '[0-9]*$')
    echo "CUDA provider links ${need:-? (no readelf)}; the driver supports CUDA $driver"
    [ -z "$need" ] || [ "${need##*.}" = "$driver" ] || { echo "CUDA majors differ" >&2; exit 1; }
    # the real check: the service's own loader opens the default artifact on CUDA (it fails unless CUDA is used)
    python3 -c "
from service.inference.onnx_encoder import OnnxModel
m = OnnxModel('models/all-minilm-l6-v2', providers=['cuda'])
print('service loader: default artifact on', m.providers, 'warm-up', round(m.warm_up(), 2), 's')
"
    # a peer server's wheels (kit.py --with NAME) go into /tmp/peer-NAME, on that server's path only (its pins, e.g.
    # Infinity's numpy<2 and sentence-transformers<4, would break the service and the baseline); its ONNX engine gets
    # the kit's onnxruntime-gpu (a link), the CUDA libraries through LD_LIBRARY_PATH (bench/serving/peer_serve.py).
    # A failure here is reported, not fatal: the service's stages still run
    for t in "$KIT"/files/peer-*.tar; do
      [ -e "$t" ] || continue
      p=/tmp/$(basename "$t" .tar)
      mkdir -p "$p/wheels" && tar -xf "$t" -C "$p/wheels"
      python3 -m pip install -q --no-index --no-deps --no-compile --no-cache-dir --upgrade --target "$p" "$p"/wheels/*.whl \
        && ln -sfn /tmp/site/onnxruntime "$p/onnxruntime" \
        && PYTHONPATH=$p python3 -c "import infinity_emb, sentence_transformers as s, transformers as t, numpy, torch, optimum.onnxruntime; print('peer $p: infinity-emb', infinity_emb.__version__, 'sentence-transformers', s.__version__, 'transformers', t.__version__, 'numpy', numpy.__version__, 'torch', torch.__version__)" \
        || echo "peer $p: install or import check FAILED" >&2
    done
    ;;
  *)
    echo "usage: $0 stash DIR | install" >&2; exit 2
    ;;
esac
