"""The writes of a workflow invocation, each called as one durable step by the runner
(workflows/durable_workflows.py).

Every function here may run more than once for the same step (a worker can die after its work
and before its checkpoint), so each is idempotent: rows are keyed by (invocation, seq) and
written with get-or-create / ignore-conflicts, totals are recomputed from the node invocations
instead of incremented. Only ``llm_call`` and ``tool_call`` do paid or outside work, and the
checkpoint of their step is what stops a replay from doing it again.

Message numbering: a node invocation `n` owns the message seqs n * 10,000 .. n * 10,000 + 9,999
(hand-off messages into it first, then its conversation), so parallel branches never collide
and the invocation's messages sort in node order.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import re
import time
from datetime import UTC, datetime, timedelta
from decimal import Decimal
from typing import Any, TypedDict

from django.db import connection, models, transaction

from config import telemetry
from durable import TryLater, deferrals, release_connection
from llm.chat import CallPutOff, ChatRequest, PutOff, ToolSpec, chat, clean_text
from workflows.conf import workflow_settings
from workflows.llm_cache import ChatCache
from workflows.models import ContextEntry, Message, NodeInvocation, NodeVersion, WorkflowInvocation
from workflows.selectors import node_calls
from workflows.tools import ToolError, node_tools, tool_run

MESSAGES_PER_NODE = 10_000


def now() -> datetime:
    return datetime.now(UTC)


def message_seq(node_seq: int, offset: int) -> int:
    if offset >= MESSAGES_PER_NODE:
        raise ValueError(f"a node invocation holds at most {MESSAGES_PER_NODE} messages")
    return node_seq * MESSAGES_PER_NODE + offset


def input_text(value) -> str:
    """The text a workflow's input gives its entry node: a string as is; an object's `text`,
    `input`, `question`, `query` or `message` field when it has one; anything else as JSON."""
    if isinstance(value, str):
        return value
    if isinstance(value, dict):
        for key in ("text", "input", "question", "query", "message"):
            if isinstance(value.get(key), str):
                return value[key]
    return json.dumps(value, ensure_ascii=False, sort_keys=True)


# --------------------------------------------------------------------------------------- invocation

class InvocationPlan(TypedDict):
    """What the runner reads of an invocation, from the checkpoint of its `begin` step."""

    invocation_id: int
    workspace_id: int
    version_id: int
    user_id: int | None
    dsl: dict
    input: Any  # the invocation's JSON input
    task: str
    node_budget: int
    usd_budget: str  # Decimal as text
    node_versions: dict[str, int]  # node id -> NodeVersion pk


def invocation_plan(invocation: WorkflowInvocation) -> InvocationPlan:
    """What the runner needs of an invocation that begins (durable.owners.begin calls it, the row
    locked and marked running): its version's graph, its task, its budgets and node versions."""
    version = invocation.workflow_version
    node_versions = dict(NodeVersion.objects.filter(workflow_version=version).values_list("node_id", "pk"))
    return {
        "invocation_id": invocation.pk, "workspace_id": invocation.workspace_id, "version_id": version.pk,
        "user_id": invocation.created_by_id, "dsl": version.dsl, "input": invocation.input,
        "task": input_text(invocation.input), "node_budget": invocation.node_budget,
        "usd_budget": f"{invocation.usd_budget:f}", "node_versions": node_versions,
    }


def invocation_finish(invocation_id: int, output: dict) -> None:
    """Complete the invocation with `output`. The runner calls it in a ``ctx.transaction``, so only a
    turn that still holds the run commits it (a cancel that won leaves the row cancelled)."""
    with _atomic():
        _update_totals(invocation_id)
        # also from failed or cancelled: an operator retried the run, and the run is what happened
        WorkflowInvocation.objects.filter(pk=invocation_id).exclude(status=WorkflowInvocation.Status.COMPLETED).update(
            status=WorkflowInvocation.Status.COMPLETED, output=output, error="", ended_at=now(), updated_at=now())
    _trace_invocation(invocation_id)


