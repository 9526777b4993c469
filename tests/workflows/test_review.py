"""Review findings for the workflow runner, its services, tools, API and admin: each test pins the
behaviour a fix must bring and fails until then (strict xfail, so the suite stays green and a fix
that lands turns the xfail into an error that asks for the marker to go).

Crashes are simulated in-process: a step function runs its real body (its side effects commit)
and the worker then "dies" before the checkpoint is written (``WorkerDied``, a BaseException, so
neither the step wrapper nor the workflow's ``except Exception`` sees it); the run's lease is then
expired and the tick's recovery pass hands it to a new turn, as it would after a SIGKILL."""

import json
from datetime import timedelta
from decimal import Decimal

import pytest
from django.utils import timezone

from durable import tick
from durable.inprocess import run_until_settled
from durable.models import DurableRun, StepCheckpoint
from tests.llm.conftest import FakeOpenAIChat
from tests.workflows.conftest import graph, node
from workflows import execution
from workflows.models import ContextEntry, Message, NodeInvocation, WorkflowInvocation
from workflows.services import invocation_cancel, invocation_start


class WorkerDied(BaseException):
    """The worker process died right after a step's side effects and before its checkpoint."""


def die_after(monkeypatch, name: str, *, when=lambda args: True, times: int = 1) -> list:
    """Make `execution.<name>` run for real and then kill the worker (`times` times, when `when(args)`)."""
    real = getattr(execution, name)
    deaths: list = []

    def step(*args):
        result = real(*args)
        if len(deaths) < times and when(args):
            deaths.append(args)
            raise WorkerDied(name)
        return result

    # named as the function it replaces, so a queued step (a real provider's model call, an MCP tool
    # call) resolves its path to this replacement, as a worker of this process would
    step.__module__, step.__qualname__ = real.__module__, real.__qualname__
    monkeypatch.setattr(execution, name, step)
    return deaths


def drive_through_crashes(invocation, *, crashes: int = 1):
    """Drive the invocation's run; each time the worker dies, expire the lease (a turn's) or the step's
    clock (a queued step's) and let the tick's recovery or timeout pass hand the work to a fresh
    worker, as after a SIGKILL."""
    for _ in range(crashes + 1):
        try:
            run_until_settled(invocation.durable_run_id, max_wait=30)
        except WorkerDied:
            past = timezone.now() - timedelta(hours=1)
            DurableRun.objects.filter(status="running").update(locked_until=past)
            StepCheckpoint.objects.filter(status="running", queue__gt="").update(timeout_at=past)
            assert tick.recover_expired_leases() + tick.time_out_silent_steps() >= 1
            continue
        break
    invocation.refresh_from_db()
    return invocation


def nodes_of(invocation):
    return list(NodeInvocation.objects.filter(workflow_invocation=invocation).order_by("seq"))


@pytest.fixture
def chat_server(settings):
    """The real openai client against a local OpenAI-compatible server with scripted replies."""
    with FakeOpenAIChat() as server:
        settings.LLM_PROVIDER = "openai"
        settings.OPENAI_API_KEY = "sk-test"
        settings.OPENAI_BASE_URL = server.url("/v1")
        settings.LLM_MAX_RETRIES = 0
        yield server


@pytest.fixture
def skills(workspace):
    from tests.factories import SkillFactory

    return [SkillFactory(workspace=workspace, name=name, description=f"The {name} skill.",
                         content_md=f"Body of the {name} skill. " * 20, triggers=[])
            for name in ("alpha", "beta")]


@pytest.fixture(autouse=True)
def _in_process(settings, tmp_path):
    settings.DURABLE_DISPATCH_ENABLED = False
    settings.MEDIA_ROOT = str(tmp_path / "media")


# ------------------------------------------------------------------------------------ crash windows


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


@pytest.mark.django_db
def test_after_a_crash_the_recorded_answer_is_the_answer_the_node_used(
        chat_server, make_version, settings, monkeypatch):
    """A model call whose worker died before its checkpoint is made again and may answer
    differently. The assistant message the invocation shows must be the answer the node went on
    with (ideally the recorded one is reused, which also avoids paying twice)."""
    settings.LLM_CACHE_ENABLED = False
    chat_server.chat_replies = [{"content": "first answer"}, {"content": "second answer"}]
    version = make_version(graph("a", node("a", prompt="Answer.")))
    die_after(monkeypatch, "llm_call")
    invocation = drive_through_crashes(invocation_start(version=version, input={"text": "which answer?"}))
    assert invocation.status == "completed", invocation.error
    (ran,) = nodes_of(invocation)
    shown = Message.objects.get(node_invocation=ran, role="assistant").payload["content"]
    assert shown == ran.output == invocation.output["text"]


