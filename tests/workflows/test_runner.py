"""The runner: a workflow version invoked as a durable run, driven in-process (same claims and
checkpoints as the workers), answered by the offline model unless a test says otherwise."""

import sys
from decimal import Decimal
from pathlib import Path

import pytest

from durable.inprocess import run_until_settled
from durable.models import DurableRun, StepCheckpoint
from tests.builders import graph, node
from tests.workflows.invocations import WorkerDied, die_after, drive_through_crashes, nodes_of
from workflows import execution
from workflows.models import Message, NodeInvocation, WorkflowInvocation
from workflows.services import InvocationRefused, invocation_cancel, invocation_decide, invocation_start

pytestmark = pytest.mark.django_db


def test_a_sequential_workflow_runs_each_node_in_order_and_records_everything(make_version, invoke):
    version = make_version(graph("planner",
                                 node("planner", prompt="Plan the answer.", handoffs=["writer"]),
                                 node("writer", prompt="Write the answer.", handoffs=["end"])))
    invocation = invoke(version, {"text": "How do durable runs survive a crash?"})
    assert invocation.status == WorkflowInvocation.Status.COMPLETED, invocation.error
    ran = nodes_of(invocation)
    assert [(n.seq, n.node_id, n.status) for n in ran] == [(1, "planner", "completed"), (2, "writer", "completed")]
    assert all(n.model == "offline-directive-v1" and n.llm_calls == 1 and n.started_at and n.ended_at for n in ran)
    assert ran[0].next_nodes == ["writer"] and ran[1].next_nodes == ["end"]
    assert invocation.output["node_id"] == "writer" and invocation.output["text"] == ran[1].output
    assert invocation.node_count == 2 and invocation.llm_calls == 2
    assert invocation.input_tokens == sum(n.input_tokens for n in ran) > 0
    roles = list(Message.objects.filter(workflow_invocation=invocation).order_by("seq")
                 .values_list("role", "to_node_id"))
    # the input into the planner, its conversation, the hand-off into the writer, its conversation, the result
    assert roles[0] == ("data", "planner")
    assert ("sequential", "writer") in roles and roles[-1] == ("result", "end")
    assert [r for r, _ in roles].count("assistant") == 2
    assert DurableRun.objects.get(pk=invocation.durable_run_id).status == "completed"


def test_costs_add_up_from_the_calls_to_the_nodes_to_the_invocation(make_version, invoke, settings):
    settings.LLM_PRICES = {"offline-directive-v1": {"input": 1000, "output": 2000}}
    settings.LLM_CACHE_ENABLED = False
    version = make_version(graph("a", node("a", handoffs=["b"]), node("b")))
    invocation = invoke(version, {"text": "price check"})
    assert invocation.status == "completed", invocation.error
    ran = nodes_of(invocation)
    calls = Message.objects.filter(workflow_invocation=invocation, role="assistant")
    per_call = [Decimal(m.payload["usage"]["usd_cost"]) for m in calls]
    assert all(cost > 0 for cost in per_call)
    assert sum(n.usd_cost for n in ran) == sum(per_call) == invocation.usd_cost
    assert invocation.output_tokens == sum(m.payload["usage"]["output_tokens"] for m in calls)


@pytest.mark.parametrize("how", ["cancelled", "cancelled from the durable admin"])
def test_an_invocation_ended_mid_node_keeps_the_cost_of_the_calls_it_paid(make_version, settle, settings, how):
    from durable import owners
    from durable.services import run_cancel
    from workflows.services import invocation_cancel

    settings.LLM_PRICES = {"offline-directive-v1": {"input": 1000, "output": 2000}}
    settings.LLM_CACHE_ENABLED = False
    version = make_version(graph("a", node("a", approval=True)))
    invocation = settle(invocation_start(version=version, input={"text": "price check"}))
    assert invocation.status == "waiting"
    (call,) = Message.objects.filter(workflow_invocation=invocation, role="assistant")
    paid = Decimal(call.payload["usage"]["usd_cost"])
    assert paid > 0
    if how == "cancelled":
        assert invocation_cancel(invocation=invocation)
    else:
        run_cancel(run_id=invocation.durable_run_id)
        assert owners.reconcile()["workflows.WorkflowInvocation"] == 1
    invocation.refresh_from_db()
    (ran,) = nodes_of(invocation)
    assert invocation.status == "cancelled" and ran.status == "failed"
    assert ran.usd_cost == invocation.usd_cost == paid and ran.llm_calls == invocation.llm_calls == 1
    assert ran.output_tokens == invocation.output_tokens == call.payload["usage"]["output_tokens"] > 0
    assert ran.model == "offline-directive-v1"


