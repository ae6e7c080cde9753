#!/bin/bash
# One device check: opscope's CUDA side against torch.profiler (../shared/gpu/check_cuda.py),
# then bench/gpu/diag.py (the traces side by side, the memory peak, read-back, store).
# Run from the repo root on a machine with a GPU and torch with CUDA. ../shared does not
# travel to a lent GPU machine: copy the check into .gpu/ (ignored by git) and carry it:
#   mkdir -p .gpu && cp ../shared/gpu/check_cuda.py .gpu/ && bash bench/gpu/run.sh
# Outputs go to $OUT (default ./gpu-out): check.log, diag.log, summary.json, both traces.
OUT=${OUT:-gpu-out}; mkdir -p "$OUT"
CHECK=${CHECK:-.gpu/check_cuda.py}; export CHECK
export PYTHONUNBUFFERED=1 PYTHONPATH=$PWD OPSCOPE_CACHE_DIR=/tmp/opscope-cache
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader
python3 -c "import torch, sys; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'python', sys.version.split()[0])"
python3 -m pip list 2>/dev/null | grep -i -E "^nvidia-cuda-(cupti|runtime|crt|nvcc)" 
ls /usr/local/cuda/include/crt/host_defines.h 2>&1 | tail -1
( time python3 -c "
import opscope.collect.native.build as nb; print('observer', nb.load_native() is not None)
from opscope.collect.native import cupti; print('cupti opts', cupti.build_options()['cflags']); print('lib', cupti.find_library())
print('cupti ext', cupti.load_collector())
" ) 2>&1 | tail -8
mkdir -p /tmp/check
timeout ${CHECK_TIMEOUT:-420} python3 "$CHECK" --out /tmp/check 2>&1 | grep -v -E "^(USDT|STAGE:|\[W)" | tee $OUT/check.log
python3 bench/gpu/diag.py /tmp/check 2>&1 | tee $OUT/diag.log | head -80
cp /tmp/check/summary.json $OUT/ 2>/dev/null
for k in torch opscope; do gzip -c /tmp/check/$k.pt.trace.json > $OUT/$k.trace.json.gz 2>/dev/null; done
ls -la $OUT