def invocation_ended(invocation_id: int, error: str) -> None:
    """The invocation's end (durable.owners.fail calls it in its transaction): any node still running
    or waiting failed with it, with what its calls paid, and the totals count them."""
    unfinished = NodeInvocation.objects.filter(
        workflow_invocation_id=invocation_id, status__in=[NodeInvocation.Status.RUNNING,
                                                          NodeInvocation.Status.WAITING])
    # their usage is written at their end, which they never reached: what their calls paid is in the transcript
    for pk, calls in node_calls(invocation_id=invocation_id, node_ids=unfinished.values("pk")).items():
        NodeInvocation.objects.filter(pk=pk).update(
            usd_cost=calls.usd_cost, input_tokens=calls.input_tokens, output_tokens=calls.output_tokens,
            llm_calls=calls.calls, cache_hits=calls.cache_hits, model=calls.models.split(", ")[-1])
    unfinished.update(status=NodeInvocation.Status.FAILED, error=error, ended_at=now())
    _update_totals(invocation_id)
    _trace_invocation(invocation_id, error=error or "ended")


def invocation_span_key(invocation_id: int) -> str:
    """The key of an invocation's span (config.telemetry.record_span), and of its nodes' below it."""
    return f"invocation:{invocation_id}"


def node_span_key(invocation_id: int, seq: int) -> str:
    return f"invocation:{invocation_id}:node:{seq}"


def _trace_invocation(invocation_id: int, *, error: str = "") -> None:
    """The invocation's ``invoke_workflow`` span, recorded as it ends (whichever process ends it: its run's
    last turn, the reconcile), under its run's stored trace context."""
    if not telemetry.tracing():
        return
    row = WorkflowInvocation.objects.filter(pk=invocation_id).values(
        "started_at", "created_at", "status", "input_tokens", "output_tokens", "usd_cost", "node_count",
        "workflow_version_id", "workflow_version__workflow__name", "durable_run__trace_context").first()
    if row is None:
        return
    name = row["workflow_version__workflow__name"]
    telemetry.record_span(
        f"invoke_workflow {name}", key=invocation_span_key(invocation_id), start=row["started_at"] or row["created_at"],
        trace_context=row["durable_run__trace_context"] or None, error=error, error_type=row["status"],
        attributes={"gen_ai.operation.name": "invoke_workflow", "gen_ai.workflow.name": name,
                    "gen_ai.conversation.id": str(invocation_id), "lineage.invocation.id": invocation_id,
                    "lineage.workflow_version.id": row["workflow_version_id"],
                    "lineage.invocation.status": row["status"], "gen_ai.usage.input_tokens": row["input_tokens"],
                    "gen_ai.usage.output_tokens": row["output_tokens"],
                    "lineage.usd_cost": float(row["usd_cost"]), "lineage.node_count": row["node_count"]})


def _update_totals(invocation_id: int) -> None:
    """The invocation's totals, recomputed from its node invocations in one statement (idempotent).
    Raw SQL: it runs at every node's end, and building the same UPDATE through the ORM's subquery
    expressions cost more Python time than the statement itself."""
    from django.db import connection

    with connection.cursor() as cursor:
        cursor.execute(
            f"UPDATE {WorkflowInvocation._meta.db_table} SET (usd_cost, input_tokens, output_tokens, llm_calls, "
            "cache_hits, node_count) = (SELECT coalesce(sum(usd_cost), 0), coalesce(sum(input_tokens), 0), "
            "coalesce(sum(output_tokens), 0), coalesce(sum(llm_calls), 0), coalesce(sum(cache_hits), 0), count(*) "
            f"FROM {NodeInvocation._meta.db_table} WHERE workflow_invocation_id = %s), updated_at = %s "
            "WHERE id = %s", [invocation_id, now(), invocation_id])


# --------------------------------------------------------------------------------------------- nodes