def test_a_parallel_hand_off_fans_out_and_a_wait_for_node_joins_every_branch(make_version, invoke):
    version = make_version(graph(
        "split",
        node("split", handoffs=["left", "right"], kind="parallel"),
        node("left", prompt="Look at the left side.", handoffs=["join"]),
        node("right", prompt="Look at the right side.", handoffs=["join"]),
        node("join", wait_for=["left", "right"], handoffs=["end"]),
    ))
    invocation = invoke(version, {"text": "compare both sides"})
    assert invocation.status == "completed", invocation.error
    ran = nodes_of(invocation)
    assert [(n.seq, n.node_id) for n in ran] == [(1, "split"), (2, "left"), (3, "right"), (4, "join")]
    # the branches ran as child runs of the invocation's run
    children = DurableRun.objects.filter(parent_id=invocation.durable_run_id)
    assert sorted(children.values_list("workflow", flat=True)) == ["workflows.node", "workflows.node"]
    join_inbox = Message.objects.filter(workflow_invocation=invocation, to_node_id="join").order_by("seq")
    assert [(m.from_node_id, m.role) for m in join_inbox] == [("left", "aggregated"), ("right", "aggregated")]
    assert invocation.output["node_id"] == "join"


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_a_node_never_answers_with_the_hand_off_header(make_version, invoke):
    """The runner hands a node its predecessors' outputs as user messages headed `Output of <node>:`.
    That label is framing, not evidence: when the first node has nothing to say (the offline
    model's no-evidence answer), the next nodes answered `Output of a:` and then
    `Output of b: Output of a:`, an answer an eval grades and the next node builds on. They must
    answer as the first did (no evidence), never with the label."""
    version = make_version(graph("a", node("a", handoffs=["b"]), node("b", handoffs=["c"]), node("c")))
    invocation = invoke(version, {"text": "Will it rain tomorrow?"})
    assert invocation.status == "completed", invocation.error
    outputs = {n.node_id: n.output for n in nodes_of(invocation)}
    assert not any("Output of" in text for text in outputs.values()), outputs


def test_a_conditional_hand_off_follows_the_models_choice(make_version, invoke):
    version = make_version(graph(
        "router",
        node("router", handoffs=["billing", "weather", "end"], kind="conditional"),
        node("billing", description="invoices, payments, refunds and billing questions"),
        node("weather", description="weather forecasts, rain, temperature and storms"),
    ))
    invocation = invoke(version, {"text": "Will there be rain and storms tomorrow?"})
    assert invocation.status == "completed", invocation.error
    ran = nodes_of(invocation)
    assert [n.node_id for n in ran] == ["router", "weather"]
    assert ran[0].next_nodes == ["weather"]
    route = Message.objects.filter(node_invocation=ran[0], role="assistant", payload__purpose="route").get()
    assert '"weather"' in route.payload["content"]


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_a_join_waiting_for_a_branch_the_router_did_not_take_is_not_silently_dropped(make_version, invoke):
    """A conditional router takes one of two branches; both hand off to a join that waits for both.
    The join can never fire. The invocation must not report `completed` with the branch's output as
    if the graph had reached its end: either the join runs with what arrived, or the invocation
    fails naming the join and the nodes it still waits for."""
    version = make_version(graph(
        "router",
        node("router", handoffs=["billing", "weather"], kind="conditional"),
        node("billing", description="invoices, payments, refunds and billing questions", handoffs=["join"]),
        node("weather", description="weather forecasts, rain, temperature and storms", handoffs=["join"]),
        node("join", wait_for=["billing", "weather"], handoffs=["end"], prompt="Write the final answer."),
    ))
    invocation = invoke(version, {"text": "Will there be rain and storms tomorrow?"})
    ran = [n.node_id for n in nodes_of(invocation)]
    assert ran[:2] == ["router", "weather"]
    assert "join" in ran or (invocation.status == "failed" and "join" in invocation.error), \
        (invocation.status, ran, invocation.output)


def test_a_cycle_is_stopped_by_the_node_budget(make_version, invoke):
    version = make_version(graph("writer", node("writer", handoffs=["critic"]), node("critic", handoffs=["writer"])))
    invocation = invoke(version, {"text": "loop forever"}, node_budget=5)
    assert invocation.status == "failed"
    assert "node budget exceeded" in invocation.error and "5" in invocation.error
    assert [n.node_id for n in nodes_of(invocation)] == ["writer", "critic", "writer", "critic", "writer"]
    assert DurableRun.objects.get(pk=invocation.durable_run_id).status == "failed"


