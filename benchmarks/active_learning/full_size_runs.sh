#!/usr/bin/env bash
# The paper's synthetic experiments at full size under the paper-faithful setting (issue 11;
# docs/concepts/active-learning.md#paper-faithful). Resumable: rerun to continue.
#
# - structure, 500 repetitions x 15 experiments: passive, random, BHC, VBHC, with the
#   truth's own Gamma hyper-parameters per node (slow X1, X3: Gamma(1/5,1); fast X2, X4:
#   Gamma(5,1));
# - the EIG design (10 paths per draw) costs ~6x a VBHC step for structure and ~100x for
#   parameters, so it runs on the first 100 (structure) or 50 (parameters) repetitions
#   (the same keys: fold_in(key(0), r)),
#   next to passive, random and VBHC on the same repetitions so its paired differences come
#   from one directory; negative VBHC (a control) runs there too, for structure;
# - parameters, 500 repetitions x 15: results/active_parameters (Gamma(1,1): the paper gives no
#   hyper-parameters for this experiment), made by `python benchmarks/active_learning/bench_active_learning.py`.
set -euo pipefail
cd "$(dirname "$0")/../.."
R=benchmarks/results
J=${JAXCTBN:-.venv/bin/jaxctbn}
FAITHFUL=(--alpha 0.2,5,0.2,5 --beta 1)
$J run structure "${FAITHFUL[@]}" --designs passive,random,bhc,vbhc \
  --repetitions 500 --experiments 15 --chunk 25 --out $R/faithful_structure --no-progress
$J run parameters --designs passive,random,vbhc,eig \
  --repetitions ${EIG_PARAMETER_REPETITIONS:-50} --experiments 15 --chunk 10 --out $R/faithful_parameters_eig --no-progress
$J run structure "${FAITHFUL[@]}" --designs passive,random,vbhc,negative-vbhc,eig \
  --repetitions ${EIG_REPETITIONS:-100} --experiments 15 --chunk 10 --out $R/faithful_structure_eig --no-progress
