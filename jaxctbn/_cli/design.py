"""`jaxctbn design`: every candidate intervention scored for the next experiment."""

from __future__ import annotations

from typing import Any

from .arguments import (
    _costs,
    _empirical_bayes,
    _initial_state,
    _max_parents,
    _outcome,
    _prior,
    _prior_json,
    _strengths,
)
from .jax_setup import _exported, _jit
from .memory import within_memory
from .ranking import write_ranking


def _criterion(name: str, paths: int, box_hill: dict):
    """The criterion Module named by `--criterion` (`--paths` >= 1 is checked by the parser);
    `box_hill`: the (V)BHC's structure keywords."""
    from .._criteria.box_hill import BHC, VBHC
    from .._criteria.eig import EIG

    if name == "eig":
        return EIG(num_paths=paths)
    return {"vbhc": VBHC, "bhc": BHC}[name](**box_hill)


def _rate_prior(model, prior):
    from .._learning.posterior import RatePosterior

    return RatePosterior.for_model(model, prior=prior)


def _updated_with_paths(posterior, trajectories):
    """`posterior` updated with the sufficient statistics of the complete `trajectories`."""
    from .._paths.sufficient_statistics import SufficientStatistics

    stats = SufficientStatistics.from_trajectories(
        trajectories, posterior.cardinalities, posterior.parents
    )
    return posterior.update_with(stats)


def _cmd_design(args):
    """`jaxctbn design`; a solve that the duration makes too long is named by `--duration`."""
    from .moments import _duration_advice

    try:
        return _design(args)
    except RuntimeError as error:  # eqx.error_if inside jit
        advice = _duration_advice(error, args.duration, solver_flag=False)
        if advice.startswith("--duration"):
            raise ValueError(advice) from None
        raise


def _design(args):
    from .._paths.csv import trajectories_from_dataframe
    from .inputs import network_flag_format, read_data, read_network

    if args.observation == "panel" and args.data is None:
        raise ValueError("--observation panel: give the panel history with --data.")
    sampled = args.panel_posterior != "moment"
    given = [f for f, v in (("--panel-posterior", args.panel_posterior), ("--draws", args.draws),
                            ("--chains", args.chains)) if v is not None]  # fmt: skip
    if given and (args.observation != "panel" or args.data is None):
        raise ValueError(f"{', '.join(given)}: only with --data and --observation panel.")
    if (
        args.target == "structure"
        and args.empirical_bayes
        and sampled
        and args.observation == "panel"
    ):
        raise ValueError(
            "--empirical-bayes: not with a sampled panel history (the hyper-parameters are "
            "fitted to one posterior's statistics); add --panel-posterior moment."
        )
    if not sampled and (args.draws is not None or args.chains is not None):
        raise ValueError("--draws/--chains: only with --panel-posterior sampled.")
    outcome = _outcome(args)
    if args.target == "structure":
        return _design_structure(args, outcome)
    if args.network is None:
        raise ValueError(
            "--network: required with --target parameters (the known graph, a network JSON)."
        )
    network = read_network(args.network, network_flag_format(args.format))
    model = network.model
    args.input_format = {"network": network.format}  # written with the ranking
    init, initial = _initial_state(args.initial_state, model.names, model.cardinalities)
    if args.prior != "gamma" or args.empirical_bayes:
        raise ValueError(
            "--prior/--empirical-bayes: parameter learning takes the Gamma prior with given "
            "--alpha/--beta (the Nodelman prior and empirical Bayes are for structure learning)."
        )
    panel = args.observation == "panel"
    df: Any = None
    if args.data is not None:
        df, args.input_format["data"], _ = read_data(
            args.data, args.format, model=network.nodes(), panel=panel
        )
    posterior = _exported("rate-prior", _rate_prior)(model, _prior(args, model.num_nodes))
    history = None
    if args.data is not None and panel:
        from .._panel.csv import panel_from_dataframe
        from .._panel.rate_families import MomentMatchedGamma
        from .._panel.rate_posterior import panel_rate_posterior

        observations, _ = panel_from_dataframe(df, model, bucketed=True)
        if sampled:
            from .._model.frames import free_rate_masks
            from .rate_posterior import sampled_rate_posterior

            posterior, history = sampled_rate_posterior(
                args, posterior, observations, args.seed, free=free_rate_masks(model)
            )
            d = history["diagnostics"]
            if not d["converged"]:
                print(
                    f"warning: the history's posterior chains may not have converged (largest "
                    f"split R-hat {d['max_split_r_hat']:.3f}, smallest ESS {d['min_ess']:.0f}, "
                    f"{d['divergent_transitions']} divergent transitions): raise --draws"
                )
        else:
            posterior = panel_rate_posterior(posterior, observations, family=MomentMatchedGamma())
            history = {
                "method": "moment-matched-gamma",
                "note": "--panel-posterior moment: the Gamma of the smoothed expected "
                "statistics, overconfident where the visits are sparse",
            }
    elif args.data is not None:
        traj = trajectories_from_dataframe(df, model)[0].with_rounded_shapes()
        posterior = _exported("path-history", _updated_with_paths)(posterior, traj)
    space = _candidates(args.interventions, model.cardinalities)
    args.history_posterior = history  # written with the ranking
    _rank(args, posterior, space, list(model.names), init, initial, outcome)