def test_the_usd_budget_fails_the_invocation_with_that_reason(make_version, invoke, settings):
    settings.LLM_PRICES = {"offline-directive-v1": {"input": 100000, "output": 100000}}
    settings.LLM_CACHE_ENABLED = False
    version = make_version(graph("a", node("a", handoffs=["b"]), node("b", handoffs=["end"])))
    invocation = invoke(version, {"text": "an expensive question"}, usd_budget="0.0001")
    assert invocation.status == "failed"
    assert invocation.error.startswith("USD budget exceeded")
    first = nodes_of(invocation)[0]
    assert first.status == "failed" and "USD budget exceeded" in first.error and first.usd_cost > 0
    assert invocation.usd_cost == first.usd_cost


def test_a_version_with_missing_tools_or_models_is_refused_before_anything_runs(make_version, settings):
    # with real providers, a prefix no provider serves is a missing model (offline, the offline model answers it)
    settings.LLM_PROVIDER, settings.OPENAI_API_KEY = "openai", "sk-test"
    version = make_version(graph(
        "a", node("a", tools=["csvReader", "knowledge_search"], mcp=["tavily"], handoffs=["b"]),
        node("b", model="nowhere#some/model")))
    with pytest.raises(InvocationRefused) as refused:
        invocation_start(version=version, input={"text": "x"})
    errors = refused.value.errors
    assert any("a.csvReader" in e for e in errors["tools"]) and any("a.tavily" in e for e in errors["tools"])
    assert not any("knowledge_search" in e for e in errors["tools"])
    assert any(e.startswith("b.nowhere#some/model") for e in errors["models"])
    assert not WorkflowInvocation.objects.exists() and not DurableRun.objects.exists()


def test_starting_a_version_without_mcp_tools_does_not_load_the_mcp_client(make_version, monkeypatch):
    # the MCP client's import builds hundreds of pydantic models (seconds): a web process's first start of a
    # workflow that names no MCP tool must not pay it
    version = make_version(graph("a", node("a", tools=["knowledge_search"])))
    monkeypatch.setitem(sys.modules, "workflows.mcp_services", None)  # importing it now raises ImportError
    invocation = invocation_start(version=version, input={"text": "x"})
    assert invocation.status == "queued"


def test_budgets_and_input_are_validated(make_version):
    version = make_version(graph("a", node("a")))
    for kwargs, field in [({"node_budget": 0}, "node_budget"), ({"node_budget": "3"}, "node_budget"),
                          ({"usd_budget": "-1"}, "usd_budget"), ({"usd_budget": "NaN"}, "usd_budget"),
                          ({"usd_budget": "lots"}, "usd_budget"), ({"input": {1, 2}}, "input")]:
        with pytest.raises(InvocationRefused) as refused:
            invocation_start(version=version, **({"input": {}} | kwargs))
        assert field in refused.value.errors


def test_an_approved_node_hands_off_and_a_rejected_one_fails_the_invocation(make_version, settle, owner):
    version = make_version(graph("draft", node("draft", approval=True, handoffs=["publish"]), node("publish")))
    approved = settle(invocation_start(version=version, input={"text": "announce the release"}))
    assert approved.status == "waiting"
    waiting = nodes_of(approved)[0]
    assert waiting.status == "waiting" and waiting.output and waiting.approval["pending"]
    invocation_decide(invocation=approved, decision="approve", comment="ship it", user=owner)
    approved = settle(approved)
    assert approved.status == "completed", approved.error
    first, second = nodes_of(approved)
    assert first.approval["decision"] == "approve" and first.approval["comment"] == "ship it"
    assert first.status == "completed" and second.node_id == "publish"

    rejected = settle(invocation_start(version=version, input={"text": "announce something else"}))
    invocation_decide(invocation=rejected, decision="reject", comment="not this week", user=owner)
    rejected = settle(rejected)
    assert rejected.status == "failed" and "not this week" in rejected.error and owner.username in rejected.error
    assert [n.status for n in nodes_of(rejected)] == ["rejected"]


def test_a_node_takes_one_decision(make_version, settle, owner):
    from workflows.services import InvalidInvocationState

    version = make_version(graph("draft", node("draft", approval=True)))
    invocation = settle(invocation_start(version=version, input={"text": "x"}))
    invocation_decide(invocation=invocation, decision="approve", user=owner)
    with pytest.raises(InvalidInvocationState):
        invocation_decide(invocation=invocation, decision="reject", user=owner)
    assert settle(invocation).status == "completed"


