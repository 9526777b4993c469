"""Offspring a real model writes: a crossover that merges two parents' prompts given the items each
wins, and an immigrant whose prompts are written from the run's goal. Offline (the model that would
write them is the offline one) there are none: the structural operators of ``operators`` make them.

Both ask one chat call (JSON answer) of the rewriter's model (EVAL_REWRITER_MODEL, else the model of
the workflow's answering node), keep the parents' structure, tools and models, and change only
prompts; an answer that is not usable, or a child no different from its parents, gives None, and the
caller falls back to the structural operator. They run inside an evolution step (``breed`` or
``reflect``), whose checkpoint keeps what came out: a replay never asks again. Inside the step they ask
through its ``StepCalls``, which keeps each paid answer so that an attempt of the step run again after its
worker died (before the checkpoint) asks nothing it already paid for, and which refuses a call once the
run's USD budget is spent.
"""

from __future__ import annotations

import copy
import hashlib
import json
from collections import Counter
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from decimal import Decimal
from typing import TYPE_CHECKING

from evolution.operators import Offspring
from llm.errors import ChatError
from workflows.dsl import dsl_hash, parse

if TYPE_CHECKING:
    from llm.types import ChatRequest, ChatResponse
    from llm.usage import UsageMeter

    Ask = Callable[[ChatRequest], ChatResponse]

PROMPT_CHARS = 4000  # a merged or written prompt longer than this is cut (a runaway answer)
ITEM_CHARS = 300
WINS_SHOWN = 5

MERGE_PROMPT = """You merge two system prompts of the same agent workflow into one that keeps what makes each
better. You are given, for each node whose prompt differs, parent A's and parent B's prompt, and the test
items on which each parent scored higher. Write, for each of those nodes, one prompt that should win on both
parents' items. Answer with a JSON object: {"prompts": {"<nodeId>": "<merged prompt>", ...},
"rationale": "<one sentence>"}."""

IMMIGRANT_PROMPT = """You write fresh system prompts for the nodes of an agent workflow, from the goal its
operator set for it. You are given the goal and each node's id, description and current prompt. Write a new
prompt for each node that serves the goal (do not copy the current prompt). Answer with a JSON object:
{"prompts": {"<nodeId>": "<prompt>", ...}, "rationale": "<one sentence>"}."""


class BudgetReached(ChatError):
    """A step's model call refused: the run's USD budget is spent. Its callers fall back as for a failed call."""


class StepCalls:
    """The paid model calls of one breed or reflect step of an evolution run (`step`: its checkpoint's name).

    Each answer is kept as soon as it is paid for, a workflows.LlmCall row whose key names the run, the step and
    the request (and its place among the step's identical requests), whatever LLM_CACHE_ENABLED says: a worker
    that dies after the call and before the step's checkpoint leaves the answer for the next attempt, which,
    making the same choices (a seeded generator, the same answers), asks the same requests and is answered from
    the rows: the model is not asked again, the same offspring come out (the same versions: they are
    content-addressed), and `usd` counts the kept call's cost, once, since the lost attempt's checkpoint never
    counted it. A call paid in the instant between the provider's answer and its row's write is asked again.

    Before each call the run's USD budget is checked: `spent_before` (the run's spend when the step began) plus
    what the step's calls cost so far; once that reaches the budget a call is refused (BudgetReached)."""

    def __init__(self, *, run, step: str, spent_before: Decimal, meter: UsageMeter):
        from workflows.llm_cache import ChatCache

        self.scope = f"evolution_run:{run.pk}:{step}"
        self.cache = ChatCache(run.workflow.workspace_id)
        self.budget = Decimal(str(run.config["usd_budget"]))
        self.spent_before = spent_before
        self.meter = meter  # what this attempt paid (every provider call inside the step)
        self.kept_usd = Decimal(0)  # what earlier attempts paid for the answers reused now
        self.asked: Counter[str] = Counter()

    @property
    def usd(self) -> Decimal:
        """What the step's model calls cost: paid by this attempt, or by an earlier one whose answer it reused."""
        return self.meter.total.usd_cost + self.kept_usd

    def budget_spent(self) -> bool:
        from evals.execution import usd_budget_spent

        return usd_budget_spent(self.spent_before + self.usd, self.budget)

    def budget_reason(self) -> str:
        from config.display import usd

        return f"USD budget reached ({usd(self.spent_before + self.usd)} of {usd(self.budget)})"

    def ask(self, request: ChatRequest) -> ChatResponse:
        """`request`'s answer: the one an earlier attempt of the step paid for, else the model's (kept now).
        Raises BudgetReached once the budget is spent, and what llm.chat.chat raises."""
        from durable import wait_alive
        from llm.chat import chat
        from llm.types import ChatResponse

        if self.budget_spent():
            raise BudgetReached(self.budget_reason())
        key = self._key(request)
        kept = self.cache.get(key)
        if kept is not None:
            response = ChatResponse.from_dict(kept)
            self.kept_usd += response.usage.usd_cost
            return response
        # a queued step's wait for the provider heartbeats, so its clock does not hand it to another worker
        response, _ = chat(request, wait=wait_alive)
        self.cache.put(key, request, response)
        return response

    def _key(self, request: ChatRequest) -> str:
        from llm.names import resolve_model
        from llm.types import request_cache_key

        asked = request_cache_key(request, resolve_model(request.model))
        place = self.asked[asked]
        self.asked[asked] += 1
        return hashlib.sha256(f"{self.scope}:{place}:{asked}".encode()).hexdigest()


