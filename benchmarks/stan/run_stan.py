"""Run benchmarks/stan/panel_markov.stan with PyStan (an external program: its own virtual
environment, `pip install pystan`). Usage: python run_stan.py DATA.json OUT.json CHAINS WARMUP
DRAWS SEED. Writes the draws of q (chains x draws x P) and the compile and sampling times."""

import json
import os
import sys
import time

import stan

data_path, out_path = sys.argv[1], sys.argv[2]
chains, warmup, draws, seed = (int(a) for a in sys.argv[3:7])
with open(data_path) as f:
    data = json.load(f)
with open(os.path.join(os.path.dirname(os.path.abspath(__file__)), "panel_markov.stan")) as f:
    program = f.read()
t0 = time.perf_counter()
model = stan.build(program, data=data, random_seed=seed)
compile_s = time.perf_counter() - t0
t0 = time.perf_counter()
fit = model.sample(num_chains=chains, num_warmup=warmup, num_samples=draws)
sample_s = time.perf_counter() - t0
raw = fit["q"]  # (P, draws * chains), column s * chains + c
per_chain = raw.reshape(raw.shape[0], draws, chains).transpose(2, 1, 0).tolist()
divergent = int(fit["divergent__"].sum())
with open(out_path, "w") as f:
    json.dump(
        {
            "q": per_chain,
            "compile_s": compile_s,
            "sample_s": sample_s,
            "divergent": divergent,
            "stan_version": getattr(stan, "__version__", "?"),
        },
        f,
    )
