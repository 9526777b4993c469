"""Smoke test of `python -m bench evolution` (bench/evolution.py) at a tiny size: one agent, both modes at
population 3 x 2 generations, a genealogy of depth 50 timed 3 times. It completes and reports every field;
timings and lifts are never asserted (they are the benchmark's to report)."""

import json

import pytest

from bench import __main__ as bench_main
from bench import evolution as bench_evolution

pytestmark = pytest.mark.django_db

AGENT = "Research Analyst"
RUN_FIELDS = {"run_id", "mode", "status", "error", "stop_reason", "base_version_id", "best_version_id",
              "best_operation", "best_commit_message", "base_fitness", "best_fitness", "lift", "generations_done",
              "evaluations", "rollouts", "cache_hits", "usd_cost", "wall_s", "generation_of_best", "rollouts_to_best",
              "rollouts_to_best_by_eval_run", "generations", "ledger", "completed", "held_out", "test_lift", "report"}
REPORT_FIELDS = {"held_out", "reason", "splits", "base", "best", "test_lift", "test_lift_low", "test_lift_high",
                 "test_items", "verdict", "p_value", "train_test_gap", "test_error"}
GENERATION_FIELDS = {"number", "members", "best", "avg", "worst", "best_version_id", "run_best",
                     "run_best_version_id", "evaluations", "rollouts", "cache_hits", "run_rollouts", "wall_s",
                     "run_best_test", "run_best_changes"}
QUERY_FIELDS = {"n", "median_ms", "p95_ms", "min_ms", "max_ms", "rows", "max_depth", "paths_walked", "met",
                "explain"}


def test_the_evolution_benchmark_runs_at_a_tiny_size_and_reports_every_field(settings, capsys):
    settings.DURABLE_DISPATCH_ENABLED = False
    settings.LLM_PROVIDER = "offline"
    assert "evolution" in bench_main.available()

    prepared = bench_evolution.prepare(agents=[AGENT])
    assert set(prepared) == {"gp", "reflective"}
    assert prepared["gp"]["workspace"] != prepared["reflective"]["workspace"]  # no results reused across modes
    setup = bench_evolution.setup_of(prepared)
    for mode in ("gp", "reflective"):
        assert setup[mode]["indexed"] == setup[mode]["sources"] > 0 and setup[mode]["chunks"] > 0
        assert setup[mode]["agents_seeded"] == 7 and setup[mode]["items"][AGENT] > 0

    results = bench_evolution.measure(prepared, agents=[AGENT], generations=2, population=3, seed=0, depth=50,
                                      repeats=3)
    runs = results["agents"][AGENT]
    for mode in ("gp", "reflective"):
        run = runs[mode]
        assert set(run) == RUN_FIELDS
        assert set(run["report"]) == REPORT_FIELDS and run["report"]["held_out"] is run["held_out"]
        assert run["completed"], run["error"]
        assert run["generations"] and all(set(g) == GENERATION_FIELDS for g in run["generations"])
        assert all(g[key] is not None for g in run["generations"] for key in GENERATION_FIELDS)
        # the generations' rollouts, then the test split's (base and best, scored once the search ended)
        searched = run["generations"][-1]["run_rollouts"]
        assert sum(g["rollouts"] for g in run["generations"]) == searched > 0
        assert run["held_out"] and run["rollouts"] > searched
        assert run["base_fitness"] is not None and run["best_fitness"] is not None and run["lift"] is not None
        assert run["rollouts_to_best"] is not None and run["generation_of_best"] is not None
        # each version the run held as its best, with the run's rollouts then, scored on test after the run
        changes = [c for g in run["generations"] for c in g["run_best_changes"]]
        assert changes and changes[-1]["version_id"] == run["best_version_id"]
        assert all(c["test"] is not None and c["run_rollouts"] <= searched for c in changes)
        # the eval runs, in order, add up to the run's rollouts; the best was scored by one of them
        assert run["ledger"] and run["ledger"][-1]["run_rollouts"] == run["rollouts"]
        assert run["rollouts_to_best_by_eval_run"] is not None
        assert run["rollouts_to_best_by_eval_run"] <= run["rollouts_to_best"]
    assert [g["number"] for g in runs["gp"]["generations"]] == [0, 1]
    comparison = runs["comparison"]
    assert set(comparison) >= {"gp_lift", "gp_rollouts_to_best", "reflective_lift", "reflective_rollouts_to_gp_lift",
                               "share_of_gp_rollouts", "met", "by_eval_run"}
    # the headline: on the test split, each generation's run best scored there after the run
    on_test = runs["test_comparison"]
    assert set(on_test) >= {"gp_test_lift", "share_of_gp_rollouts", "met", "note"}
    if on_test["note"] == "":
        assert on_test["gp_rollouts_to_test_lift"] is not None
    assert "test lift" in results["targets"][f"reflective_rollouts:{AGENT}"]["target"]

    lineages = results["genealogy"]["lineages"]
    assert set(lineages) == {"linear", "crossovers"}
    assert lineages["linear"]["versions"] == lineages["linear"]["main_line"] == 51
    assert lineages["linear"]["crossovers"] == 0
    assert lineages["crossovers"]["main_line"] == 51 and lineages["crossovers"]["crossovers"] > 0
    assert lineages["crossovers"]["versions"] == 51 + lineages["crossovers"]["side_versions"]
    for shape, lineage in lineages.items():
        assert set(lineage["queries"]) == {"version_ancestors(deepest)", "version_descendants(root)"}
        for query in lineage["queries"].values():
            assert set(query) == QUERY_FIELDS and query["n"] == 3 and query["paths_walked"] >= query["rows"]
            assert query["rows"] == lineage["versions"] - 1
            # a crossover's side branch is a shorter way back
            assert query["max_depth"] == 50 if shape == "linear" else 0 < query["max_depth"] < 50

    assert set(results["targets"]) == {f"gp_lift:{AGENT}", f"reflective_rollouts:{AGENT}"} | {
        f"genealogy:{shape}:{name}" for shape in ("linear", "crossovers")
        for name in ("version_ancestors(deepest)", "version_descendants(root)")}
    assert all({"target", "measured", "unit", "met"} <= set(t) for t in results["targets"].values())
    json.dumps(results)  # what main() writes

    bench_evolution.report({**results, "setup": setup})
    out = capsys.readouterr().out
    for title in ("setup:", f"{AGENT}, gp:", f"{AGENT}, reflective:", "runs:", "reflective vs GP",
                  "reflective vs GP on held-out items", "genealogy:", "targets"):
        assert title in out