RELEASE = ("The release ships on Friday. The documentation moved to docs.example.test. "
           "Support for Python 3.9 ends. Announce the release.")


def test_a_revised_node_answers_the_comment_waits_again_and_completes_with_the_revised_answer(
        make_version, settle, owner):
    version = make_version(graph("draft", node("draft", approval=True, prompt="Answer in one sentence.")))
    invocation = settle(invocation_start(version=version, input={"text": RELEASE}))
    first = nodes_of(invocation)[0].output
    for blank in ("", "   "):
        with pytest.raises(InvocationRefused) as refused:
            invocation_decide(invocation=invocation, decision="revise", comment=blank, user=owner)
        assert list(refused.value.errors) == ["comment"]

    invocation_decide(invocation=invocation, decision="revise", comment="Say where the documentation moved.",
                      user=owner)
    invocation = settle(invocation)
    assert invocation.status == "waiting", invocation.error
    (draft,) = nodes_of(invocation)
    assert draft.status == "waiting" and draft.approval["pending"] and draft.approval["revision"] == 1
    assert "documentation moved" in draft.output and draft.output != first
    assert [(entry["decision"], entry["comment"]) for entry in draft.approval["history"]] == [
        ("revise", "Say where the documentation moved.")]
    feedback = Message.objects.get(node_invocation=draft, role="user", payload__revision=1)
    assert feedback.payload["content"] == "An operator asked for a revision: Say where the documentation moved."
    assert feedback.payload["by_name"] == owner.username
    answers = list(Message.objects.filter(node_invocation=draft, role="assistant").order_by("seq"))
    assert [answer.payload["content"] for answer in answers] == [first, draft.output]
    assert answers[0].seq < feedback.seq < answers[1].seq

    invocation_decide(invocation=invocation, decision="approve", comment="good", user=owner)
    invocation = settle(invocation)
    assert invocation.status == "completed", invocation.error
    assert invocation.output["text"] == draft.output and invocation.llm_calls == 2
    (draft,) = nodes_of(invocation)
    assert draft.status == "completed" and draft.approval["decision"] == "approve" and draft.llm_calls == 2
    names = list(StepCheckpoint.objects.filter(run_id=invocation.durable_run_id).order_by("seq")
                 .values_list("name", flat=True))
    assert names == ["begin", "node:1:start", "node:1:llm:0", "node:1:await", "approval:1", "node:1:decision:0",
                     "node:1:r1:llm:0", "node:1:r1:await", "approval:1:1", "node:1:r1:decision:0", "node:1:end",
                     "finish"]


