"""An eval run on real Celery workers: a worker SIGKILLed mid-run; the run resumes without running a
finished item again or repeating a completed model call (counted at the local OpenAI-compatible server)."""

import json
import threading
import time

import pytest

from evals.models import GoldenItem, GoldenResult
from evals.services import eval_run_start, golden_item_add, golden_set_create
from tests.builders import graph, node
from tests.openai_server import FakeOpenAIChat
from tests.workflows.workers import kill_mid_call_and_finish
from workflows.models import WorkflowInvocation


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_eval_run_resumes_without_redoing_finished_items(make_version, workspace, settings):
    settings.DURABLE_LEASE_SECONDS = 2
    settings.DURABLE_STEP_DEFAULT_TIMEOUT = 3
    settings.DURABLE_REDISPATCH_AFTER_SECONDS = 3  # the tick re-sends a wake lost with the killed worker
    questions = [f"question number {n}" for n in range(1, 7)]
    golden = golden_set_create(workspace=workspace, name="crash set", graders=[{"kind": "contains"}])
    for question in questions:
        golden_item_add(golden_set=golden, input={"text": question}, expected_output="ok")
    version = make_version(graph("a", node("a", prompt="Answer.")))
    held, release = threading.Event(), threading.Event()
    received = []
    with FakeOpenAIChat() as server:
        original = server.routes["/v1/chat/completions"]

        def hold_the_fifth(handler, body):
            received.append(json.loads(body)["messages"][-1]["content"])
            if b"question number 5" in body and not held.is_set():
                held.set()
                release.wait(30)  # the worker is killed while it waits
            return original(handler, body)

        server.routes["/v1/chat/completions"] = hold_the_fifth
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL = server.url("/v1")
        run = eval_run_start(golden_set=golden, version=version, concurrency=2)
        graded_before = set()

        def look():
            graded_before.update(GoldenResult.objects.filter(eval_run=run).values_list("golden_item_id", flat=True))

        kill_mid_call_and_finish(run, base_url=server.url("/v1"), in_flight=held, release=release, before_kill=look)
    assert run.status == "completed", run.error
    graded_questions = set(GoldenItem.objects.filter(pk__in=graded_before).values_list("input__text", flat=True))
    # two lanes: 1, 3, 5 and 2, 4, 6; the first had graded 1 and 3 when its call for 5 was held, the other ran on
    assert {"question number 1", "question number 3"} <= graded_questions
    assert "question number 5" not in graded_questions
    results = GoldenResult.objects.filter(eval_run=run)
    assert results.count() == 6 and {r.score for r in results} == {1.0}
    # one invocation per item: none was created or run twice
    assert WorkflowInvocation.objects.count() == 6
    assert all(received.count(q) == 1 for q in questions if q != "question number 5")
    assert received.count("question number 5") == 2  # in flight when the worker died, then redone


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_an_eval_runs_items_do_not_wait_for_the_slowest_item_of_a_batch(make_version, workspace, settings):
    from tests.workflows.workers import drive_until_ended, split_workers_running

    golden = golden_set_create(workspace=workspace, name="uneven set", graders=[{"kind": "contains"}])
    for number in range(1, 7):
        golden_item_add(golden_set=golden, input={"text": f"question number {number}"}, expected_output="ok")
    version = make_version(graph("a", node("a", prompt="Answer.")))
    with FakeOpenAIChat() as server:
        original = server.routes["/v1/chat/completions"]

        def first_is_slow(handler, body):
            if b"question number 1" in body:
                time.sleep(8)
            return original(handler, body)

        server.routes["/v1/chat/completions"] = first_is_slow
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL = server.url("/v1")
        run = eval_run_start(golden_set=golden, version=version, concurrency=2)
        with split_workers_running("uneven", server.url("/v1"), in_flight=8):
            drive_until_ended([run], timeout=120)
        assert run.status == "completed", run.error
        started = {payload["messages"][-1]["content"]: start for start, _end, payload in server.calls}
        ended = {payload["messages"][-1]["content"]: end for _start, end, payload in server.calls}
        # the other lane took items 2, 4 and 6 while item 1 was still with the provider (in batches of
        # two, items 3 and 4 waited for item 1 to end)
        assert started["question number 4"] < ended["question number 1"]
        assert started["question number 6"] < ended["question number 1"]