class NodeStarted(TypedDict):
    """A node invocation as node_start began it: what every round of its agent loop reads."""

    id: int  # the NodeInvocation's pk
    system: str
    tools: list[dict]  # bindings (workflows.tools.node_tools)
    skills: list[dict]
    started_at: str  # ISO 8601


def node_start(invocation_id: int, workspace_id: int, seq: int, node: dict, node_version_id: int | None,
               inbox: list[dict], task: str) -> NodeStarted:
    """Insert the node invocation (running) and the hand-off messages into it; resolve its tools and
    skills. Returns {"id", "system", "tools", "skills", "started_at"}; the checkpoint keeps them, so
    every replay of the node sees the same prompt and tools."""
    tools = node_tools(workspace_id=workspace_id, code_tools=node["codeTools"], mcp_tools=node["mcpTools"])
    system, skills = _system_prompt(workspace_id, node, task)
    started_at = now()
    with _atomic(), connection.cursor() as cursor:  # in the runner's ctx.transaction: commits with its checkpoint
        cursor.execute(_NODE_INSERT_SQL, [invocation_id, seq, node["nodeId"], node_version_id,
                                          "\n\n".join(message["text"] for message in inbox), started_at])
        (node_pk,) = cursor.fetchone()
        _messages_insert(cursor, invocation_id, node_pk, [
            (message_seq(seq, offset), message["role"], {"text": message["text"]}, message.get("from", ""),
             node["nodeId"]) for offset, message in enumerate(inbox)])
    return {"id": node_pk, "system": system, "tools": tools, "skills": skills, "started_at": started_at.isoformat()}


# Raw SQL for a node's start and end (each once a node, two or three times a model call in a sequence of nodes):
# through the ORM, the model instances and query compilation cost the turn worker more than the statements.
_NODE_INSERT_SQL = (
    f"INSERT INTO {NodeInvocation._meta.db_table} (workflow_invocation_id, seq, node_id, node_version_id, attempt, "
    "status, input, output, summary, large_summary, next_nodes, usd_cost, input_tokens, output_tokens, llm_calls, "
    "cache_hits, tool_calls, model, error, approval, throttled_until, throttle_reason, started_at, ended_at) "
    f"VALUES (%s, %s, %s, %s, 1, '{NodeInvocation.Status.RUNNING}', %s, '', '', '', '[]', 0, 0, 0, 0, 0, 0, '', '', "
    "NULL, NULL, '', %s, NULL) RETURNING id")


def _atomic():
    """A transaction, unless the caller's (a ctx.transaction) already holds one: no savepoint then."""
    return contextlib.nullcontext() if connection.in_atomic_block else transaction.atomic()


def _system_prompt(workspace_id: int, node: dict, task: str) -> tuple[str, list[dict]]:
    """The node's system prompt with the skills it names: a skill that matches the task (the
    knowledge app's matching: a trigger, its name or a leading description word) is included in
    full; the others are listed for `skill_load`."""
    prompt = node["systemPrompt"] or node.get("description") or ""
    if not node["skills"]:
        return prompt, []
    from knowledge.models import Skill
    from knowledge.skills import match_reason

    skills = {skill.name: skill for skill in Skill.objects.filter(
        workspace_id=workspace_id, active=True, name__in=node["skills"]).order_by("name")}
    used, listed, parts = [], [], [prompt] if prompt else []
    for name in node["skills"]:
        skill = skills.get(name)
        if skill is None:
            used.append({"name": name, "version": None, "included": False, "reason": "no active skill"})
            continue
        reason = match_reason(name=skill.name, description=skill.description, triggers=skill.triggers, query=task)
        used.append({"name": name, "version": skill.version, "included": bool(reason), "reason": reason})
        if reason:
            parts.append(f"## Skill: {skill.name}\n\n{skill.content_md.strip()}")
        else:
            listed.append(f"- {skill.name}: {skill.description}")
    if listed:
        parts.append("Skills you can load with skill_load:\n" + "\n".join(listed))
    return "\n\n".join(parts), used