@pytest.mark.django_db
def test_a_tool_call_recorded_before_a_crash_is_not_run_again(chat_server, make_version, skills, monkeypatch):
    """The worker dies after a tool call ran and its result message was written, before the step's
    checkpoint. The transcript already holds the result at that message seq; the redo must answer
    from it rather than run the tool again (an MCP tool that files a ticket or sends a mail would
    do it twice), and the node must read the result the transcript shows."""
    ran = []
    real = execution.tool_run

    def counting(binding, arguments, **kwargs):
        ran.append(arguments)
        return real(binding, arguments, **kwargs)

    monkeypatch.setattr(execution, "tool_run", counting)
    die_after(monkeypatch, "tool_call")
    chat_server.chat_replies = [{"tool_calls": [("call_1", "skill_load", {"name": "alpha"})]}, {"content": "done"}]
    version = make_version(graph("a", node("a", prompt="Load the skills you need.", tools=["skill_load"])))
    invocation = drive_through_crashes(invocation_start(version=version, input={"text": "x"}))
    assert invocation.status == "completed", invocation.error
    assert len(ran) == 1, f"the tool ran {len(ran)} times"


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


@pytest.mark.django_db
def test_retrying_the_run_of_a_failed_invocation_keeps_run_and_invocation_in_step(chat_server, make_version):
    """The durable API and admin offer `retry` (without new input) on any failed run, so on an
    invocation's run too. Either the retry is refused for a run whose invocation has ended, or the
    invocation follows its run: never a completed run under a failed invocation whose nodes
    say completed."""
    from durable.services import run_retry

    chat_server.chat_replies = [(500, {"Content-Type": "application/json"},
                                 json.dumps({"error": {"message": "upstream hiccup"}}))]
    version = make_version(graph("a", node("a")))
    invocation = invocation_start(version=version, input={"text": "x"})
    run_until_settled(invocation.durable_run_id, max_wait=30)
    invocation.refresh_from_db()
    assert invocation.status == "failed" and "upstream hiccup" in invocation.error

    run_retry(run_id=invocation.durable_run_id)
    run_until_settled(invocation.durable_run_id, max_wait=30)
    invocation.refresh_from_db()
    run = DurableRun.objects.get(pk=invocation.durable_run_id)
    assert run.status == invocation.status, (run.status, invocation.status, [n.status for n in nodes_of(invocation)])


# ------------------------------------------------------------------------------------------- the graph


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


@pytest.mark.django_db
def test_a_parallel_fan_cannot_spend_a_multiple_of_the_usd_budget(chat_server, make_version, invoke, settings):
    """$1 a model call, a $10 budget. The split node spends $1; four branches then each start with
    $9 left and make their five calls ($5 each), all under the limit as each sees it: the invocation
    spends $21 before the join notices. However a fix shares the remainder (split it between the
    branches, or check a shared total), the invocation may overshoot its budget by at most one call
    per branch, never by a multiple of it."""
    settings.LLM_PRICES = {"gpt-4.1-mini": {"input": 1_000_000, "output": 0}}
    settings.LLM_CACHE_ENABLED = False
    chat_server.chat_replies = [{"tool_calls": [("c", "nope", {})],
                                 "usage": {"prompt_tokens": 1, "completion_tokens": 0}}] * 40
    branches = [f"b{i}" for i in range(4)]
    version = make_version(graph(
        "split", node("split", handoffs=branches, kind="parallel", max_steps=1),
        *[node(name, prompt=f"Branch {name}.", tools=["skill_load"], max_steps=5) for name in branches]))
    invocation = invoke(version, {"text": "a question"}, usd_budget="10")
    assert invocation.status == "failed" and "USD budget exceeded" in invocation.error
    assert invocation.usd_cost <= Decimal(10) + len(branches), invocation.usd_cost


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


# ------------------------------------------------------------------------------------------ tool calls


@pytest.mark.django_db
def test_tool_call_ids_reused_across_rounds_keep_their_own_large_outputs(
        chat_server, make_version, invoke, skills, settings):
    """Several OpenAI-compatible servers (Ollama, some vLLM builds) number tool call ids per answer
    (`call_0` in every round). Each call's large output must be stored and shown for that call: the
    second round's `call_0` reads the beta skill, not the alpha skill stored by the first round."""
    settings.WORKFLOW_CONTEXT_INLINE_CHARS = 50
    chat_server.chat_replies = [
        {"tool_calls": [("call_0", "skill_load", {"name": "alpha"})]},
        {"tool_calls": [("call_0", "skill_load", {"name": "beta"})]},
        {"content": "done"},
    ]
    version = make_version(graph("a", node("a", prompt="Load the skills you need.", tools=["skill_load"])))
    invocation = invoke(version, {"text": "x"})
    assert invocation.status == "completed", invocation.error
    tool_messages = list(Message.objects.filter(workflow_invocation=invocation, role="tool").order_by("seq"))
    assert len(tool_messages) == 2
    assert "alpha" in tool_messages[0].payload["content"]
    assert "beta" in tool_messages[1].payload["content"], tool_messages[1].payload["content"][:200]
    assert ContextEntry.objects.filter(workflow_invocation=invocation).count() == 2
    third_request = chat_server.chat_payloads[2]["messages"]
    assert "Body of the beta skill" in third_request[-1]["content"]


