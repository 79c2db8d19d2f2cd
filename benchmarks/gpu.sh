#!/usr/bin/env bash
# The benchmarks on a GPU: each writes benchmarks/results/<name>_gpu.{json,md} next to its CPU
# table, under its own time limit (a benchmark that runs out is reported and the next one runs).
#
#   bash benchmarks/gpu.sh [all|issue13|issue14] [COPY_TO]
#
# `issue14` (the default): the paper's structure experiment at full size (500 repetitions x 15
# experiments, VBHC; all repetitions in one compiled batch), the intervention scoring of the 81
# candidates and the master-equation latency; `issue13`: the large-network design steps (the
# mean-field parameter VBHC at N = 20/50/100, the structure VBHC at N = 20/50); `all`: both
# and the sampling throughput. PYTHON (default python3) must have jax with CUDA, equinox,
# diffrax, optax, jaxtyping, scipy, pandas and matplotlib; jaxctbn is taken from this checkout.
# The results are copied to COPY_TO when given.
set -u
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
export PYTHONPATH="$PWD${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
which=${1:-issue14}
copy_to=${2:-}
"$PY" -c 'import jax; print("devices:", jax.devices())' || exit 1

run() {
  local limit=$1
  shift
  echo "== $* (limit ${limit} s)"
  local t0=$SECONDS
  timeout "$limit" "$PY" "$@"
  local rc=$?
  echo "== exit ${rc} after $((SECONDS - t0)) s: $*"
}

if [[ $which == issue14 || $which == all ]]; then
  run 330 benchmarks/active_learning/bench_active_learning.py --targets structure --designs vbhc \
    --repetitions 500 --experiments 15 --chunk 500 --name active_learning_gpu
  run 200 benchmarks/criteria/bench_criteria.py --name criteria_gpu
  run 300 benchmarks/master_equation/bench_master_equation.py --name master_equation_gpu
fi
if [[ $which == issue13 || $which == all ]]; then
  run 300 benchmarks/master_equation/bench_mean_field.py --timing-only --name mean_field_gpu
  run 300 benchmarks/criteria/bench_structure_design_large.py --timing-only --name structure_design_large_gpu
fi
if [[ $which == all ]]; then
  run 200 benchmarks/paths/bench_sampling.py --name sampling_gpu
fi
if [[ -n $copy_to ]]; then
  mkdir -p "$copy_to"
  cp benchmarks/results/*_gpu.json benchmarks/results/*_gpu.md "$copy_to"/ 2>/dev/null
fi