def node_finish(invocation_id: int, seq: int, fields: dict, node_pk: int | None = None) -> None:
    """Write a node invocation's end (completed, failed or rejected) and the invocation's totals."""
    values = dict(fields)
    handoffs = values.pop("handoffs", None) or []
    values.update(ended_at=now(), throttled_until=None, throttle_reason="")
    if "usd_cost" in values:
        values["usd_cost"] = Decimal(str(values["usd_cost"]))
    columns = [NodeInvocation._meta.get_field(name) for name in values]  # a name that is no field raises here
    assignments = ", ".join(f"{field.column} = %s::jsonb" if isinstance(field, models.JSONField)
                            else f"{field.column} = %s" for field in columns)
    params = [json.dumps(value) if isinstance(field, models.JSONField) else value
              for field, value in zip(columns, values.values(), strict=True)]
    with _atomic(), connection.cursor() as cursor:  # in the runner's ctx.transaction: commits with its checkpoint
        cursor.execute(f"UPDATE {NodeInvocation._meta.db_table} SET {assignments} "
                       "WHERE workflow_invocation_id = %s AND seq = %s RETURNING node_id, started_at",
                       [*params, invocation_id, seq])
        ended = cursor.fetchone()
        if handoffs:
            _messages_insert(cursor, invocation_id, node_pk, [
                (message_seq(seq, MESSAGES_PER_NODE - 1 - offset), handoff["role"], {"text": handoff["text"][:2000]},
                 handoff["from"], handoff["to"]) for offset, handoff in enumerate(handoffs)])
        _update_totals(invocation_id)
    if ended is not None:
        _trace_node(invocation_id, seq, ended[0], ended[1], values)


def _trace_node(invocation_id: int, seq: int, node_id: str, started_at: datetime, fields: dict) -> None:
    """The node's ``invoke_agent`` span, recorded once as it ends, the parent of its model and tool calls."""
    if not telemetry.tracing():  # every node's end passes here: nothing to build with tracing off
        return
    status = fields.get("status", "")
    attributes = {"gen_ai.operation.name": "invoke_agent", "gen_ai.agent.name": node_id,
                  "gen_ai.conversation.id": str(invocation_id), "lineage.node.seq": seq, "lineage.node.status": status}
    for field, attribute in (("input_tokens", "gen_ai.usage.input_tokens"),
                             ("output_tokens", "gen_ai.usage.output_tokens"), ("model", "gen_ai.response.model"),
                             ("llm_calls", "lineage.llm_calls"), ("tool_calls", "lineage.tool_calls")):
        if fields.get(field) not in (None, ""):
            attributes[attribute] = fields[field]
    if "usd_cost" in fields:
        attributes["lineage.usd_cost"] = float(fields["usd_cost"])
    telemetry.record_span(f"invoke_agent {node_id}", key=node_span_key(invocation_id, seq), start=started_at,
                          parent_key=invocation_span_key(invocation_id), attributes=attributes,
                          error=fields.get("error", "") if status != "completed" else "", error_type=status)


def node_await_approval(invocation_id: int, seq: int, run_id: str, signal: str, output: str,
                        revision: int = 0) -> None:
    """Mark the node (and the invocation) waiting for an operator's decision on `signal`, about its answer of
    `revision` (0: its first; each "revise" decision makes another). The decisions taken on its earlier
    answers move to the approval's `history`. Run again (a worker died before its checkpoint), it leaves a
    wait already marked as it is: a decision sent since stays registered."""
    with transaction.atomic():
        # the invocation's row lock orders this against a cancel (durable.owners.fail takes it first)
        status = WorkflowInvocation.objects.select_for_update().filter(pk=invocation_id) \
            .values_list("status", flat=True).first()
        if status in WorkflowInvocation.TERMINAL:
            raise InvocationEnded(f"the invocation is {status}")
        node = NodeInvocation.objects.select_for_update().filter(workflow_invocation_id=invocation_id, seq=seq) \
            .only("pk", "approval").first()
        current = node.approval if node is not None and isinstance(node.approval, dict) else {}
        if current.get("pending") and current.get("revision", 0) == revision:
            return
        history = list(current.get("history") or [])
        if current.get("decision"):
            history.append({key: current.get(key) for key in DECISION_KEYS} | {"revision": current.get("revision", 0)})
        NodeInvocation.objects.filter(workflow_invocation_id=invocation_id, seq=seq).update(
            status=NodeInvocation.Status.WAITING, output=output,
            approval={"pending": True, "run_id": run_id, "signal": signal, "revision": revision, "history": history})
        WorkflowInvocation.objects.filter(pk=invocation_id, status=WorkflowInvocation.Status.RUNNING).update(
            status=WorkflowInvocation.Status.WAITING, updated_at=now())