@pytest.mark.django_db
def test_a_tool_call_id_with_path_characters_does_not_fail_the_invocation(
        chat_server, make_version, invoke, skills, settings):
    """A model's tool call id is an opaque string. One such as `../../x` must not become part of a
    storage path (it raises SuspiciousFileOperation and fails the whole invocation); the large
    output is stored and the node answers."""
    settings.WORKFLOW_CONTEXT_INLINE_CHARS = 50
    chat_server.chat_replies = [{"tool_calls": [("../../x", "skill_load", {"name": "alpha"})]}, {"content": "done"}]
    version = make_version(graph("a", node("a", prompt="Load the skills you need.", tools=["skill_load"])))
    invocation = invoke(version, {"text": "x"})
    assert invocation.status == "completed", invocation.error
    assert ContextEntry.objects.filter(workflow_invocation=invocation).count() == 1


@pytest.mark.django_db
def test_an_answer_with_more_tool_calls_than_a_node_can_record_runs_none_of_them(
        chat_server, make_version, invoke, skills, monkeypatch):
    """A node invocation holds at most MESSAGES_PER_NODE messages (10,000). A model that answers with
    more tool calls than can be recorded (a loop, a hostile or broken model) must not have them
    executed one by one (each an MCP call with the user's secrets, paid outside work) only to fail
    at the limit: the answer is refused before any call runs. The limit is lowered here to keep
    the test small; the runner's arithmetic is the same at 10,000."""
    monkeypatch.setattr(execution, "MESSAGES_PER_NODE", 40)
    ran = []
    real = execution.tool_run

    def counting(binding, arguments, **kwargs):
        ran.append(arguments)
        return real(binding, arguments, **kwargs)

    monkeypatch.setattr(execution, "tool_run", counting)
    chat_server.chat_replies = [{"tool_calls": [(f"call_{i}", "skill_load", {"name": "alpha"}) for i in range(60)]}]
    version = make_version(graph("a", node("a", prompt="Load the skills you need.", tools=["skill_load"])))
    invocation = invoke(version, {"text": "x"})
    assert invocation.status == "failed"
    assert ran == [], f"{len(ran)} tool calls ran before the node failed with: {invocation.error}"


@pytest.mark.parametrize("garbage", ["\u0000", "\ud800"], ids=["nul", "lone-surrogate"])
@pytest.mark.django_db(transaction=True)
def test_a_model_answer_with_characters_postgres_refuses_does_not_fail_the_invocation(
        chat_server, make_version, invoke, garbage):
    """Models do emit U+0000 and unpaired surrogates (echoing binary tool output, broken decoding).
    Postgres text and jsonb cannot store either, so the runner must drop or replace them before
    writing the transcript, the cache and the node's output: the invocation completes with the rest
    of the answer (the call was paid; failing the invocation on it throws the answer away)."""
    chat_server.chat_replies = [{"content": f"Paris{garbage} is the capital."}]
    version = make_version(graph("a", node("a", prompt="Answer.")))
    invocation = invoke(version, {"text": "capital of France?"})
    assert invocation.status == "completed", invocation.error
    assert "Paris" in invocation.output["text"] and garbage not in invocation.output["text"]


# ------------------------------------------------------------------------------------------ approvals


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


# ----------------------------------------------------------------------------------------- MCP secrets


@pytest.mark.django_db
def test_moving_a_server_to_another_host_does_not_send_other_users_secrets_there(workspace):
    """A colleague saved an Authorization header for the workspace's `search` server. Another staff
    member of the workspace edits the server's URL to a host of their choosing in the admin. The
    colleague's secret must not be sent to the new host on their next call (their secrets are set
    aside, or their config disabled, until they confirm the new address)."""
    from django.test import Client
    from django.urls import reverse

    from tests.workflows.test_admin import staff_user
    from workflows.mcp import McpError
    from workflows.mcp_services import mcp_headers_for
    from workflows.models import McpServer, UserServerConfig

    server = McpServer.objects.create(workspace=workspace, slug="search", display_name="Search",
                                      url="https://mcp.example.test/mcp")
    colleague = staff_user("colleague", workspace)
    UserServerConfig.objects.create(user=colleague, server=server,
                                    secrets=json.dumps({"Authorization": "Bearer colleague-secret"}))
    assert mcp_headers_for(user=colleague, server=server) == {"Authorization": "Bearer colleague-secret"}

    mover = Client()
    mover.force_login(staff_user("mover", workspace))
    response = mover.post(reverse("admin:workflows_mcpserver_change", args=[server.pk]), {
        "workspace": workspace.pk, "slug": "search", "display_name": "Search", "url": "https://collector.example/mcp",
        "description": "", "repository_url": "",
        "versions-TOTAL_FORMS": "0", "versions-INITIAL_FORMS": "0", "versions-MIN_NUM_FORMS": "0",
        "versions-MAX_NUM_FORMS": "1000",
    })
    assert response.status_code == 302, response.content.decode()[:2000]
    server.refresh_from_db()
    assert server.url == "https://collector.example/mcp"
    try:
        headers = mcp_headers_for(user=colleague, server=server)
    except McpError:
        headers = {}
    assert "Bearer colleague-secret" not in headers.values()