def test_a_revision_counts_against_the_invocations_usd_budget(make_version, settle, owner, settings):
    settings.LLM_PRICES = {"offline-directive-v1": {"input": 10_000, "output": 10_000}}  # about $0.40 an answer
    version = make_version(graph("draft", node("draft", approval=True)))
    invocation = settle(invocation_start(version=version, input={"text": RELEASE}, usd_budget="0.5"))
    assert invocation.status == "waiting", invocation.error
    invocation_decide(invocation=invocation, decision="revise", comment="Shorter, please.", user=owner)
    invocation = settle(invocation)
    assert invocation.status == "failed" and "USD budget exceeded" in invocation.error


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_a_worker_dying_right_after_recording_an_approval_leaves_no_node_waiting_forever(make_version, settle, owner,
                                                                                        monkeypatch):
    version = make_version(graph("draft", node("draft", approval=True)))
    invocation = settle(invocation_start(version=version, input={"text": RELEASE}))
    invocation_decide(invocation=invocation, decision="approve", user=owner)
    deaths = die_after(monkeypatch, "node_record_approval")
    invocation = drive_through_crashes(invocation)
    assert deaths and invocation.status == "completed", (invocation.status, invocation.error)


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_a_crash_around_a_revise_asks_the_model_once_per_answer_and_never_hangs(make_version, settle, owner,
                                                                               monkeypatch):
    """The worker dies right after recording the revise decision (before its checkpoint), then right after
    the revision's model call: the redo finds the recorded decision (it used to find none and wait for a
    signal already consumed, forever) and the answer in the transcript, so the model is asked once."""
    version = make_version(graph("draft", node("draft", approval=True)))
    invocation = settle(invocation_start(version=version, input={"text": RELEASE}))
    asked = []
    real_chat = execution.chat
    monkeypatch.setattr(execution, "chat", lambda *args, **kwargs: asked.append(1) or real_chat(*args, **kwargs))
    invocation_decide(invocation=invocation, decision="revise", comment="Mention Python.", user=owner)
    recorded, called = die_after(monkeypatch, "node_record_approval"), die_after(monkeypatch, "llm_call")
    invocation = drive_through_crashes(invocation, crashes=2)
    assert recorded and called and invocation.status == "waiting", invocation.error
    assert len(asked) == 1
    (draft,) = nodes_of(invocation)
    assert draft.approval["revision"] == 1 and "Python" in draft.output
    assert Message.objects.filter(node_invocation=draft, role="assistant").count() == 2

    die_after(monkeypatch, "node_record_approval")
    invocation_decide(invocation=invocation, decision="approve", user=owner)
    invocation = drive_through_crashes(invocation)
    assert invocation.status == "completed", invocation.error
    assert invocation.output["text"] == draft.output and len(asked) == 1


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_an_approval_sent_around_invocation_decide_cannot_forge_the_approver(make_version, settle, owner, member,
                                                                            api_as):
    """`invocation_decide` records who decided. The same signal can be sent to the invocation's run
    through /api/durable/runs/<id>/signal/ by any member, with any payload: the node must not record
    (nor the rejection message name) an approver who never decided; only decisions registered by
    invocation_decide count (a stray signal is ignored and the node keeps waiting)."""
    version = make_version(graph("draft", node("draft", approval=True, handoffs=["publish"]), node("publish")))
    invocation = settle(invocation_start(version=version, input={"text": "announce the release"}, user=member))
    assert invocation.status == "waiting"
    response = api_as(member).post(f"/api/durable/runs/{invocation.durable_run_id}/signal/", {
        "name": "approval:1",
        "payload": {"decision": "reject", "comment": "no", "by": owner.pk, "by_name": owner.username},
    }, format="json")
    assert response.status_code == 200, response.content
    invocation = settle(invocation)
    (draft,) = [n for n in nodes_of(invocation) if n.node_id == "draft"]
    assert (draft.approval or {}).get("by") != owner.pk
    assert owner.username not in invocation.error


def test_identical_calls_are_answered_by_the_cache_the_second_time(make_version, invoke, settings):
    settings.LLM_PRICES = {"offline-directive-v1": {"input": 1000, "output": 1000}}
    version = make_version(graph("a", node("a", handoffs=["b"]), node("b")))
    first = invoke(version, {"text": "cache me"})
    second = invoke(version, {"text": "cache me"})
    assert first.cache_hits == 0 and first.usd_cost > 0
    assert second.cache_hits == 2 and second.usd_cost == 0 and second.output == first.output
    from workflows.models import LlmCall

    assert sorted(LlmCall.objects.values_list("hits", flat=True)) == [1, 1]


def test_every_model_call_is_a_checkpointed_step(make_version, invoke):
    version = make_version(graph("a", node("a", handoffs=["b"]), node("b")))
    invocation = invoke(version, {"text": "checkpoints"})
    names = list(StepCheckpoint.objects.filter(run_id=invocation.durable_run_id).order_by("seq")
                 .values_list("name", flat=True))
    assert names == ["begin", "node:1:start", "node:1:llm:0", "node:1:end", "node:2:start", "node:2:llm:0",
                     "node:2:end", "finish"]


@pytest.fixture
def corpus(workspace):
    """Two indexed documents in the workspace's knowledge base."""
    from durable.inprocess import run_until_settled
    from knowledge.services import source_create_text

    texts = {
        "Durable engine": "The durable engine stores every step checkpoint in Postgres. A crashed worker loses "
                          "nothing because another worker replays the run from its checkpoints.",
        "Billing handbook": "Invoices are sent on the first day of each month. Refunds take five business days.",
    }
    for title, text in texts.items():
        source, _ = source_create_text(workspace=workspace, text=text, title=title)
        run_until_settled(source.ingest_run_id, max_wait=30)
    return texts