DECISION_KEYS = ("decision", "comment", "by", "by_name", "at")


def node_record_approval(invocation_id: int, seq: int, revision: int = 0) -> dict | None:
    """Record the decision invocation_decide registered on the node's answer of `revision` (its
    `approval["sent"]`, written under the node's lock with the signal). A signal sent any other way (the
    durable runs API takes any payload) carries no registered decision: None, nothing written, and the node
    keeps waiting. Run again after its write (a worker died before the checkpoint), it answers the decision
    it recorded."""
    with transaction.atomic():
        node = NodeInvocation.objects.select_for_update().filter(workflow_invocation_id=invocation_id, seq=seq).first()
        approval = node.approval if node is not None and isinstance(node.approval, dict) else {}
        if approval.get("revision", 0) == revision and not approval.get("pending") and approval.get("decision"):
            return {key: approval.get(key) for key in DECISION_KEYS}
        sent = approval.get("sent") if approval.get("pending") else None
        if not sent:
            return None
        node.status = NodeInvocation.Status.RUNNING
        node.approval = {**sent, "pending": False, "revision": revision, "history": approval.get("history") or []}
        node.save(update_fields=["status", "approval"])
        if not NodeInvocation.objects.filter(workflow_invocation_id=invocation_id,
                                             status=NodeInvocation.Status.WAITING).exists():
            WorkflowInvocation.objects.filter(pk=invocation_id, status=WorkflowInvocation.Status.WAITING).update(
                status=WorkflowInvocation.Status.RUNNING, updated_at=now())
    return sent


# -------------------------------------------------------------------------------------- model calls

class InvocationEnded(Exception):
    """The invocation ended (cancelled, failed) while its run was still turning: nothing more is paid."""


def _refuse_if_ended(invocation_id: int) -> None:
    status = WorkflowInvocation.objects.filter(pk=invocation_id).values_list("status", flat=True).first()
    if status in WorkflowInvocation.TERMINAL:
        raise InvocationEnded(f"the invocation is {status}")


class _PutAfterTranscript:
    """The LLM cache, with its write held back until the transcript holds the answer: a worker that
    dies in between leaves no cache entry a redo could mistake for a free hit. Its read gives the
    database connection back at once (a miss is followed by the provider's latency)."""

    def __init__(self, cache: ChatCache):
        self.cache, self.pending = cache, None

    def get(self, key: str):
        try:
            return self.cache.get(key)
        finally:
            release_connection()

    def put(self, key, request, response) -> None:
        self.pending = (key, request, response)

    def flush(self) -> None:
        if self.pending is not None:
            self.cache.put(*self.pending)


class LlmCallResult(TypedDict):
    response: dict  # ChatResponse.as_dict()
    cache_hit: bool
    offset: int  # the node's next message offset
    elapsed_ms: float


