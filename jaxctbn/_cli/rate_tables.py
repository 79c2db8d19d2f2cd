"""The JSON tables of `jaxctbn fit`: the rates with their intervals, the rates at a bound, the
covariate effects, each rate named by node, parent states and transition."""

from __future__ import annotations

from .._model.frames import parent_states


def flagged_rates(model, flags) -> list[dict]:
    """The rates marked in per-node boolean arrays `(configs, k, k)`, by node, parent states
    and transition."""
    import numpy as np

    out = []
    for n, name in enumerate(model.names):
        configs = parent_states(model, n)
        for u, x, y in zip(*np.nonzero(np.asarray(flags[n]))):
            out.append(
                {
                    "node": name,
                    "parent_states": configs[int(u)],
                    "from": int(x),
                    "to": int(y),
                }
            )
    return out


def rate_table(model, log_rate_se, level: float = 0.95) -> list[dict]:
    r"""One entry per free rate: the rate, its standard error (delta method,
    $\hat\lambda\,\mathrm{se}(\log\hat\lambda)$) and the interval
    $\hat\lambda e^{\mp z\,\mathrm{se}}$ at `level`; `se` and `ci95` are null for a rate
    that is not estimated (infinite standard error: at a bound, or no information)."""
    import itertools
    import math
    import statistics

    import numpy as np

    # (the standard library's quantile: importing scipy.stats costs a command ~0.9 s)
    z = statistics.NormalDist().inv_cdf(0.5 + level / 2)
    out = []
    for n, name in enumerate(model.names):
        configs = parent_states(model, n)
        cim = np.asarray(model.cims[n])
        se_log = np.asarray(log_rate_se[n])
        k = cim.shape[-1]
        for u, x, y in itertools.product(range(cim.shape[0]), range(k), range(k)):
            if x == y or se_log[u, x, y] == 0:
                continue  # the diagonal, a structural zero
            rate, s = float(cim[u, x, y]), float(se_log[u, x, y])
            finite = math.isfinite(s)
            out.append(
                {
                    "node": name,
                    "parent_states": configs[u],
                    "from": int(x),
                    "to": int(y),
                    "rate": rate,
                    "se": rate * s if finite else None,
                    "ci95": [rate * math.exp(-z * s), rate * math.exp(z * s)]
                    if finite
                    else [None, None],
                    "estimated": finite,
                }
            )
    return out


def effect_table(model, covariates, uncertainty) -> list[dict]:
    """One entry per covariate and rate it acts on: the hazard ratio and its interval (at the
    level of `uncertainty`)."""
    import math

    from .._panel.rate_fit import covariate_effects

    return [
        {
            "covariate": e.covariate,
            "node": e.node,
            "parent_states": e.parent_states,
            "from": e.source,
            "to": e.target,
            "hazard_ratio": math.exp(e.log_hazard_ratio),
            "log_hazard_ratio": e.log_hazard_ratio,
            "se": e.se if e.estimated else None,
            "ci95": [e.lower, e.upper] if e.estimated else [None, None],
        }
        for e in covariate_effects(model, covariates, uncertainty)
    ]
