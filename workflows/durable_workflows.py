"""Workflow invocations as durable runs.

``workflows.invoke`` drives one ``WorkflowInvocation``: the entry node runs first, then each node's
hand-offs decide what runs next, until no node is left to run.

- A node is an agent loop: a model call, then the tool calls it asked for, up to `maxSteps`
  rounds (the last round offers no tools, so the model answers). Every model call and every tool
  call is its own checkpointed step: a crash never pays for a completed call twice. Model calls and
  MCP tool calls are queued steps (LLM_QUEUE, served by a threads-pool worker), so the turn is
  suspended, and no turn worker held, while a provider answers; the offline model answers in the turn.
- Hand-offs: `sequential` runs its targets one after another; `parallel` runs them at once, each
  as a child run (``workflows.node``) joined with ``ctx.all``; `conditional` asks the model to
  choose one target (or `end`) through a structured answer, and a choice outside the hand-offs
  fails the node. A node with `waitFor` runs once every node it waits for has handed off to it,
  with all their outputs. `end` (or a node with no hand-offs) finishes a branch; the invocation's
  output is the last output that reached an end.
- `requiresApproval`: once the node has answered, the invocation waits for the signal
  `approval:<node seq>` ({"decision": "approve"|"reject"|"revise", "comment"}); a rejection fails the
  invocation with the comment. A revision hands the comment to the model as a user message ("An
  operator asked for a revision: ...") and runs the agent loop again (up to `maxSteps` rounds, its
  steps named `node:<seq>:r<n>:...`, its signal `approval:<seq>:<n>`), then waits for a decision on
  the new answer; a node takes at most REVISIONS_PER_NODE revisions.
- Budgets: at most `node_budget` node invocations (default 14, which bounds cycles) and
  `usd_budget` USD of model calls; exceeding either fails the invocation with that reason.
  Parallel branches each get an equal share of what was left at the fan-out (so a fan overshoots
  by at most one call per branch), added up at the join. An answer asking for more tool calls
  than WORKFLOW_MAX_TOOL_CALLS fails the node before any runs. A join whose inputs never all
  arrive (a router took another branch) fails the invocation naming what it waited for.
"""

from __future__ import annotations

import itertools
import json
from collections import deque
from decimal import Decimal
from typing import TypedDict, cast

from config.logging import log_context_update
from durable import Child, Context, workflow
from durable.owners import begin_row, describe, fail_row
from llm.chat import ChatResponse, UnknownModel, resolve_model, structured_output_format
from llm.providers import OFFLINE_PROVIDER
from workflows import execution
from workflows.conf import workflow_settings
from workflows.dsl import END
from workflows.models import WorkflowInvocation

INVOKE_WORKFLOW = "workflows.invoke"
NODE_WORKFLOW = "workflows.node"

ROUTER_PROMPT = ("You route a workflow. Read the task and the last node's answer, then choose the next step "
                 "among these options:")


class NodeResult(TypedDict):
    """What a node run hands the scheduler (NodeRun.run; a parallel branch's child run returns it)."""

    node_id: str
    seq: int
    output: str
    next: list[str]  # the hand-off targets chosen
    role: str  # of the message into the targets
    handoff_type: str
    usd_cost: str  # Decimal as text


class InvocationFailed(Exception):
    """The invocation cannot go on (a budget, a rejection, a bad routing choice); the message says why."""


class NodeRejected(InvocationFailed):
    """An operator rejected a node's answer."""


REVISIONS_PER_NODE = 20  # "revise" decisions a node takes (each is an operator's act; this bounds a runaway script)


class Conversation:
    """A node's conversation with its model as the agent loop builds it: the messages so far, the tools it
    offers and the answer format, kept across the rounds of its revisions."""

    def __init__(self, node: dict, started: execution.NodeStarted, messages: list[dict]):
        self.node, self.started, self.messages = node, started, messages
        self.bindings = {tool["name"]: tool for tool in started["tools"]}
        self.specs = [{"name": tool["name"], "description": tool["description"], "parameters": tool["parameters"]}
                      for tool in started["tools"]]
        self.output_format = None