def llm_call(workspace_id: int, invocation_id: int, node_invocation_id: int, node_seq: int, offset: int,
             new_messages: list[dict], request: dict) -> LlmCallResult:
    """One chat call of a node (through the cache when it is on), and its messages: the request's
    new messages (the system prompt and user turn on the first round, tool results after) then
    the answer. Returns {"response": ChatResponse.as_dict(), "cache_hit": bool, "offset": next}.

    A step may run again after its worker died past this point: an answer already in the transcript
    at its place is the answer (not paid again, nor counted as a cache hit); an invocation that has
    ended pays for nothing more.

    As a queued step (a real provider) it holds no database connection while the provider answers:
    reads, connection back to the pool, the call, then the writes. A call that must wait (a provider
    limit, a 429 or 5xx the retry policy retries) is put off on a durable timer (TryLater), shown on the
    node as throttled with the reason."""
    answer_seq = message_seq(node_seq, offset + len(new_messages))
    status, recorded = _status_and_answer(invocation_id, answer_seq)
    if recorded and "response" in recorded:
        return {"response": recorded["response"], "cache_hit": bool(recorded.get("cache_hit")),
                "offset": offset + len(new_messages) + 1, "elapsed_ms": recorded.get("latency_ms", 0)}
    if status is None or status in WorkflowInvocation.TERMINAL:
        raise InvocationEnded(f"the invocation is {status or 'deleted'}")
    chat_request = ChatRequest(
        model=request["model"], messages=request["messages"],
        tools=tuple(ToolSpec(**tool) for tool in request.get("tools", ())),
        response_format=request.get("response_format"), temperature=request.get("temperature", 0.0),
        max_tokens=request.get("max_tokens"),
    )
    cache = _PutAfterTranscript(ChatCache(workspace_id)) if workflow_settings().llm_cache_enabled else None
    put_off = sum(deferrals(kind) for kind in ("limit", "provider"))
    release_connection()
    started = time.perf_counter()
    try:
        with telemetry.under(node_span_key(invocation_id, node_seq)):
            response, hit = chat(chat_request, cache=cache, put_off=PutOff(
                caller=f"{invocation_id}:{answer_seq}", retries_done=deferrals("provider")))
    except CallPutOff as exc:
        NodeInvocation.objects.filter(pk=node_invocation_id).update(
            throttled_until=now() + timedelta(seconds=exc.retry_in), throttle_reason=exc.reason[:500])
        raise TryLater(exc.reason, after=exc.retry_in, kind=exc.kind) from None
    elapsed_ms = (time.perf_counter() - started) * 1000
    if put_off:
        NodeInvocation.objects.filter(pk=node_invocation_id).update(throttled_until=None, throttle_reason="")
    rows = []
    for message in new_messages:
        rows.append(_conversation_message(node_seq, offset, message))
        offset += 1
    answer = response.as_dict()
    rows.append((message_seq(node_seq, offset), Message.Role.ASSISTANT, {
        "content": response.content, "tool_calls": answer.get("tool_calls", []), "model": response.usage.model,
        "usage": response.usage.as_dict(), "cache_hit": hit, "latency_ms": round(elapsed_ms, 2),
        "purpose": request.get("purpose", "answer"), "response": answer}))
    _conversation_insert(invocation_id, node_invocation_id, rows)
    if cache is not None:
        cache.flush()
    return {"response": answer, "cache_hit": hit, "offset": offset + 1, "elapsed_ms": round(elapsed_ms, 3)}


def _conversation_message(node_seq, offset, message: dict) -> tuple[int, str, dict]:
    role = message["role"]
    payload = {"content": message.get("content", "")}
    if role == "tool":
        payload["tool_call_id"] = message.get("tool_call_id", "")
    if "revision" in message:  # an operator's request for a revision (NodeRun._approval)
        payload.update(revision=message["revision"], by_name=message.get("by_name", ""))
    return message_seq(node_seq, offset), role, payload


# Raw SQL for the two statements of every model call (its step runs once a call): built through the ORM, their
# query compilation and model instances cost more Python time than the statements themselves.
_STATUS_AND_ANSWER_SQL = (
    f"SELECT i.status, (SELECT m.payload FROM {Message._meta.db_table} m WHERE m.workflow_invocation_id = i.id "
    f"AND m.seq = %s AND m.role = %s LIMIT 1) FROM {WorkflowInvocation._meta.db_table} i WHERE i.id = %s")