def test_knowledge_search_is_called_when_the_prompt_asks_and_the_answer_comes_from_its_hits(
        make_version, invoke, corpus):
    asks = make_version(graph("a", node("a", tools=["knowledge_search"],
                                        prompt="Call knowledge_search before answering. Cite your sources.")))
    invocation = invoke(asks, {"text": "How long do refunds take?"})
    assert invocation.status == "completed", invocation.error
    (ran,) = nodes_of(invocation)
    assert ran.tool_calls == 1 and ran.llm_calls == 2
    tool = Message.objects.get(node_invocation=ran, role="tool")
    assert tool.payload["name"] == "knowledge_search" and "Billing handbook" in tool.payload["content"]
    assert "Refunds take five business days" in invocation.output["text"]
    assert "Sources: [1] Billing handbook" in invocation.output["text"]

    # the same node without the tool cannot look anything up: a different, uninformed answer
    silent = make_version(graph("a", node("a", prompt="Call knowledge_search before answering.")))
    other = invoke(silent, {"text": "How long do refunds take?"})
    assert other.status == "completed" and "five business days" not in other.output["text"]
    assert nodes_of(other)[0].tool_calls == 0


def test_a_large_tool_output_goes_to_the_context_store_and_the_node_sees_its_beginning(
        make_version, invoke, corpus, settings):
    from workflows.models import ContextEntry

    settings.WORKFLOW_CONTEXT_INLINE_CHARS = 100
    settings.WORKFLOW_SUMMARY_CHARS = 60
    version = make_version(graph("a", node("a", tools=["knowledge_search"], prompt="Use knowledge_search.")))
    invocation = invoke(version, {"text": "What does the durable engine store?"})
    assert invocation.status == "completed", invocation.error
    entry = ContextEntry.objects.get(workflow_invocation=invocation)
    stored = entry.data.read().decode()
    assert entry.size == len(stored.encode()) > 100 and '"hits"' in stored
    assert entry.summary == stored[:60] and entry.metadata["tool"] == "knowledge_search"
    tool = Message.objects.get(workflow_invocation=invocation, role="tool")
    assert tool.payload["context_key"] == entry.key and entry.key in tool.payload["content"]
    assert len(tool.payload["content"]) < len(stored)


def test_a_context_blob_written_before_a_crash_is_overwritten_by_the_redo_never_orphaned(
        make_version, settings, tmp_path, monkeypatch):
    from workflows.execution import context_store
    from workflows.models import ContextEntry

    settings.MEDIA_ROOT = str(tmp_path)
    invocation = invocation_start(version=make_version(graph("a", node("a"))), input={"text": "x"})
    saved = ContextEntry.save

    def die(self, *args, **kwargs):
        raise WorkerDied

    monkeypatch.setattr(ContextEntry, "save", die)
    with pytest.raises(WorkerDied):  # the blob is in storage, its row never committed
        context_store(invocation.pk, None, key="node-1-0.0", data="first " * 100)
    monkeypatch.setattr(ContextEntry, "save", saved)
    entry = context_store(invocation.pk, None, key="node-1-0.0", data="again " * 100)  # the step's redo
    files = [path for path in tmp_path.rglob("*") if path.is_file()]
    assert files == [Path(entry.data.path)]
    assert entry.data.read().decode() == "again " * 100 and entry.summary.startswith("again")
    other = context_store(invocation.pk, None, key="node 1 0.0", data="other " * 100)  # a key cleaned alike
    assert other.data.name != entry.data.name and len([p for p in tmp_path.rglob("*") if p.is_file()]) == 2


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_a_model_call_repeated_after_a_crash_is_not_recorded_as_a_free_cache_hit(
        make_version, invoke, settle, settings, monkeypatch):
    """The worker dies after a model call was paid (and stored in the LLM cache) and before its
    checkpoint. The redo finds the answer in the cache; the invocation must still count the call
    it paid for: its cost and tokens are those of an uncrashed run, and no cache hit is claimed."""
    settings.LLM_PRICES = {"offline-directive-v1": {"input": 1000, "output": 2000}}
    version = make_version(graph("a", node("a", prompt="Answer briefly.")))
    settings.LLM_CACHE_ENABLED = False
    baseline = invoke(version, {"text": "what does a crash cost?"})
    assert baseline.status == "completed" and baseline.usd_cost > 0

    settings.LLM_CACHE_ENABLED = True
    deaths = die_after(monkeypatch, "llm_call")
    invocation = drive_through_crashes(invocation_start(version=version, input={"text": "what does a crash cost?"}))
    assert deaths and invocation.status == "completed", invocation.error
    assert invocation.cache_hits == 0
    assert (invocation.usd_cost, invocation.input_tokens) == (baseline.usd_cost, baseline.input_tokens)


