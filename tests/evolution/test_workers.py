"""An evolution run on real Celery workers: a worker SIGKILLed mid-generation; the run resumes with the
same choices, evaluates no individual twice and repeats no completed model call (counted at the local
OpenAI-compatible server)."""

import hashlib
import threading
from collections import Counter

import pytest

from durable.models import StepCheckpoint
from evals.models import EvalRun
from evals.services import golden_item_add, golden_set_create
from evolution.models import Individual
from evolution.services import evolution_start
from tests.builders import graph, node
from tests.openai_server import FakeOpenAIChat
from tests.workflows.workers import kill_mid_call_and_finish


@pytest.mark.worker
@pytest.mark.django_db(transaction=True)
def test_a_worker_killed_mid_generation_resumes_without_repeating_an_evaluation_or_a_call(
        make_version, workspace, settings):
    settings.DURABLE_LEASE_SECONDS = 2
    settings.DURABLE_STEP_DEFAULT_TIMEOUT = 3
    settings.DURABLE_REDISPATCH_AFTER_SECONDS = 3
    golden = golden_set_create(workspace=workspace, name="crash set", graders=[{"kind": "contains"}])
    for n in range(3):
        golden_item_add(golden_set=golden, input={"text": f"question {n}"}, expected_output="ok")
    base = make_version(graph("a", node("a", prompt="You answer.")), name="evolving")
    held, release = threading.Event(), threading.Event()
    received: list[str] = []
    with FakeOpenAIChat() as server:
        original = server.routes["/v1/chat/completions"]

        def hold_one_in_generation_one(handler, body):
            received.append(hashlib.sha256(body).hexdigest())
            if len(received) == 11 and not held.is_set():  # generation 0 made 9 calls (3 versions x 3 items)
                held.set()
                release.wait(30)  # the worker is killed while it waits
            return original(handler, body)

        server.routes["/v1/chat/completions"] = hold_one_in_generation_one
        settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
        settings.OPENAI_BASE_URL = server.url("/v1")
        run = evolution_start(workflow=base.workflow, golden_set=golden, config={
            "population": 3, "generations": 2, "seed": 5, "crossover_rate": 0.0, "mutation_rate": 1.0,
            "initial_immigrants": 0.0, "mutation_weights": {"prompt": 1.0}})  # distinct prompts: distinct calls
        kill_mid_call_and_finish(run, base_url=server.url("/v1"), in_flight=held, release=release)
        held_request = received[10]
    assert run.status == "completed", run.error
    counts = Counter(received)
    assert counts[held_request] == 2  # the call in flight when the worker died, then its redo
    assert [c for request, c in counts.items() if request != held_request and c > 1] == []
    # every individual evaluated once on the full set; breeding ran once per generation
    full = EvalRun.objects.filter(origin="evolution").exclude(config__has_key="item_ids")
    versions = set(Individual.objects.filter(evolution_run=run).values_list("workflow_version_id", flat=True))
    assert full.count() == len(versions) == run.evaluations
    breeds = StepCheckpoint.objects.filter(run_id=run.durable_run_id, name__startswith="breed:")
    assert breeds.count() == 1 and breeds.get().status == "completed"