def _status_and_answer(invocation_id: int, answer_seq: int) -> tuple[str | None, dict | None]:
    """The invocation's status and the payload of the answer recorded at `answer_seq`, if any."""
    with connection.cursor() as cursor:
        cursor.execute(_STATUS_AND_ANSWER_SQL, [answer_seq, Message.Role.ASSISTANT, invocation_id])
        row = cursor.fetchone()
    if row is None:
        return None, None
    status, payload = row
    return status, (json.loads(payload) if isinstance(payload, str) else payload)


def _conversation_insert(invocation_id: int, node_invocation_id: int, rows: list[tuple[int, str, dict]]) -> None:
    """Messages (seq, role, payload) of a node's conversation, in one statement; a seq already written (by an
    execution of the step that died before its checkpoint) keeps what it holds."""
    with connection.cursor() as cursor:
        _messages_insert(cursor, invocation_id, node_invocation_id, [(seq, role, payload, "", "")
                                                                     for seq, role, payload in rows])


def _messages_insert(cursor, invocation_id: int, node_invocation_id: int | None,
                     rows: list[tuple[int, str, dict, str, str]]) -> None:
    """Messages (seq, role, payload, from node, to node) in one statement; a seq already written keeps what it
    holds."""
    if not rows:
        return
    values = ", ".join(["(%s, %s, %s, %s, %s, %s, %s::jsonb, statement_timestamp())"] * len(rows))
    params = [value for seq, role, payload, source, target in rows
              for value in (invocation_id, node_invocation_id, seq, source, target, role, json.dumps(payload))]
    cursor.execute(
        f"INSERT INTO {Message._meta.db_table} (workflow_invocation_id, node_invocation_id, seq, from_node_id, "
        f"to_node_id, role, payload, created_at) VALUES {values} ON CONFLICT (workflow_invocation_id, seq) "
        "DO NOTHING", params)


class ToolCallResult(TypedDict):
    content: str  # what the model reads
    error: bool
    context_key: str | None  # where a large output went (the context store)


def tool_call(workspace_id: int, invocation_id: int, node_invocation_id: int, node_seq: int, offset: int,
              call_key: str, call: dict, binding: dict | None, user_id: int | None) -> ToolCallResult:
    """Run one tool call and write its message. A large output goes to the context store under
    `node-<seq>-<call_key>` (the runner's round and index: a model's own call ids repeat and may hold
    any characters), and the model reads its beginning and key. A result already in the transcript
    at this place (the worker died before the checkpoint) is the result: the tool does not run twice.
    Returns {"content": what the model reads, "error": bool, "context_key": key or None}."""
    recorded = Message.objects.filter(workflow_invocation_id=invocation_id, seq=message_seq(node_seq, offset),
                                      role=Message.Role.TOOL).values_list("payload", flat=True).first()
    if recorded is not None:
        return {"content": recorded["content"], "error": recorded["error"], "context_key": recorded["context_key"]}
    _refuse_if_ended(invocation_id)
    started = time.perf_counter()
    with telemetry.under(node_span_key(invocation_id, node_seq)), \
            telemetry.tool_span(name=call["name"], call_id=call["id"]) as span:
        result = _tool_result(workspace_id, invocation_id, node_invocation_id, node_seq, call_key, call, binding,
                              user_id)
        if result["error"]:
            span.set_status(telemetry.Status(telemetry.StatusCode.ERROR, result["content"][:500]))
    result["content"] = clean_text(result["content"])
    Message.objects.bulk_create([Message(
        workflow_invocation_id=invocation_id, node_invocation_id=node_invocation_id,
        seq=message_seq(node_seq, offset), role=Message.Role.TOOL,
        payload={"content": result["content"], "tool_call_id": call["id"], "name": call["name"],
                 "arguments": call.get("arguments") or {}, "error": result["error"],
                 "context_key": result["context_key"], "latency_ms": round((time.perf_counter() - started) * 1000, 2)},
    )], ignore_conflicts=True)
    return result