def test_a_skill_the_task_matches_is_included_in_the_prompt_and_others_are_offered(make_version, invoke, workspace):
    from knowledge.services import skill_create_from_text

    for name, description, trigger in [("refund-policy", "Refund rules for support agents.", "refund"),
                                       ("tone", "House style for replies.", "style")]:
        skill_create_from_text(workspace=workspace, content=(
            f"---\nname: {name}\ndescription: {description}\ntriggers: [{trigger}]\n---\n"
            f"Body of {name}: always be precise.\n"))
    version = make_version(graph("a", node("a", prompt="Help the customer.", skills=["refund-policy", "tone"])))
    invocation = invoke(version, {"text": "Can I get a refund?"})
    assert invocation.status == "completed", invocation.error
    system = Message.objects.get(workflow_invocation=invocation, role="system").payload["content"]
    assert "## Skill: refund-policy" in system and "Body of refund-policy" in system
    assert "Body of tone" not in system and "- tone: House style for replies." in system


def test_a_run_of_another_workspace_cannot_drive_an_invocation(make_version, other_workspace):
    from durable.inprocess import run_until_settled
    from durable.services import run_start
    from workflows.durable_workflows import INVOKE_WORKFLOW

    version = make_version(graph("a", node("a", approval=True)))
    invocation = invocation_start(version=version, input={"text": "x"})
    stranger = run_start(workflow=INVOKE_WORKFLOW, input={"invocation_id": invocation.pk},
                         namespace=other_workspace.namespace)
    assert run_until_settled(stranger.pk).status == "failed"
    invocation.refresh_from_db()
    assert invocation.status == "queued" and not NodeInvocation.objects.filter(workflow_invocation=invocation).exists()


def test_cancelling_an_invocation_cancels_its_run_and_ends_its_waiting_node(make_version, settle):
    from workflows.services import invocation_cancel

    version = make_version(graph("a", node("a", approval=True)))
    invocation = settle(invocation_start(version=version, input={"text": "x"}))
    assert invocation.status == "waiting"
    assert invocation_cancel(invocation=invocation, reason="not needed") is True
    assert invocation.status == "cancelled" and invocation.error == "not needed" and invocation.ended_at
    assert DurableRun.objects.get(pk=invocation.durable_run_id).status == "cancelled"
    assert [n.status for n in nodes_of(invocation)] == ["failed"]
    assert invocation_cancel(invocation=invocation) is False


@pytest.mark.usefixtures("in_process")
@pytest.mark.django_db
def test_a_cancel_that_lands_during_a_model_call_leaves_no_node_waiting(make_version, monkeypatch):
    """An operator cancels while a worker waits for a node's model call. The turn goes on with its
    plain (unfenced) steps until the lease keeper notices (up to a third of DURABLE_LEASE_SECONDS)
    or a fenced write is refused: here the node's approval step marks it waiting after the cancel
    already ended it. The cancelled invocation must not show a node invocation that is running or
    waiting (nothing will ever end it, and its approve button answers 409)."""
    version = make_version(graph("a", node("a", handoffs=["b"]), node("b", approval=True)))
    real = execution.llm_call

    def llm_call(workspace_id, invocation_id, node_pk, node_seq, *rest):
        if node_seq == 2:  # the cancel arrives while the second node's model call is in flight
            invocation_cancel(invocation=WorkflowInvocation.objects.get(pk=invocation_id), reason="stop")
        return real(workspace_id, invocation_id, node_pk, node_seq, *rest)

    monkeypatch.setattr(execution, "llm_call", llm_call)
    invocation = invocation_start(version=version, input={"text": "x"})
    run_until_settled(invocation.durable_run_id, max_wait=30)
    invocation.refresh_from_db()
    assert invocation.status == "cancelled"
    assert DurableRun.objects.get(pk=invocation.durable_run_id).status == "cancelled"
    assert [(n.node_id, n.status) for n in nodes_of(invocation) if n.status in ("running", "waiting")] == []


@pytest.mark.django_db(transaction=True)
def test_a_cancel_that_deadlocks_with_a_node_ending_is_done_again_not_a_server_error(make_version, settle):
    """A node's end takes its row's lock, then its invocation's (the totals); a cancel takes the invocation's, then
    the open nodes'. When the two cross, Postgres aborts the one that waited first, here the cancel: it is done
    again once the node's end committed, as an operator's click expects, never a 500."""
    import threading
    import time

    from django.db import connection, transaction
    from django.db.models import F

    from workflows.services import invocation_cancel

    version = make_version(graph("a", node("a", approval=True)))
    invocation = settle(invocation_start(version=version, input={"text": "x"}))
    (waiting,) = nodes_of(invocation)
    holding, crossed = threading.Event(), threading.Event()

    def node_end():
        try:
            with transaction.atomic():
                NodeInvocation.objects.filter(pk=waiting.pk).update(error=F("error"))
                holding.set()
                time.sleep(0.4)  # the cancel is waiting on the node's row by now
                WorkflowInvocation.objects.filter(pk=invocation.pk).update(usd_cost=F("usd_cost"))
                crossed.set()
        finally:
            connection.close()

    thread = threading.Thread(target=node_end)
    thread.start()
    assert holding.wait(10)
    assert invocation_cancel(invocation=invocation, reason="not needed") is True
    thread.join(10)
    assert crossed.is_set()  # the node's end went through: the cancel was the one aborted
    assert invocation.status == "cancelled" and [n.status for n in nodes_of(invocation)] == ["failed"]