def _rank(args, posterior, space, names, init, initial, outcome):
    """Score `space` for the next experiment and write the ranking: with a panel outcome and a
    Box-Hill criterion with the visit times chosen with `--visits`; with `--batch` the greedy
    batch of `Batch`; with prices, each candidate's cost and
    the best within `--budget` by `--rank-by`."""
    import jax
    import numpy as np

    cards = tuple(int(k) for k in posterior.cardinalities)
    costs = _costs(args, names, cards)
    candidate_costs = None
    if costs is not None:
        visits = 0 if outcome is None else outcome.size
        candidate_costs = np.asarray(costs.of(space, num_visits=visits))
        if args.rank_by == "score-per-cost" and np.any(candidate_costs <= 0):
            raise ValueError(
                "--rank-by score-per-cost: every experiment must cost > 0; give --experiment-cost."
            )
    if args.budget is not None:
        cheapest = 0.0 if candidate_costs is None else float(candidate_costs.min())
        if args.budget < cheapest:
            raise ValueError(
                f"--budget: {args.budget:g} is below the cheapest experiment ({cheapest:g})."
            )
    key = jax.random.key(args.seed)
    strengths = _strengths(args, list(names))
    if strengths is not None:
        return _rank_strengths(
            args, posterior, space, names, init, initial, outcome, costs, strengths, key
        )
    if args.batch is not None:
        _check_batch(args, outcome)
        options = _box_hill_options(args, len(names)) if args.target == "structure" else {}
        batch = _choose_batch(
            args, posterior, space, initial, _criterion(args.criterion, args.paths, options),
            key, costs, outcome,
        )  # fmt: skip
        write_ranking(
            args,
            batch.round_scores[0],
            space,
            names,
            init,
            args.duration,
            costs=candidate_costs,
            batch=batch,
        )
        return
    if outcome is not None and args.criterion != "eig":
        from .._criteria.scoring import score_interventions

        options = {}
        if args.target == "structure":
            options = _box_hill_options(args, len(names))
        design = within_memory(
            "design --outcome panel",
            score_interventions,
            posterior,
            space,
            initial,
            args.duration,
            outcome=outcome,
            criterion=_criterion(args.criterion, args.paths, options),
            key=key,
            num_samples=args.samples,
        )
        design = jax.tree_util.tree_map(np.asarray, design)
        chosen = outcome.chooses_times  # a PanelDesign with each candidate's visit times
        write_ranking(
            args,
            design.scores if chosen else design,
            space,
            names,
            init,
            args.duration,
            panel=design if chosen else None,
            costs=candidate_costs,
        )
        return
    scores = _score_space(posterior, space, initial, args.duration, key, args, outcome)
    write_ranking(
        args, np.asarray(scores), space, names, init, args.duration, costs=candidate_costs
    )


def _check_batch(args, outcome):
    """`--batch`: the settings a batch cannot take, one line each."""
    if args.criterion == "eig":
        raise ValueError(
            "--batch: batches are chosen by --criterion bhc or vbhc (the EIG of a batch "
            "is the reference, jaxctbn.criteria.GivenBatch)."
        )
    if args.visits is not None:
        raise ValueError(
            "--batch: with --outcome panel give --observation-times (choosing each "
            "member's visit times is not supported yet)."
        )
    if outcome is not None and args.target == "parameters" and args.criterion == "vbhc":
        raise ValueError(
            "--batch: panel batches for parameter learning take --criterion bhc (the panel "
            "VBHC has no batch form yet)."
        )