@contextmanager
def step_calls(run, step: str, spent_before: str | None) -> Iterator[StepCalls]:
    """The StepCalls of `run`'s step `step`, counting every provider call made inside the block."""
    from llm.usage import usage_meter

    with usage_meter() as meter:
        yield StepCalls(run=run, step=step, spent_before=Decimal(spent_before or "0"), meter=meter)


def guide_model(dsl: dict) -> str | None:
    """The model that writes guided offspring of `dsl`, or None when it is the offline model (or none
    resolves): EVAL_REWRITER_MODEL, else the model of the node whose answer is the workflow's output."""
    from evals.conf import eval_settings
    from llm.errors import UnknownModel
    from llm.names import resolve_model
    from llm.providers import OFFLINE_PROVIDER

    model = eval_settings().rewriter_model or _answering_node(dsl).get("gatewayModelId") or ""
    try:
        return None if resolve_model(model).provider == OFFLINE_PROVIDER else model
    except UnknownModel:
        return None


def merged_crossover(mother: dict, father: dict, wins: dict[str, list[str]], model: str, *,
                     ask: Ask | None = None) -> Offspring | None:
    """The mother's workflow with the prompts of the nodes both parents have, and word differently,
    merged by `model` given `wins` ({"a": inputs the mother won, "b": inputs the father won}), asked through
    `ask` (a step's StepCalls.ask; else straight to the model)."""
    father_nodes = {node["nodeId"]: node for node in father["nodes"]}
    differing = [{"nodeId": node["nodeId"], "prompt_a": node.get("systemPrompt") or "",
                  "prompt_b": father_nodes[node["nodeId"]].get("systemPrompt") or ""}
                 for node in mother["nodes"] if node["nodeId"] in father_nodes
                 and (node.get("systemPrompt") or "") != (father_nodes[node["nodeId"]].get("systemPrompt") or "")]
    if not differing:
        return None
    answer = _ask(model, MERGE_PROMPT, {"nodes": differing,
                                        "items_a_wins": [_cut(i) for i in wins.get("a", [])[:WINS_SHOWN]],
                                        "items_b_wins": [_cut(i) for i in wins.get("b", [])[:WINS_SHOWN]]}, ask)
    child = _with_prompts(mother, answer, {entry["nodeId"] for entry in differing})
    if child is None or dsl_hash(child) in {dsl_hash(parse(mother)), dsl_hash(parse(father))}:
        return None
    return Offspring(child, "crossover", "guided_crossover",
                     f"prompts of {', '.join(sorted(e['nodeId'] for e in differing))} merged by {model}: "
                     f"{_rationale(answer)}")


def written_immigrant(base: dict, goal: str, model: str, *, ask: Ask | None = None) -> Offspring | None:
    """The base workflow's structure with every prompt written afresh by `model` from `goal` (asked through
    `ask`, as in merged_crossover)."""
    if not goal.strip():
        return None
    nodes = [{"nodeId": node["nodeId"], "description": node.get("description") or "",
              "current_prompt": node.get("systemPrompt") or ""} for node in base["nodes"]]
    answer = _ask(model, IMMIGRANT_PROMPT, {"goal": goal, "nodes": nodes}, ask)
    child = _with_prompts(base, answer, {node["nodeId"] for node in base["nodes"]})
    if child is None or dsl_hash(child) == dsl_hash(parse(base)):
        return None
    return Offspring(child, "immigrant", "guided_immigrant", f"prompts written by {model} from the goal: "
                                                             f"{_rationale(answer)}")


def _answering_node(dsl: dict) -> dict:
    nodes = dsl.get("nodes") or [{}]
    answering = [node for node in nodes if not node.get("handOffs")]
    return (answering or nodes)[-1]


def _ask(model: str, instructions: str, payload: dict, ask: Ask | None) -> dict | None:
    from durable import heartbeat, wait_alive
    from llm.chat import chat
    from llm.types import ChatRequest

    request = ChatRequest(model=model, temperature=0.3, max_tokens=2000, response_format={"type": "json_object"},
                          messages=[{"role": "system", "content": instructions},
                                    {"role": "user", "content": json.dumps(payload, ensure_ascii=False)}])
    # a breed asks once per offspring in one queued step, whose silence allowed is one call's: each call re-arms
    # the step's clock (and a step handed to another worker meanwhile stops here, before paying for another call)
    heartbeat()
    try:
        # a queued step's wait for the provider heartbeats, so its clock does not hand it to another worker
        response = ask(request) if ask is not None else chat(request, wait=wait_alive)[0]
        answer = json.loads(response.content)
    except (ChatError, ValueError):
        return None
    return answer if isinstance(answer, dict) else None


def _with_prompts(dsl: dict, answer: dict | None, node_ids: set[str]) -> dict | None:
    """`dsl` with the answer's prompts for `node_ids` (others ignored), or None when it gives none usable."""
    prompts = (answer or {}).get("prompts")
    if not isinstance(prompts, dict):
        return None
    child = copy.deepcopy(dsl)
    changed = False
    for node in child["nodes"]:
        prompt = prompts.get(node["nodeId"])
        if node["nodeId"] in node_ids and isinstance(prompt, str) and prompt.strip():
            node["systemPrompt"] = prompt.strip()[:PROMPT_CHARS]
            changed = True
    return parse(child) if changed else None


def _rationale(answer: dict | None) -> str:
    return str((answer or {}).get("rationale") or "no rationale given")[:300]


def _cut(text) -> str:
    text = text if isinstance(text, str) else json.dumps(text, ensure_ascii=False, default=str)
    return text if len(text) <= ITEM_CHARS else text[:ITEM_CHARS] + "..."
