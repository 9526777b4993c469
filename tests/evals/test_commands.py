"""manage.py eval and manage.py compare."""

from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from evals.models import EvalRun


def run(*args) -> str:
    out = StringIO()
    call_command(*args, stdout=out, stderr=out)
    return out.getvalue()


@pytest.mark.django_db(transaction=True)
def test_eval_shows_progress_results_and_a_summary_then_compare_gives_the_verdict(facts, support_set,
                                                                                 support_versions):
    base, better = support_versions
    out = run("eval", "support", str(base.pk))
    assert "[" + "#" * 30 + "] 6/6 completed" in out and "] 0/0 queued" in out
    assert "How long do refunds take?" in out and "contains+token_f1" in out
    assert "average score" in out and "pass rate" in out and "fitness" in out and "latency p50 / p95" in out
    out = run("eval", str(support_set.pk), better.dsl_hash[:10])
    assert EvalRun.objects.filter(status="completed").count() == 2
    again = run("eval", "support", str(base.pk))
    assert "6 (6 reused, 0 grading errors)" in again and again.count("reused") >= 7

    out = run("compare", "support", str(base.pk), str(better.pk))
    assert "paired items: 6" in out and "Wilcoxon signed-rank p = 0.03125" in out
    assert "verdict: b is better" in out and "mean difference b - a: +" in out
    assert "verdict: b is worse" in run("compare", "support", str(better.pk), str(base.pk))


@pytest.mark.django_db
def test_eval_and_compare_refuse_clearly(support_set, support_versions, make_version):
    from tests.workflows.conftest import graph, node

    base, better = support_versions
    with pytest.raises(CommandError, match="no golden set 'nope'"):
        run("eval", "nope", str(base.pk))
    with pytest.raises(CommandError, match="no version"):
        run("eval", "support", "999999")
    lacking = make_version(graph("a", node("a", tools=["tavily"])), name="lacking")
    with pytest.raises(CommandError, match=r"tools: a\.tavily"):
        run("eval", "support", str(lacking.pk))
    with pytest.raises(CommandError, match="has no completed eval run on this set"):
        run("compare", "support", str(base.pk), str(better.pk))
