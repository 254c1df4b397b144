#!/usr/bin/env bash
# The GPU half of pdlkit's checks, in one call on a CUDA machine (the lent GPU machine):
# installs pdlkit from a wheel built here and torch-mlir from its carry tarball, runs the
# CUDA tests, then benchmarks/cuda_gemm.py; results land in ${OUT:-benchmarks/results}.
#   here:  pip wheel --no-deps -w .whl . && ../shared/tools/gpu-carry-torch-mlir
#   there: bash benchmarks/run_gpu.sh [--sweep] [--quick]
set -uo pipefail
out=${OUT:-benchmarks/results}
mkdir -p /tmp/site "$out"
tar xJf .carry/torch_mlir-cp312.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/pdlkit-*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
# from a copy of tests/, so that the repo's pdlkit/ folder does not shadow the installed package
rm -rf /tmp/t && mkdir -p /tmp/t && cp -r tests /tmp/t/
(cd /tmp/t && python3 -m pytest -q -p no:cacheprovider tests/test_cuda.py) 2>&1 | tee "$out/cuda_tests.log" | tail -25
(cd /tmp/t && python3 -c "import sys; from pdlkit.cli import main; sys.exit(main())" \
  abi-check /tmp/site/pdlkit/kernels/cuda/gemm.py /tmp/site/pdlkit/kernels/_optin) 2>&1 | tee "$out/cuda_abi_check.log" | tail -4
python3 benchmarks/cuda_gemm.py --out "$out" "$@" 2>&1 | tee "$out/cuda_gemm.log"
