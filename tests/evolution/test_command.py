"""manage.py evolve: a live display per generation, then the lineage of the best version."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from evolution.models import EvolutionRun
from evolution.selectors import best_lineage


def run(*args) -> str:
    out = StringIO()
    call_command("evolve", *args, stdout=out, stderr=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_evolve_shows_each_generation_and_the_lineage_of_the_best(facts, support_set, support_base):
    out = run("support", "--golden-set", "support", "--generations", "3", "--population", "4", "--seed", "7")
    assert out.count("  generation ") == 3 and "generation 2: best" in out
    assert "evaluations" in out and "rollouts" in out and "cache hits" in out and "spent $" in out
    evolution = EvolutionRun.objects.get()
    assert f"Best version {evolution.best_version_id}" in out and "lineage of the best version:" in out
    steps = best_lineage(evolution)
    assert steps[0]["version_id"] == support_base.pk and steps[-1]["version_id"] == evolution.best_version_id
    assert steps[-1]["fitness"] == evolution.best_fitness and any((s["change"] or 0) > 0 for s in steps)
    assert "no held-out claim: searched and selected on the whole set" in out and "6 items" in out


@pytest.mark.django_db(transaction=True)
def test_evolve_reports_train_validation_and_test_and_the_lift_on_test(facts, held_out_set, support_base):
    out = run("support", "--golden-set", "support held out", "--generations", "2", "--population", "3", "--seed",
              "1")
    evolution = EvolutionRun.objects.get()
    report, test = evolution.report, evolution.report["test"]
    assert "held-out result (fitness):     train  validation    test" in out
    for role in ("base", "best"):
        side = report[role]
        assert (f"  {role} version {side['version_id']!s:<12} {side['train']:6.2f}      {side['validation']:6.2f}  "
                f"{side['test']:6.2f}") in out
    assert (f"lift on test: {test['lift']:+.1%} (95% interval {test['lift_low']:+.1%} to {test['lift_high']:+.1%}); "
            f"paired test on 6 test items: better, Wilcoxon p = {test['comparison']['p_value']}") in out
    assert f"train-test gap of the best: {report['train_test_gap']:+.2f} fitness points" in out


@pytest.mark.django_db
def test_evolve_refuses_clearly(support_set, support_base):
    with pytest.raises(CommandError, match="no workflow 'nope'"):
        run("nope", "--golden-set", "support")
    with pytest.raises(CommandError, match=r"config\.population: must be from 2 to 100"):
        run("support", "--golden-set", "support", "--population", "1")