def _choose_batch(args, posterior, candidates, initial, criterion, key, costs, outcome):
    """The greedy batch of `--batch` among `candidates`, as NumPy arrays."""
    import jax
    import numpy as np

    from .._criteria.batches import Batch
    from .._criteria.costs import ByScore, ByScorePerCost
    from .._criteria.scoring import score_interventions

    batch = within_memory(
        "--batch",
        score_interventions,
        posterior,
        candidates,
        initial,
        args.duration,
        criterion=criterion,
        key=key,
        num_samples=args.samples,
        batch=Batch(
            args.batch,
            costs=costs,
            budget=args.budget,
            ranking=ByScorePerCost() if args.rank_by == "score-per-cost" else ByScore(),
        ),
        splittable=False,
        **({} if outcome is None else {"outcome": outcome}),
    )
    return jax.tree_util.tree_map(np.asarray, batch)


def _rank_strengths(args, posterior, space, names, init, initial, outcome, costs, strengths, key):
    """`--strength`: every candidate, and every one that leaves a strength node free also with
    that node's rates scaled by its best strength in range (`Strengths`)."""
    import jax
    import numpy as np

    from .._criteria.outcomes import COMPLETE_PATH
    from .._criteria.scoring import score_interventions

    if args.batch is not None:
        _check_batch(args, outcome)
    if args.criterion == "eig":
        raise ValueError(
            "--strength: the strength is chosen by the gradient of the bhc or vbhc (the EIG's "
            "sampled paths are not differentiable in it)."
        )
    if args.visits is not None:
        raise ValueError("--strength: with --outcome panel give --observation-times, not --visits.")
    options = _box_hill_options(args, len(names)) if args.target == "structure" else {}
    criterion = _criterion(args.criterion, args.paths, options)
    outcome = COMPLETE_PATH if outcome is None else outcome
    scores = _score_space(posterior, space, initial, args.duration, key, args, outcome)
    design = within_memory(
        "--strength",
        score_interventions,
        posterior,
        space,
        initial,
        args.duration,
        strengths=strengths,
        criterion=criterion,
        key=key,
        num_samples=args.samples,
        outcome=outcome,
    )
    design = jax.tree_util.tree_map(np.asarray, design)
    free = np.flatnonzero(design.free)
    variants = jax.vmap(strengths.apply)(
        jax.tree_util.tree_map(lambda a: a[free], space),
        jax.numpy.asarray(design.rate_scales[free]),
    )
    all_scores = np.concatenate([np.asarray(scores), design.scores[free]])
    all_costs = None
    if costs is not None:
        visits = 0 if args.outcome == "path" else len(args.observation_times)
        all_costs = np.concatenate(
            [
                np.asarray(costs.of(space, num_visits=visits)),
                np.asarray(costs.of(variants, num_visits=visits)),
            ]
        )
    scales = [None] * len(scores) + [
        {names[n]: float(design.rate_scales[i, j]) for j, n in enumerate(strengths.nodes)}
        for i in free
    ]
    rows = np.concatenate([np.arange(len(scores)), free])
    batch = None
    if args.batch is not None:
        # the batch among the perfect candidates (unit scales) and the scaled variants
        C = len(scores)
        ones = jax.numpy.ones((C,))
        perfect = space.with_rate_scales([ones] * len(names))
        combined = jax.tree_util.tree_map(
            lambda a, b: jax.numpy.concatenate([a, b]), perfect, variants
        )
        batch = _choose_batch(
            args, posterior, combined, initial, criterion, key, costs,
            None if outcome is COMPLETE_PATH else outcome,
        )  # fmt: skip
        all_scores = batch.round_scores[0]
    write_ranking(
        args,
        all_scores,
        space,
        names,
        init,
        args.duration,
        costs=all_costs,
        rows=rows,
        rate_scales=scales,
        batch=batch,
    )


