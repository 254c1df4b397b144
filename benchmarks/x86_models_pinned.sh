#!/usr/bin/env bash
# benchmarks/x86_models.py on a many-core host: one process per model and dtype, each pinned
# to cores of its own (taskset), as many at once as the cores allow, then one report.
#   bash benchmarks/x86_models_pinned.sh OUT THREADS "bert-mini gpt2" "fp32 bf16" [x86_models args]
# OUT: a folder (each case's report, their log, and all.md: every case's report in turn).
# Each ratio still compares configurations measured in one process, in alternating windows;
# the cases running beside it load the memory system, so a case moves by a few percent
# between runs (the reports print the load average at their start).
set -uo pipefail
out=$1 threads=$2 models=$3 dtypes=$4
shift 4
here=$(cd "$(dirname "$0")" && pwd)
cores=$(nproc)
slots=$((cores / threads))
[ "$slots" -ge 1 ] || { echo "$threads threads need more than the $cores cores here" >&2; exit 2; }
mkdir -p "$out"
cases=()
for m in $models; do for d in $dtypes; do cases+=("$m $d"); done; done
running=0 slot=0
for c in "${cases[@]}"; do
  read -r m d <<<"$c"
  if [ "$running" -ge "$slots" ]; then wait -n; running=$((running - 1)); fi
  first=$(( (slot % slots) * threads ))
  cpus="$first-$((first + threads - 1))"
  name="${m}_${d}_t${threads}"
  ( start=$(date +%s)
    taskset -c "$cpus" python3 "$here/x86_models.py" --models "$m" --dtypes "$d" \
      --threads "$threads" --out "$out/$name.md" "$@" >"$out/$name.log" 2>&1
    echo "$name: exit $?, $(( $(date +%s) - start )) s on cores $cpus" >>"$out/cases.log" ) &
  running=$((running + 1)) slot=$((slot + 1))
done
wait
amx=$(grep -o 'amx_[a-z0-9]*' /proc/cpuinfo | sort -u | tr '\n' ' ')
{ echo "# benchmarks/x86_models.py, one pinned process per case, $threads thread(s) each"
  echo; echo "Host: $(lscpu | sed -n 's/^Model name: *//p'), $cores cores; AMX: ${amx:-none}"
  echo; sed 's/^/- /' "$out/cases.log"
  for c in "${cases[@]}"; do
    read -r m d <<<"$c"
    echo; echo "## $m $d"; echo; cat "$out/${m}_${d}_t${threads}.md" 2>/dev/null \
      || tail -5 "$out/${m}_${d}_t${threads}.log"
  done
} >"$out/all.md"
cat "$out/cases.log"