@workflow(INVOKE_WORKFLOW)  # started by workflows.services.invocation_start only
def invoke(ctx: Context, input: dict) -> dict:
    """Run a workflow invocation. Input: {"invocation_id": int}."""
    invocation_id = int(input["invocation_id"])
    log_context_update(invocation_id=invocation_id)
    plan = begin_row(ctx, WorkflowInvocation, invocation_id)
    if "ended" in plan:
        return {"status": plan["ended"]}
    try:
        output = GraphRun(ctx, cast(execution.InvocationPlan, plan)).run()  # begin's plan, once not ended
    except Exception as exc:
        fail_row(ctx, WorkflowInvocation, invocation_id, exc)
        raise
    ctx.transaction("finish", execution.invocation_finish, invocation_id, output)
    return output


@workflow(NODE_WORKFLOW)
def run_branch(ctx: Context, input: dict) -> NodeResult:
    """One node of a parallel hand-off, run as a child of the invocation's run. Input: {"plan",
    "node_id", "seq", "inbox", "spent"}; output: the node's result (see NodeRun.run)."""
    log_context_update(invocation_id=input["plan"]["invocation_id"])
    budget = Decimal(input["budget"]) if "budget" in input else None
    return NodeRun(ctx, input["plan"], Decimal(input["spent"]), usd_budget=budget).run(
        input["node_id"], input["seq"], input["inbox"])


class GraphRun:
    """The scheduler of one invocation: a queue of groups of node activations, run in order (a
    group of one inline, a larger group as parallel child runs)."""

    def __init__(self, ctx: Context, plan: execution.InvocationPlan):
        self.ctx = ctx
        self.plan = plan
        self.nodes = {node["nodeId"]: node for node in plan["dsl"]["nodes"]}
        self.node_budget = int(plan["node_budget"])
        self.usd_budget = Decimal(plan["usd_budget"])
        self.spent = Decimal(0)
        self.count = 0

    def run(self) -> dict:
        entry = self.plan["dsl"]["entryNodeId"]
        queue = deque([[(entry, [{"from": "", "role": "data", "text": self.plan["task"]}])]])
        boxes: dict[str, dict[str, dict]] = {}  # a waitFor node's deliveries so far, by source
        finished: list[NodeResult] = []
        last: NodeResult | None = None
        while queue:
            group = queue.popleft()
            if self.count + len(group) > self.node_budget:
                names = ", ".join(node_id for node_id, _ in group)
                raise InvocationFailed(f"node budget exceeded: {self.count} node invocations ran and the budget is "
                                       f"{self.node_budget}; next would have been {names}")
            seqs = list(range(self.count + 1, self.count + 1 + len(group)))
            self.count += len(group)
            if len(group) == 1:
                (node_id, inbox), seq = group[0], seqs[0]
                results: list[NodeResult] = [NodeRun(self.ctx, self.plan, self.spent).run(node_id, seq, inbox)]
            else:
                # each branch may spend its share of what is left, so the fan cannot overspend by its width
                share = (self.usd_budget - self.spent) / len(group)
                results = self.ctx.all([
                    Child(NODE_WORKFLOW, {"plan": self.plan, "node_id": node_id, "seq": seq, "inbox": inbox,
                                          "spent": f"{self.spent:f}", "budget": f"{self.spent + share:f}"},
                          name=f"node:{seq}:{node_id}")
                    for (node_id, inbox), seq in zip(group, seqs, strict=True)
                ], mode="fail_fast")
            for result in results:
                self.spent += Decimal(result["usd_cost"])
            if self.spent > self.usd_budget:
                raise InvocationFailed(f"USD budget exceeded: spent ${self.spent:.6f} of ${self.usd_budget:.6f}")
            for result in results:
                last = result
                self._hand_off(result, queue, boxes, finished)
        if boxes:  # a join some of whose inputs never came (a router took another branch): not an end
            target, box = next(iter(boxes.items()))
            missing = [name for name in self.nodes[target]["waitFor"] if name not in box]
            raise InvocationFailed(f"node {target} waits for {', '.join(missing)}, which never handed off to it "
                                   f"(it got {', '.join(box)})")
        final = finished[-1] if finished else last
        output = {"text": final["output"], "node_id": final["node_id"]}
        parsed = _json_object(final["output"])
        if parsed is not None:
            output["json"] = parsed
        return output

    def _hand_off(self, result: NodeResult, queue: deque, boxes: dict, finished: list[NodeResult]) -> None:
        source = result["node_id"]
        targets = result["next"]
        if not targets:
            finished.append(result)
            return
        message = {"from": source, "role": result["role"], "text": result["output"]}
        ready = []
        for target in targets:
            if target == END:
                finished.append(result)
                continue
            wait_for = self.nodes[target]["waitFor"]
            if not wait_for:
                ready.append((target, [message]))
                continue
            box = boxes.setdefault(target, {})
            box[source] = message
            if set(wait_for) <= set(box):
                ordered = [box[name] for name in wait_for] + [m for name, m in box.items() if name not in wait_for]
                ready.append((target, [{**m, "role": "aggregated"} for m in ordered]))
                del boxes[target]
        if result["handoff_type"] == "parallel" and len(ready) > 1:
            queue.append(ready)
        else:
            queue.extend([item] for item in ready)