def _tool_result(workspace_id, invocation_id, node_invocation_id, node_seq, call_key, call, binding,
                 user_id) -> ToolCallResult:
    if binding is None:
        return {"content": f"error: there is no tool named {call['name']!r}", "error": True, "context_key": None}
    if call.get("raw") and not call.get("arguments") and not _is_json_object(call["raw"]):
        return {"content": f"error: the arguments of {call['name']} are not a JSON object: {call['raw'][:200]}",
                "error": True, "context_key": None}
    try:
        outcome = tool_run(binding, call.get("arguments") or {}, workspace_id=workspace_id, user_id=user_id)
    except ToolError as exc:
        return {"content": f"error: {exc}", "error": True, "context_key": None}
    text, error = outcome.text, outcome.error
    conf = workflow_settings()
    if len(text) <= conf.context_inline_chars:
        return {"content": text, "error": error, "context_key": None}
    key = f"node-{node_seq}-{call_key}"
    entry = context_store(invocation_id, node_invocation_id, key=key, data=clean_text(text),
                          content_type=outcome.content_type,
                          metadata={"tool": binding["name"], "arguments": call.get("arguments") or {}})
    summary = entry.summary
    content = (f"{summary}\n\n[output of {len(text):,} characters stored in the context store under the key "
               f"{key!r}; this is its beginning]")
    return {"content": content, "error": error, "context_key": key}


def _is_json_object(text: str) -> bool:
    try:
        return isinstance(json.loads(text), dict)
    except ValueError:
        return False


def context_store(invocation_id: int, node_invocation_id: int | None, *, key: str, data: str,
                  content_type: str = "text/plain", metadata: dict | None = None,
                  scope: str = ContextEntry.Scope.NODE) -> ContextEntry:
    """Keep a large value in Django storage with its summary (its beginning, `summary_chars`
    characters) and metadata in the row. Idempotent on (invocation, scope, key).

    The blob is written first, under a name derived from (invocation, scope, key) only, then its row:
    a worker that dies in between leaves a file the redo of its step overwrites, never an orphan, and
    a row always finds its file. Two executions of one step at once write the same name; the row
    written first stands, and neither deletes the file the other's row names."""
    from django.core.files.base import ContentFile

    existing = ContextEntry.objects.filter(workflow_invocation_id=invocation_id, scope=scope, key=key).first()
    if existing is not None:
        return existing
    raw = data.encode()
    conf = workflow_settings()
    entry = ContextEntry(workflow_invocation_id=invocation_id, node_invocation_id=node_invocation_id, scope=scope,
                         key=key, summary=data[:conf.summary_chars], size=len(raw), content_type=content_type,
                         metadata={**(metadata or {}), "created": now().isoformat(), "size": len(raw),
                                   "contentType": content_type, "key": key, "scope": scope})
    name = entry.data.field.generate_filename(entry, context_file_name(scope, key))
    if entry.data.storage.exists(name):  # left by an execution of this step that died before its row...
        existing = ContextEntry.objects.filter(workflow_invocation_id=invocation_id, scope=scope, key=key).first()
        if existing is not None:  # ...or written by one running at the same time, whose row is in now: its file
            return existing
        entry.data.storage.delete(name)
    entry.data.save(name.rsplit("/", 1)[-1], ContentFile(raw), save=False)
    try:
        with transaction.atomic():
            entry.save()
    except Exception:
        existing = ContextEntry.objects.filter(workflow_invocation_id=invocation_id, scope=scope, key=key).first()
        if existing is None or existing.data.name != entry.data.name:
            entry.data.delete(save=False)
        if existing is None:
            raise
        return existing
    return entry


def context_file_name(scope: str, key: str) -> str:
    """The blob's file name inside its invocation's folder: the key as storage would clean it (readable),
    and a digest of the exact (scope, key), so two keys that clean alike never share a file."""
    digest = hashlib.sha256(f"{scope}\n{key}".encode()).hexdigest()[:16]
    readable = re.sub(r"[^A-Za-z0-9_.-]+", "_", key)[:80].strip("._") or "entry"
    return f"{scope}-{readable}-{digest}.txt"
