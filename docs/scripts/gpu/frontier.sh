#!/usr/bin/env bash
# One GPU run for issues 62 (SJD-PAC's trees) and 63 (int8 / int4 weights), the parts of their goals that need a GPU
# (docs/benchmarks-gpu.md, "Not measured yet"). About 9 minutes, each part under its own time limit, in order of what
# matters most, each writing into $OUT as it ends (a part cut at its limit loses only itself):
#   1. Janus-Pro-7B's released shape (random weights, bfloat16, guidance 5, an 8 x 8 grid): transformers' generate and
#      vgen's ar, then every token sampler without a draft in bfloat16 and with int8 weights: seconds per image and
#      the peak of CUDA's allocator (the goal: int8 within 16 GB). Random weights give near-uniform logits, so the
#      speculative samplers' tokens per pass here say nothing about a trained model's: this part checks that they
#      run, what they hold in memory and what a pass costs;
#   2. pac against compiled AR on photos-t2i at batch 1 and 8: ar, scd and pac's default tree at window 16, and the
#      wide trees that pay only where a pass over hundreds of rows costs about one over a few (at window 32: 64 x 1,
#      the fewest one-token passes; at window 16: 32 x 1 with 10-draft chains on its leaves, a spine and
#      restart=mix, the tree that meets issue 62's ratios to sjd and scd);
#      compiled, paired rounds, tokens per pass in every row;
#   3. LlamaGen-T2I's GPT-XL shape (random weights, bfloat16): eager and CUDA-graph pass cost at 1-128 tokens, in
#      bfloat16 and int8 (the rows a pac pass feeds are its tree's nodes plus one: 3 x 2 at window 16 has 25 nodes,
#      at window 32 41, with a chain after every leaf 273; 64 x 1 at window 32 94; the window-16 tree above 406;
#      guidance doubles the rows; past 128 the shape's cache ends).
# T_PAC / T_JANUS / T_XL: each part's limit in seconds (0 skips it). Needs the wheels in .whl/ (setup.sh) and, for
# the 64 MiB a run may carry, only the zoo folder photos-t2i in the checkout. DEVICE=cpu with SMOKE=1 runs every part
# at toy sizes (a check of the script on a machine without a GPU: no wheels needed, nothing measured).
if [ -n "$SMOKE" ]; then
  set -o pipefail
  export PYTHONUNBUFFERED=1 HYDRA_FULL_ERROR=1 OUT=${OUT:-/tmp/frontier}
  mkdir -p "$OUT"
  part() { local name=$1 limit=$2; shift 2; echo "== $name"; [ "$limit" -gt 0 ] || { echo "(skipped)"; return 0; }; timeout "$limit" "$@"; echo "== $name ended: rc $?"; }
else
  source docs/scripts/gpu/setup.sh
  echo "commit $(git rev-parse --short HEAD 2>/dev/null)" >> $OUT/gpu.txt
fi
DEVICE=${DEVICE:-cuda}
if [ -n "$SMOKE" ]; then  # toy sizes: the same commands, seconds each
  PAC_BATCHES='[1]' PAC_SAMPLES=1 PAC_REPEATS=1 PAC_COMPILE=false
  PAC_SAMPLERS='[ar,"pac:window=4,tree_width=2,tree_depth=1"]'
  JANUS="hf_cpu_models=[janus-cpu] hf_grid=2" JANUS_SAMPLERS='["sjd:window=2"]'
  XL=cpu-S WIDTHS='[1,2]'
fi

part "janus-pro-7b: bfloat16 and int8" "${T_JANUS:-180}" python3 -m vgen bench +experiment=transformers \
  device=$DEVICE ${JANUS:-hf_models=[janus-pro-7b] hf_grid=8} hf_quantize=[int8] hf_batch_sizes=[1] hf_repeats=1 \
  hf_warmup=true hf_zoo_models=[] models=[photos-t2i] 'samplers=["ar:compile=false"]' batch_sizes=[1] num_samples=1 \
  outdir=/tmp/janus \
  "hf_shape_samplers=${JANUS_SAMPLERS:-[\"sjd:window=8\",\"scd:window=8\",\"gsd:window=8\",\"lantern:window=8\",\"zipar:window=4\",\"pac:window=16\"]}" \
  2>&1 | grep -v Warning | tail -n 24 | tee $OUT/janus.log
cp /tmp/janus/bench.json $OUT/janus.json 2>/dev/null

part "pac on photos-t2i" "${T_PAC:-270}" python3 -m vgen bench device=$DEVICE models=[photos-t2i] \
  compile=${PAC_COMPILE:-true} num_samples=${PAC_SAMPLES:-8} repeats=${PAC_REPEATS:-3} \
  batch_sizes=${PAC_BATCHES:-[1,8]} baseline=false fid_samples=0 outdir=/tmp/pac \
  "samplers=${PAC_SAMPLERS:-[ar,\"scd:window=16\",\"pac:window=16\",\"pac:window=32,tree_width=64,tree_depth=1\",\"pac:window=16,tree_width=32,tree_depth=1,chains=leaves,leaf_chain=10,spine=2,spine_chain=3,restart=mix\"]}" \
  2>&1 | grep -v Warning | tail -n 20 | tee $OUT/pac.log
cp /tmp/pac/bench.json $OUT/pac.json 2>/dev/null

part "XL-t2i pass cost: bfloat16 and int8" "${T_XL:-120}" python3 -c "
import copy, json, os, torch
from vgen import validate
from vgen.eval import shapes
from vgen.kernels.quant import quantize_model, weight_bytes
device = validate.device('$DEVICE')
dtype = torch.bfloat16 if device.type == 'cuda' else torch.float32
widths = json.loads('${WIDTHS:-[1,2,4,8,16,32,64,96,128]}')
out, path = {'device': str(device), 'shape': '${XL:-XL-t2i}', 'widths': widths}, os.environ['OUT'] + '/xl.json'
model = shapes.build_shape('${XL:-XL-t2i}', dtype, device)
for fmt in ('bfloat16' if device.type == 'cuda' else 'float32', 'int8'):
    if fmt == 'int8':
        model = copy.deepcopy(model); quantize_model(model, 'int8')
    e = out[fmt] = {'weight_mb': weight_bytes(model) / 2 ** 20, 'eager_s': shapes.pass_cost(model, widths, 3)}
    if device.type == 'cuda':
        e['graphed_s'] = shapes.pass_cost_graphed(model, widths, 3)
    json.dump(out, open(path, 'w'), indent=1)
    for k in ('eager_s', 'graphed_s'):
        if k in e:
            print(fmt, k, ' '.join(f'{w}:{1e3 * s:.2f}ms' for w, s in e[k].items()))
" 2>&1 | grep -v Warning | tail -n 8
echo "== end: $(date +%T)"