class NodeRun:
    """One node invocation: the agent loop, the approval gate and the routing choice."""

    def __init__(self, ctx: Context, plan: execution.InvocationPlan, spent: Decimal, *,
                 usd_budget: Decimal | None = None):
        self.ctx = ctx
        self.plan = plan
        self.invocation_id = plan["invocation_id"]
        self.workspace_id = plan["workspace_id"]
        self.usd_budget = usd_budget if usd_budget is not None else Decimal(plan["usd_budget"])
        self.spent_before = spent
        self.usage = {"usd_cost": Decimal(0), "input_tokens": 0, "output_tokens": 0, "llm_calls": 0,
                      "cache_hits": 0, "tool_calls": 0}
        self.model = ""

    def run(self, node_id: str, seq: int, inbox: list[dict]) -> NodeResult:
        ctx = self.ctx
        node = next(node for node in self.plan["dsl"]["nodes"] if node["nodeId"] == node_id)
        task = self.plan["task"]
        # the node's own writes and their checkpoint commit together (ctx.transaction): once, one commit
        started: execution.NodeStarted
        started = ctx.transaction(f"node:{seq}:start", execution.node_start, self.invocation_id, self.workspace_id,
                                  seq, node, self.plan["node_versions"].get(node_id), inbox, task)
        try:
            conversation, output, offset = self._agent_loop(node, seq, started, inbox, task)
            if node["requiresApproval"]:
                output, offset = self._approval(node, seq, started, conversation, output, offset)
            targets, role = self._next(node, seq, started["id"], offset, task, output)
        except Exception as exc:
            ctx.transaction(f"node:{seq}:failed", execution.node_finish, self.invocation_id, seq,
                     {**self._usage_fields(), "status": "rejected" if isinstance(exc, NodeRejected) else "failed",
                      "error": describe(exc)})
            raise
        summary = output.strip().split("\n", 1)[0][:300]
        ctx.transaction(f"node:{seq}:end", execution.node_finish, self.invocation_id, seq, {
            **self._usage_fields(), "status": "completed", "output": output, "summary": summary,
            "large_summary": output[:2000] if len(output) > 2000 else "", "next_nodes": targets,
            "handoffs": [{"from": node_id, "to": END, "role": "result", "text": output}]
            if END in targets or not targets else [],
        }, started["id"])
        return {"node_id": node_id, "seq": seq, "output": output, "next": targets, "role": role,
                "handoff_type": node["handOffType"], "usd_cost": f"{self.usage['usd_cost']:f}"}

    def _usage_fields(self) -> dict:
        return {**self.usage, "usd_cost": f"{self.usage['usd_cost']:f}", "model": self.model}

    def _check_budget(self) -> None:
        spent = self.spent_before + self.usage["usd_cost"]
        if spent > self.usd_budget:
            raise InvocationFailed(f"USD budget exceeded: spent ${spent:.6f} of ${self.usd_budget:.6f}")

    def _call(self, name: str, seq: int, node_pk: int, offset: int, new: list[dict], request: dict):
        self._check_budget()
        result: execution.LlmCallResult
        result = self.ctx.step(name, execution.llm_call, self.workspace_id, self.invocation_id, node_pk, seq, offset,
                               new, request, **model_call_options(request["model"]))
        response = ChatResponse.from_dict(result["response"])
        self.usage["llm_calls"] += 1
        self.model = response.usage.model
        if result["cache_hit"]:
            self.usage["cache_hits"] += 1
        else:
            self.usage["usd_cost"] += response.usage.usd_cost
            self.usage["input_tokens"] += response.usage.input_tokens
            self.usage["output_tokens"] += response.usage.output_tokens
        self._check_budget()
        return response, result["offset"]

    def _agent_loop(self, node: dict, seq: int, started: execution.NodeStarted, inbox: list[dict],
                    task: str) -> tuple[Conversation, str, int]:
        messages = [{"role": "system", "content": started["system"]}] if started["system"] else []
        for message in inbox:
            if message["from"]:
                messages.append({"role": "user", "content": f"Output of {message['from']}:\n{message['text']}"})
        messages.append({"role": "user", "content": task})
        conversation = Conversation(node, started, messages)
        # a node whose answer can end the invocation answers in the workflow's output schema
        if not node["handOffs"] or END in node["handOffs"]:
            conversation.output_format = structured_output_format(node["gatewayModelId"],
                                                                  self.plan["dsl"].get("outputSchema"))
        output, offset = self._rounds(conversation, f"node:{seq}", seq, list(messages), len(inbox))
        return conversation, output, offset

    def _rounds(self, conversation: Conversation, prefix: str, seq: int, new: list[dict],
                offset: int) -> tuple[str, int]:
        """Up to `maxSteps` model calls, each followed by the tool calls it asked for (the last round offers no
        tools); `new` are the messages not yet in the transcript. Steps are named `<prefix>:llm:<round>` and
        `<prefix>:tool:<round>.<index>`."""
        node, started, messages = conversation.node, conversation.started, conversation.messages
        output = ""
        for round_ in range(node["maxSteps"]):
            offered = conversation.specs if round_ < node["maxSteps"] - 1 else []
            request = {"model": node["gatewayModelId"], "messages": messages, "tools": offered, "temperature": 0.0}
            if conversation.output_format:
                request["response_format"] = conversation.output_format
            response, offset = self._call(f"{prefix}:llm:{round_}", seq, started["id"], offset, new, request)
            new = []
            messages.append(response.assistant_message())
            output = response.content
            if not response.tool_calls or not offered:
                break
            limit = min(workflow_settings().max_tool_calls, execution.MESSAGES_PER_NODE - offset - 2)
            if len(response.tool_calls) > limit:
                raise InvocationFailed(f"node {node['nodeId']}: the model asked for {len(response.tool_calls)} tool "
                                       f"calls in one answer; at most {limit} run (WORKFLOW_MAX_TOOL_CALLS)")
            for index, call in enumerate(response.tool_calls):
                call_dict = {"id": call.id, "name": call.name, "arguments": call.arguments,
                             "raw": getattr(call, "raw", "")}
                binding = conversation.bindings.get(call.name)
                remote = binding is not None and binding["kind"] == "mcp"
                options = queued_call_options() if remote else {}
                result: execution.ToolCallResult
                result = self.ctx.step(f"{prefix}:tool:{round_}.{index}", execution.tool_call, self.workspace_id,
                                       self.invocation_id, started["id"], seq, offset, f"{round_}.{index}",
                                       call_dict, binding, self.plan["user_id"], **options)
                offset += 1
                self.usage["tool_calls"] += 1
                messages.append({"role": "tool", "tool_call_id": call.id, "content": result["content"]})
        return output, offset

    def _approval(self, node: dict, seq: int, started: execution.NodeStarted, conversation: Conversation,
                  output: str, offset: int) -> tuple[str, int]:
        """Wait for the operator's decision on the node's answer; a revision runs the agent loop again on the
        operator's comment and waits for a decision on the new answer. Returns the approved answer and the
        node's next message offset; NodeRejected on a rejection."""
        for revision in itertools.count():
            decision = self._decision(seq, revision, output)
            if decision.get("decision") != "revise":
                break
            if revision >= REVISIONS_PER_NODE:
                raise InvocationFailed(f"node {node['nodeId']} was revised {revision} times, the most a node takes")
            if offset + 3 >= execution.MESSAGES_PER_NODE:  # the comment, an answer, the hand-off's place
                raise InvocationFailed(f"node {node['nodeId']}: no room left in its transcript for another revision")
            who = decision.get("by_name") or "an operator"
            feedback = f"An operator asked for a revision: {decision.get('comment', '')}"
            conversation.messages.append({"role": "user", "content": feedback})
            # the transcript's copy says which revision it opened and who asked; the model reads only the text
            recorded = {"role": "user", "content": feedback, "revision": revision + 1, "by_name": who}
            output, offset = self._rounds(conversation, f"node:{seq}:r{revision + 1}", seq, [recorded], offset)
        if decision.get("decision") != "approve":
            who = decision.get("by_name") or "an operator"
            comment = decision.get("comment") or "no comment"
            raise NodeRejected(f"node {node['nodeId']} was rejected by {who}: {comment}")
        return output, offset

    def _decision(self, seq: int, revision: int, output: str) -> dict:
        """The decision registered (``invocation_decide``) on the node's answer of `revision` (0: its first)."""
        # revision 0 keeps the names the runner always gave it, so runs waiting since before revisions replay
        signal, prefix = (f"approval:{seq}", f"node:{seq}") if revision == 0 \
            else (f"approval:{seq}:{revision}", f"node:{seq}:r{revision}")
        self.ctx.step(f"{prefix}:await", execution.node_await_approval, self.invocation_id, seq, self.ctx.run_id,
                      signal, output, revision)
        # only a decision invocation_decide registered counts; any other signal is ignored and the node waits on
        for attempt in itertools.count():
            self.ctx.wait_for_signal(signal)
            decision = self.ctx.step(f"{prefix}:decision:{attempt}", execution.node_record_approval,
                                     self.invocation_id, seq, revision)
            if decision is not None:
                return decision
        raise AssertionError("unreachable")

    def _next(self, node: dict, seq: int, node_pk: int, offset: int, task: str, output: str) -> tuple[list, str]:
        handoffs = node["handOffs"]
        kind = node["handOffType"]
        if kind != "conditional" or len(handoffs) <= 1:
            return list(handoffs), "delegation" if kind == "parallel" else "sequential"
        options = []
        for target in handoffs:
            if target == END:
                options.append(f"- {END}: finish the workflow with this answer")
            else:
                target_node = next(n for n in self.plan["dsl"]["nodes"] if n["nodeId"] == target)
                about = target_node["description"] or target_node["systemPrompt"][:200] or target
                options.append(f"- {target}: {' '.join(about.split())}")
        request = {
            "model": node["gatewayModelId"], "temperature": 0.0, "purpose": "route",
            "messages": [
                {"role": "system", "content": ROUTER_PROMPT + "\n" + "\n".join(options)
                 + '\nAnswer in JSON: {"next": <option>, "reason": <why>}.'},
                {"role": "user", "content": f"Task:\n{task}\n\nAnswer of {node['nodeId']}:\n{output}"},
            ],
            "response_format": {"type": "json_schema", "json_schema": {"name": "route", "strict": True, "schema": {
                "type": "object", "additionalProperties": False, "required": ["next", "reason"],
                "properties": {"next": {"type": "string", "enum": list(handoffs)}, "reason": {"type": "string"}},
            }}},
        }
        response, _ = self._call(f"node:{seq}:route", seq, node_pk, offset, request["messages"], request)
        choice = (_json_object(response.content) or {}).get("next")
        if choice not in handoffs:
            raise InvocationFailed(f"node {node['nodeId']}: the conditional hand-off chose {choice!r}, "
                                   f"not one of {', '.join(handoffs)}")
        return [choice], "delegation"


def queued_call_options() -> dict:
    """The options of a step that waits on a provider: on the llm queue's worker, with the call's timeout."""
    conf = workflow_settings()
    return {"queue": conf.llm_queue, "timeout": conf.call_timeout}


def model_call_options(model: str) -> dict:
    """A model call waits on the llm queue's worker, not in the turn; the offline model answers in the
    turn (in well under a millisecond, less than a queue's round trip). Either way the step's name is
    the same, so a replay under other settings answers from the checkpoint it finds."""
    try:
        offline = resolve_model(model).provider == OFFLINE_PROVIDER
    except UnknownModel:
        offline = False  # the step fails with the reason, wherever it runs
    return {} if offline else queued_call_options()


def _json_object(text: str) -> dict | None:
    text = (text or "").strip()
    if text.startswith("```"):
        text = text.strip("`")
        text = text.split("\n", 1)[1] if "\n" in text else text
    try:
        value = json.loads(text)
    except ValueError:
        return None
    return value if isinstance(value, dict) else None