def _design_structure(args, outcome):
    import jax.numpy as jnp

    from .._learning.structure_posterior import learn_structure
    from .._paths.csv import RESERVED_COLUMNS, infer_cardinalities, trajectories_from_dataframe
    from .inputs import network_flag_format, read_data, read_network

    if args.data is None and args.network is None:
        raise ValueError("--data or --network: give the history (or a network for the node list).")
    network = None
    args.input_format = {}  # written with the ranking
    if args.network is not None:
        network = read_network(args.network, network_flag_format(args.format))
        args.input_format["network"] = network.format
    df = known = None
    if args.data is not None:
        df, args.input_format["data"], known = read_data(
            args.data,
            args.format,
            model=None if network is None else network.nodes(),
            panel=args.observation == "panel",
        )
    if network is not None:
        nodes = dict(zip(network.model.names, network.model.cardinalities))
    else:
        # df is read here (the check above raises when --data and --network are both absent)
        assert df is not None
        nodes = known or infer_cardinalities(df, missing=args.observation == "panel")
    names, cards = list(nodes), tuple(nodes.values())
    N = len(names)
    max_parents = _max_parents(args.max_parents, N)
    if df is not None:
        extra = [c for c in df.columns if c not in RESERVED_COLUMNS and c not in nodes]
        if extra:
            raise ValueError(f"data: unknown node column(s) {extra}; the nodes are {names}.")
    if df is not None and args.observation == "panel":
        from .._panel.csv import panel_from_dataframe
        from .._panel.structure import learn_structure_from_panels

        observations, _ = panel_from_dataframe(df, nodes, bucketed=True)
        if args.panel_posterior == "moment":
            posterior = learn_structure_from_panels(
                observations, names, cards, max_parents=max_parents, prior=_prior(args, N)
            ).posterior
            args.history_posterior = {
                "method": "structural-em",
                "note": "--panel-posterior moment: structural EM's expected statistics scored "
                "as if observed, overconfident where the visits are sparse",
            }
            return _rank_structure(args, posterior, names, cards, outcome)
        from .._learning.structure_posterior import StructurePosterior
        from .learn import sampled_structure_posterior

        prior = StructurePosterior.from_prior(
            names, cards, max_parents=max_parents, prior=_prior(args, N)
        )
        history, mixture = sampled_structure_posterior(
            prior,
            observations,
            sweeps=args.draws or 1000,
            chains=args.chains or 4,
            burn_in=100,
            seed=args.seed,
            setting="--draws",
        )
        if outcome is None:  # --outcome path
            # the complete-path criteria score one posterior: said in the output and here
            history["scored"] = (
                "moment-matched: the complete-path criteria score one structure posterior, the "
                "mixture's weighted mean statistics (the history's hidden paths taken as seen); "
                "--outcome panel scores the mixture itself"
            )
            print(
                "note: --outcome path scores the sampled history's moment-matched posterior "
                "(one posterior of its mean statistics); --outcome panel scores the mixture"
            )
            posterior = mixture.moment_matched()
        else:
            posterior = mixture
        args.history_posterior = history
        return _rank_structure(args, posterior, names, cards, outcome)
    if df is not None:  # (rounded shapes: a new history of similar size finds the programs)
        traj = trajectories_from_dataframe(df, nodes)[0].with_rounded_shapes()
    else:  # no history: one empty trajectory contributes nothing
        from .._paths.sampling import Trajectories

        traj = Trajectories(
            initial_states=jnp.zeros((1, N), jnp.int32),
            jump_times=jnp.zeros((1, 1)),
            states=jnp.zeros((1, 1, N), jnp.int32),
            num_events=jnp.zeros((1,), jnp.int32),
            durations=jnp.ones((1,)),
            truncated=jnp.zeros((1,), bool),
            intervention_targets=jnp.ones((1, N), bool),
            intervention_states=jnp.zeros((1, N), jnp.int32),
        )
    posterior = learn_structure(traj, names, cards, max_parents=max_parents, prior=_prior(args, N))
    return _rank_structure(args, posterior, names, cards, outcome)


def _rank_structure(args, posterior, names, cards, outcome):
    eb = _empirical_bayes(args)
    if eb is not None:
        posterior = _jit(eb.fit)(posterior)
    args.fitted_prior = _prior_json(args, posterior)

    init, initial = _initial_state(args.initial_state, names, cards)
    space = _candidates(args.interventions, cards)
    _rank(args, posterior, space, names, init, initial, outcome)


def _box_hill_options(args, num_nodes: int) -> dict:
    """The structure (V)BHC keywords of `--graph-draws` and `--max-sets` for `num_nodes`."""
    from .._criteria.structure import JointGraphDraws, StratifiedGraphDraws
    from .._experiments.config import default_graph_draws

    draws, max_sets = default_graph_draws(num_nodes, args.graph_draws, args.max_sets)
    return {
        "graph_draws": JointGraphDraws() if draws == "joint" else StratifiedGraphDraws(),
        "max_sets": max_sets,
    }


def _candidates(which, cards):
    """The candidate interventions of `--interventions` (auto: all up to 4096, else single)."""
    from .._model.interventions import design_space, intervention_space, single_node_interventions

    choose = {"auto": design_space, "all": intervention_space, "single": single_node_interventions}
    return choose[which](cards)


def _score_space(posterior, space, initial_state, horizon, key, args, outcome=None):
    from .._criteria.outcomes import COMPLETE_PATH
    from .._criteria.scoring import score_interventions

    return within_memory(
        "design",
        score_interventions,
        posterior,
        space,
        initial_state,
        horizon,
        criterion=_criterion(
            args.criterion, args.paths, _box_hill_options(args, len(posterior.cardinalities))
        ),
        key=key,
        num_samples=args.samples,
        outcome=COMPLETE_PATH if outcome is None else outcome,
    )
