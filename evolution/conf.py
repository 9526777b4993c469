"""An evolution run's configuration: the GP defaults of docs/evolution-defaults.md, overridable per run."""

from __future__ import annotations

import math

from evals.conf import MAX_CONCURRENCY

DEFAULTS = {
    "population": 8,
    "generations": 5,
    "seed": 0,
    "tournament": 5,
    "elites": 2,
    "crossover_rate": 0.7,
    "mutation_rate": 0.3,  # the rest of the draws (1 - crossover - mutation) bring an immigrant
    "offspring_per_breeding": 2,
    "initial_immigrants": 0.25,  # share of the first population that are immigrants, the rest mutants of the base
    "usd_budget": 10.0,
    "max_evaluations": 300,
    "time_limit_seconds": 3600,
    "convergence_generations": 5,
    "convergence_epsilon": 0.001,
    "concurrency": 16,  # items of one eval run in flight at once (x population 8: twice LLM_MAX_IN_FLIGHT)
    "minibatch": 3,  # reflective mode: items a candidate is first scored on
    "mutation_weights": None,  # None: evolution/operators.py MUTATION_WEIGHTS (docs/operators.md)
}

LIMITS = {  # name: (type, minimum, maximum)
    "population": (int, 2, 100),
    "generations": (int, 1, 200),
    "seed": (int, 0, 2**62),
    "tournament": (int, 1, 100),
    "elites": (int, 0, 50),
    "crossover_rate": (float, 0.0, 1.0),
    "mutation_rate": (float, 0.0, 1.0),
    "offspring_per_breeding": (int, 1, 10),
    "initial_immigrants": (float, 0.0, 1.0),
    "usd_budget": (float, 0.0, 100_000.0),
    "max_evaluations": (int, 1, 100_000),
    "time_limit_seconds": (int, 1, 7 * 86400),
    "convergence_generations": (int, 1, 100),
    "convergence_epsilon": (float, 0.0, 100.0),
    "concurrency": (int, 1, MAX_CONCURRENCY),
    "minibatch": (int, 1, 1000),
}


def evolution_config(overrides: dict | None) -> tuple[dict, dict[str, list[str]]]:
    """The run's configuration (defaults + `overrides`) and the errors, by field."""
    from evolution.operators import MUTATION_WEIGHTS

    config, errors = dict(DEFAULTS), {}
    if overrides is not None and not isinstance(overrides, dict):
        return config, {"config": ["must be an object of settings"]}
    overrides = overrides or {}
    if "elites" not in overrides and isinstance(overrides.get("population"), int):
        config["elites"] = max(0, min(DEFAULTS["elites"], overrides["population"] - 1))  # a population of 2 works
    for key, value in overrides.items():
        if key not in DEFAULTS:
            errors[f"config.{key}"] = ["is not a setting of an evolution run"]
            continue
        if key == "mutation_weights":
            if value is not None and (not isinstance(value, dict) or not value or any(
                    k not in MUTATION_WEIGHTS or isinstance(v, bool) or not isinstance(v, int | float)
                    or not 0 <= v <= 1000 for k, v in value.items()) or not sum(value.values())):
                errors["config.mutation_weights"] = [f"must map some of {', '.join(MUTATION_WEIGHTS)} to weights "
                                                    "from 0 to 1000, not all 0"]
                continue
            config[key] = value
            continue
        kind, low, high = LIMITS[key]
        if isinstance(value, bool) or not isinstance(value, int | float) or not math.isfinite(value) \
                or (kind is int and value != int(value)):
            errors[f"config.{key}"] = [f"must be {'a whole number' if kind is int else 'a number'}"]
            continue
        if not low <= value <= high:
            errors[f"config.{key}"] = [f"must be from {low} to {high}"]
            continue
        config[key] = kind(value)
    if config["crossover_rate"] + config["mutation_rate"] > 1 + 1e-9:
        errors["config.mutation_rate"] = ["crossover_rate + mutation_rate is at most 1"]
    if config["elites"] >= config["population"]:
        errors["config.elites"] = ["must be fewer than the population"]
    return config, errors
