#!/usr/bin/env bash
# The GPU half of pdlkit's checks on a CUDA machine (the lent GPU machine): installs pdlkit
# and any other carried wheels from .whl/ and torch-mlir from its carry tarball, then runs the
# parts named (all of tests, abi-check and gemm when none is; abi-check: every CUDA kernel file and
# the opt-in ones, about 80 s on an H200); logs land in ${OUT:-benchmarks/results}.
#   here:  pip wheel --no-deps -w .whl . && ../shared/tools/gpu-carry-torch-mlir
#   there: bash benchmarks/run_gpu.sh [tests [test files] [pytest args]] [abi] [gemm [--sweep] [--quick]]
#                                      [decode [--sweep]] [weightonly [--sweep]] [llama [cuda_llama.py args]]
#                                      [step [cuda_step_kernels.py args]] [attention [cuda_attention.py args]]
#                                      [growing [cuda_growing_cache.py args]]
# Each part's arguments follow its name up to the next part's name.
set -uo pipefail
out=${OUT:-benchmarks/results}
mkdir -p /tmp/site "$out"
[ -d /tmp/site/torch_mlir ] || tar xJf .carry/torch_mlir-cp312.tar.xz -C /tmp/site
python3 -m pip install -q --no-index --no-deps --no-compile --upgrade --target /tmp/site .whl/*.whl
export PYTHONPATH=/tmp/site:${PYTHONPATH:-} PYTHONUNBUFFERED=1
nvidia-smi --query-gpu=name,driver_version,clocks.sm,clocks.max.sm --format=csv,noheader
# from copies of tests/ and benchmarks/, so that the repo's pdlkit/ folder does not shadow the
# installed package
rm -rf /tmp/t && mkdir -p /tmp/t && cp -r tests benchmarks /tmp/t/

# The GPU suite: about 10 minutes on an H200, more than one device call allows; run it as
# two calls, e.g. `tests tests/test_cuda.py tests/test_cuda_launch.py tests/test_cuda_timing.py
# tests/test_cuda_graphs.py` and then `tests` with the other four files
CUDA_TESTS=(tests/test_cuda.py tests/test_cuda_launch.py tests/test_cuda_timing.py
  tests/test_cuda_graphs.py tests/test_cuda_fusions.py tests/test_cuda_splitk.py
  tests/test_cuda_attention.py tests/test_cuda_attention_growing.py tests/test_cuda_torchao.py)
parts=() ; declare -A args
[ $# -eq 0 ] && set -- tests abi gemm
part=""
for a in "$@"; do
  case "$a" in
    tests|abi|gemm|decode|weightonly|llama|step|attention|growing) part=$a; parts+=("$a"); args[$a]="" ;;
    *) args[$part]+=" $(printf %q "$a")" ;;
  esac
done

for p in "${parts[@]}"; do
  case "$p" in
    tests) files=${CUDA_TESTS[*]}  # test files named after "tests" replace the list
      [[ "${args[tests]}" == *tests/* ]] && files=""
      (cd /tmp/t && eval python3 -m pytest -q -p no:cacheprovider $files ${args[tests]}) 2>&1 \
        | tee "$out/cuda_tests.log" | tail -25 ;;
    abi) (cd /tmp/t && python3 -c "import sys; from pdlkit.cli import main; sys.exit(main())" \
            abi-check /tmp/site/pdlkit/kernels/cuda /tmp/site/pdlkit/kernels/_optin) 2>&1 \
            | tee "$out/cuda_abi_check.log" | tail -4 ;;
    gemm) eval python3 /tmp/t/benchmarks/cuda_gemm.py --out "$out" ${args[gemm]} 2>&1 \
            | tee "$out/cuda_gemm.log" ;;
    decode) eval python3 /tmp/t/benchmarks/cuda_decode.py --out "$out" ${args[decode]} 2>&1 \
              | tee "$out/cuda_decode.log" ;;
    weightonly) eval python3 /tmp/t/benchmarks/cuda_weight_only.py --out "$out" ${args[weightonly]} 2>&1 \
                  | tee "$out/cuda_weight_only.log" ;;
    llama) eval python3 /tmp/t/benchmarks/cuda_llama.py --out "$out" ${args[llama]} 2>&1 \
             | tee -a "$out/cuda_llama.log" ;;
    attention) eval python3 /tmp/t/benchmarks/cuda_attention.py --out "$out" ${args[attention]} 2>&1 \
                 | tee "$out/cuda_attention.log" ;;
    growing) eval python3 /tmp/t/benchmarks/cuda_growing_cache.py --out "$out" ${args[growing]} 2>&1 \
               | tee "$out/cuda_growing_cache.log" ;;
    step) eval python3 /tmp/t/benchmarks/cuda_step_kernels.py --out "$out" ${args[step]} 2>&1 \
            | tee "$out/cuda_step_kernels.log" ;;
  esac
done
