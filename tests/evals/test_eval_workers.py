"""An eval run on real Celery workers: a worker SIGKILLed mid-run; the run resumes without running a
finished item again or repeating a completed model call (counted at the local OpenAI-compatible server)."""

import json
import os
import signal
import threading
import time

import pytest

from config.services import stop_process_groups
from durable import tick
from evals.models import EvalRun, GoldenResult
from evals.services import eval_run_start, golden_item_add, golden_set_create
from tests.llm.conftest import FakeOpenAIChat
from tests.workflows.conftest import graph, node
from tests.workflows.test_runner_openai import _worker
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
        workers = [_worker("first", server.url("/v1"))]
        try:
            assert held.wait(90), "the first worker never reached the fifth item"
            graded_before = set(GoldenResult.objects.filter(eval_run=run).values_list("golden_item_id", flat=True))
            os.killpg(workers[0].pid, signal.SIGKILL)
            workers[0].wait(10)
            workers.append(_worker("second", server.url("/v1")))
            deadline = time.monotonic() + 120
            while time.monotonic() < deadline:
                run.refresh_from_db()
                if run.status in EvalRun.TERMINAL:
                    break
                tick.tick()
                time.sleep(0.3)
        finally:
            release.set()
            stop_process_groups(workers, timeout=20)
    assert run.status == "completed", run.error
    assert len(graded_before) == 4  # two batches of two were graded before the crash
    results = GoldenResult.objects.filter(eval_run=run)
    assert results.count() == 6 and {r.score for r in results} == {1.0}
    # one invocation per item: none was created or run twice
    assert WorkflowInvocation.objects.count() == 6
    assert all(received.count(q) == 1 for q in questions if q != "question number 5")
    assert received.count("question number 5") == 2  # in flight when the worker died, then redone