def test_an_invocation_whose_run_ended_elsewhere_takes_its_end(make_version, settle):
    from durable import owners
    from durable.services import run_cancel

    version = make_version(graph("a", node("a", approval=True)))
    cancelled = settle(invocation_start(version=version, input={"text": "x"}))
    waiting = settle(invocation_start(version=version, input={"text": "y"}))
    run_cancel(run_id=cancelled.durable_run_id, reason="from the durable admin")
    assert owners.reconcile()["workflows.WorkflowInvocation"] == 1
    cancelled.refresh_from_db()
    waiting.refresh_from_db()
    assert cancelled.status == "cancelled" and cancelled.durable_run_id in cancelled.error
    assert waiting.status == "waiting"
    assert owners.reconcile()["workflows.WorkflowInvocation"] == 0


def test_the_reconcile_reaches_an_invocation_behind_any_number_of_active_ones(make_version, settle):
    from durable import owners
    from durable.services import run_cancel

    version = make_version(graph("a", node("a", approval=True)))
    waiting = settle(invocation_start(version=version, input={"text": "x"}))
    cancelled = settle(invocation_start(version=version, input={"text": "y"}))
    run_cancel(run_id=cancelled.durable_run_id, reason="from the durable admin")
    assert owners.reconcile(limit=1)["workflows.WorkflowInvocation"] == 1
    cancelled.refresh_from_db()
    waiting.refresh_from_db()
    assert cancelled.status == "cancelled" and waiting.status == "waiting"


def test_a_failure_at_the_start_is_recorded_on_the_invocation(make_version, invoke, monkeypatch):
    from durable import owners

    def broken(*args):
        raise RuntimeError("the database said no")

    monkeypatch.setattr(owners.owner_of(WorkflowInvocation), "plan", broken)
    invocation = invoke(make_version(graph("a", node("a"))), {"text": "x"})
    assert invocation.status == "failed" and "the database said no" in invocation.error


def test_a_second_run_cannot_drive_an_invocation_another_run_drives(make_version, workspace):
    from durable.inprocess import run_until_settled
    from durable.services import run_start
    from workflows.durable_workflows import INVOKE_WORKFLOW

    invocation = invocation_start(version=make_version(graph("a", node("a", approval=True))), input={"text": "x"})
    intruder = run_start(workflow=INVOKE_WORKFLOW, input={"invocation_id": invocation.pk},
                         namespace=workspace.namespace)
    run = run_until_settled(intruder.pk)
    assert run.status == "failed" and "is driven by run" in run.error
    invocation.refresh_from_db()
    assert invocation.status == "queued" and invocation.durable_run_id != intruder.pk


def test_an_open_nodes_calls_count_an_answer_from_the_cache_as_paying_nothing(make_version, settle, settings):
    """node_calls counts as the runner does: a cached answer keeps its original usage, but it is a call that
    paid nothing (the admin's open-node figures and a cancelled node's totals read it; it used to sum it)."""
    from workflows.selectors import node_calls

    settings.LLM_PRICES = {"offline-directive-v1": {"input": 1000, "output": 2000}}
    settings.LLM_CACHE_ENABLED = False
    invocation = settle(invocation_start(version=make_version(graph("a", node("a", approval=True))),
                                         input={"text": "price check"}))
    (call,) = Message.objects.filter(workflow_invocation=invocation, role="assistant")
    (ran,) = nodes_of(invocation)
    Message.objects.create(workflow_invocation=invocation, node_invocation=ran, seq=call.seq + 1, role="assistant",
                           payload={**call.payload, "cache_hit": True})
    calls = node_calls(invocation_id=invocation.pk)[ran.pk]
    assert (calls.calls, calls.cache_hits) == (2, 1)
    assert calls.usd_cost == Decimal(call.payload["usage"]["usd_cost"]) > 0
    assert calls.output_tokens == call.payload["usage"]["output_tokens"]
