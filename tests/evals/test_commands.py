"""manage.py eval and manage.py compare."""

import time
from io import StringIO

import pytest
from django.core.management import CommandError, call_command

from config.supervisor import stop_process_groups
from evals.models import EvalRun
from evals.services import golden_item_add, golden_set_create
from tests.builders import graph, node
from tests.openai_server import FakeOpenAIChat
from tests.workflows.workers import llm_worker


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
    from tests.builders import graph, node

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


@pytest.mark.django_db(transaction=True)
def test_eval_of_a_run_nobody_can_drive_further_names_the_queue_no_worker_serves(make_version, workspace):
    golden = golden_set_create(workspace=workspace, name="approval set", graders=[{"kind": "contains"}])
    golden_item_add(golden_set=golden, input={"text": "question"}, expected_output="ok")
    version = make_version(graph("a", node("a", prompt="Answer.", approval=True)))
    with pytest.raises(CommandError, match="is still running and no Celery worker serves turns; start the workers"):
        run("eval", "approval set", str(version.pk))


def _worker_answers(deadline: float) -> bool:
    from config.celery import app

    while time.monotonic() < deadline:
        if app.control.ping(timeout=0.5):
            return True
    return False


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_eval_follows_a_run_the_serving_workers_drive_to_its_end(make_version, workspace, settings):
    """Without --workers, while a worker (make run's) serves the turn queue: the command leaves the run to it
    and follows it to its end, however long each slow model call keeps the worker on it."""
    golden = golden_set_create(workspace=workspace, name="slow set", graders=[{"kind": "contains"}])
    for n in range(3):
        golden_item_add(golden_set=golden, input={"text": f"question {n}"}, expected_output="ok")
    version = make_version(graph("a", node("a", prompt="Answer.")))
    with FakeOpenAIChat() as server:
        original = server.routes["/v1/chat/completions"]

        def slow(handler, body):
            time.sleep(1.5)
            return original(handler, body)

        server.routes["/v1/chat/completions"] = slow
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL = server.url("/v1")
        worker = llm_worker("serving", server.url("/v1"))
        try:
            assert _worker_answers(time.monotonic() + 60), "the worker never answered a ping"
            out = run("eval", "slow set", str(version.pk), "--concurrency", "1")
        finally:
            stop_process_groups([worker], timeout=20)
    assert "workers serve" in out
    assert "[" + "#" * 30 + "] 3/3 completed" in out
    assert EvalRun.objects.get().status == "completed" and len(server.chat_payloads) == 3
