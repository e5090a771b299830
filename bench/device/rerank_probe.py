"""One 100 x 256-token reranker batch on CUDA, without the service: tokenisation, ORT fp32, TF32, fp16."""
import json, time
import numpy as np, onnxruntime as ort
from tokenizers import Tokenizer
ort.preload_dlls()
m = 'models/scifact-reranker-tiny'
tok = Tokenizer.from_file(m + '/tokenizer.json'); tok.enable_truncation(256); tok.enable_padding()
docs = [json.loads(l) for l, _ in zip(open('/tmp/shared/data/beir/scifact/corpus.jsonl'), range(100))]
pairs = [('does the treatment reduce symptoms in patients', d['title'] + ' ' + d['text']) for d in docs]
t = time.perf_counter()
for _ in range(10): enc = tok.encode_batch(pairs)
print('tokenize 100 pairs ms', (time.perf_counter() - t) * 100)
def timed(name, s, feed):
    for _ in range(3): s.run(None, feed)
    t = time.perf_counter()
    for _ in range(20): out = s.run(None, feed)[0]
    print(name, 'ms', round((time.perf_counter() - t) * 50, 2)); return out
s = ort.InferenceSession(m + '/model.onnx', providers=['CUDAExecutionProvider'])
names = [i.name for i in s.get_inputs()]
feed = {'input_ids': np.array([e.ids for e in enc], np.int64), 'attention_mask': np.array([e.attention_mask for e in enc], np.int64)}
if 'token_type_ids' in names: feed['token_type_ids'] = np.array([e.type_ids for e in enc], np.int64)
print(names, feed['input_ids'].shape, s.get_providers())
r1 = timed('fp32', s, feed)
timed('fp32 tf32', ort.InferenceSession(m + '/model.onnx', providers=[('CUDAExecutionProvider', {'use_tf32': 1})]), feed)
try:
    import onnx
    from onnxruntime.transformers.float16 import convert_float_to_float16
    mm = convert_float_to_float16(onnx.load(m + '/model.onnx'), keep_io_types=True)
    r3 = timed('fp16', ort.InferenceSession(mm.SerializeToString(), providers=['CUDAExecutionProvider']), feed)
    print('fp16 max abs diff', float(np.abs(r1 - r3).max()))
except Exception as e:
    print('fp16', repr(e)[:300])
