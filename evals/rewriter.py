"""The prompt rewriter: from an eval run's worst failures, propose a candidate version.

It rewrites the node whose answer is graded (the node the failing invocations ended on), from the 5
worst-scoring failures; a proposal below 0.3 confidence, or one that changes nothing, is skipped. With a
real model one call writes the new prompt; offline, documented rules map grader failures to the directives
the offline chat model obeys. The contract and the offline rules: docs/rewriter.md.
"""

from __future__ import annotations

import copy
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

from evals.models import EvalRun, GoldenResult
from workflows.dsl import END
from workflows.models import WorkflowVersion

if TYPE_CHECKING:
    from llm.types import ChatRequest, ChatResponse

MIN_CONFIDENCE = 0.3
WORST = 5
CUT = 500
REWRITER_PROMPT = (
    "You improve the system prompt of one node of an agent workflow. You get the current prompt and the "
    "failures of an evaluation: each with the input, the expected output, the actual output and the grader's "
    "rationale. Find what the failures have in common and rewrite the prompt to fix it without breaking what "
    "works. Answer in JSON: {\"failure_analysis\": text, \"changelog\": [short lines], \"improved_prompt\": text, "
    "\"confidence\": a number from 0 to 1}."
)


@dataclass
class Proposal:
    node_id: str = ""
    failure_analysis: str = ""
    changelog: list[str] = field(default_factory=list)
    confidence: float = 0.0
    dsl: dict | None = None
    skipped: str = ""  # why no version was proposed
    version: WorkflowVersion | None = None
    created: bool = False
    rewriter: str = ""  # "offline-rules" or the model that rewrote

    def as_dict(self) -> dict:
        return {"node_id": self.node_id, "failure_analysis": self.failure_analysis, "changelog": self.changelog,
                "confidence": self.confidence, "skipped": self.skipped, "rewriter": self.rewriter,
                "version": getattr(self.version, "pk", None), "created": self.created}


def worst_failures(eval_run: EvalRun, limit: int = WORST) -> list[GoldenResult]:
    """The lowest-scoring results that did not pass (grading errors left out: they say nothing of the
    version)."""
    results = GoldenResult.objects.filter(eval_run=eval_run, grading_error=False, passed=False)
    return list(results.select_related("golden_item", "workflow_invocation")
                .order_by("score", "golden_item__position")[:limit])


def _cut(value) -> str:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return text if len(text) <= CUT else text[:CUT - 1] + "…"


def target_node(version: WorkflowVersion, failures: list[GoldenResult]) -> str:
    """The node whose answer was graded: where most failing invocations ended, else the end node."""
    ends = Counter((r.workflow_invocation.output or {}).get("node_id") for r in failures
                   if r.workflow_invocation is not None and isinstance(r.workflow_invocation.output, dict))
    ends.pop(None, None)
    nodes = {node["nodeId"]: node for node in version.dsl["nodes"]}
    if ends:
        node_id = ends.most_common(1)[0][0]
        if node_id in nodes:
            return node_id
    finishing = [n["nodeId"] for n in version.dsl["nodes"] if not n["handOffs"] or END in n["handOffs"]]
    return finishing[-1] if finishing else version.dsl["entryNodeId"]


def propose(*, eval_run: EvalRun, user=None, create: bool = True,
            ask: Callable[[ChatRequest], ChatResponse] | None = None) -> Proposal:
    """Propose (and with `create`, write as a candidate version: operation mutation, parent the
    evaluated version, the changelog as its commit message) a rewrite fixing the run's worst failures.
    A real rewriter model is asked through `ask` when given (an evolution step's, which keeps the answer for
    the step's next attempt and checks the run's budget), else straight through llm.chat.chat."""
    from llm.names import resolve_model
    from llm.providers import OFFLINE_PROVIDER
    from workflows.dsl import dsl_hash
    from workflows.services import workflow_version_create

    version = eval_run.workflow_version
    failures = worst_failures(eval_run)
    if not failures:
        return Proposal(skipped="no failing item to learn from")
    node_id = target_node(version, failures)
    node = next(n for n in version.dsl["nodes"] if n["nodeId"] == node_id)
    try:
        offline = resolve_model(rewriter_model(node)).provider == OFFLINE_PROVIDER
    except Exception:
        offline = True
    proposal = (offline_proposal(version, node_id, failures) if offline
                else model_proposal(version, node_id, failures, ask=ask))
    proposal.node_id = node_id
    if proposal.skipped:
        return proposal
    if proposal.confidence < MIN_CONFIDENCE:
        proposal.skipped = f"confidence {proposal.confidence:.2f} is below {MIN_CONFIDENCE}"
        return proposal
    if proposal.dsl is None or dsl_hash(proposal.dsl) == version.dsl_hash:
        proposal.skipped = "the rewrite changes nothing"
        return proposal
    if create:
        proposal.version, proposal.created = workflow_version_create(
            workflow=version.workflow, dsl=proposal.dsl, operation=WorkflowVersion.Operation.MUTATION,
            parents=(version,), commit_message="rewrite of " + node_id + ": " + "; ".join(proposal.changelog),
            created_by=user if getattr(user, "pk", None) else None)
    return proposal


# ------------------------------------------------------------------------------------------ offline rules

_DONT_KNOW = re.compile(r"^(?:i\s+(?:do\s+not|don't|cannot|can't)\s+(?:know|say|tell)|unknown|not\s+"
                        r"(?:known|stated|available))\b", re.I)


def _expected_json(text: str) -> dict | None:
    try:
        value = json.loads(text)
    except (TypeError, ValueError):
        return None
    return value if isinstance(value, dict) else None


def _words(value) -> set[str]:
    text = value if isinstance(value, str) else json.dumps(value, ensure_ascii=False)
    return {word for word in re.findall(r"\w+", text.lower()) if len(word) > 2}


def _values_missing(actual: str, expected: str) -> bool:
    """Whether most words of the expected JSON's values are absent from the answer, whatever its
    shape: the facts are missing, not only the format."""
    wanted = _expected_json(expected)
    if not wanted:
        return False
    words = set().union(*(_words(value) for value in wanted.values())) if wanted else set()
    return bool(words) and len(words & _words(actual or "")) < len(words) / 2


def _sentences(text: str) -> int:
    return len([s for s in re.split(r"(?<=[.!?])\s+|\n+", text.strip()) if s.strip()])


def _grades(result: GoldenResult) -> dict[str, float]:
    out = {}
    for grade in result.grades or []:
        if isinstance(grade, dict) and grade.get("score") is not None:
            out[grade.get("kind", "")] = float(grade["score"])
    return out


def offline_proposal(version: WorkflowVersion, node_id: str, failures: list[GoldenResult]) -> Proposal:
    from llm.offline_directives import DIRECTIVES, find_directives

    dsl = copy.deepcopy(version.dsl)
    node = next(n for n in dsl["nodes"] if n["nodeId"] == node_id)
    prompt = node.get("systemPrompt") or ""
    present = {found.key: found for found in find_directives(prompt)}
    addressed: dict[int, list[str]] = {}
    changes: list[tuple[str, str, str, list[int]]] = []  # (key, directive text, changelog line, failures)

    def propose_change(key: str, text: str, line: str, which: list[int]):
        if which:
            changes.append((key, text, line, which))

    # JSON fields
    json_misses, fields = [], []
    for index, result in enumerate(failures):
        grades = _grades(result)
        expected = _expected_json(result.golden_item.expected_output)
        if ("json_fields" in grades and grades["json_fields"] < 1) or ("json_schema" in grades
                                                                        and grades["json_schema"] < 1):
            json_misses.append(index)
            for key in (expected or {}):
                if key not in fields and re.fullmatch(r"[A-Za-z_][\w-]*", key):
                    fields.append(key)
    if json_misses and not fields:
        fields = [key for key in (version.output_schema or {}).get("properties", {})
                  if re.fullmatch(r"[A-Za-z_][\w-]*", key)]
    if json_misses and fields:
        current = present.get("json_fields")
        if current is None or sorted(current.arguments.get("fields", [])) != sorted(fields):
            propose_change("json_fields", DIRECTIVES["json_fields"].text(fields=fields),
                           f"answer in JSON with the fields {', '.join(fields)}", json_misses)
    # missing facts (a text grade low, or a JSON answer with the right fields and wrong values): look them up
    fact_misses = [i for i, r in enumerate(failures)
                   if min([s for k, s in _grades(r).items() if k in ("contains", "token_f1")] or [1]) < 0.5
                   or (_grades(r).get("json_fields", 1) < 1
                       and _values_missing(r.actual_output, r.golden_item.expected_output))]
    if fact_misses and "knowledge_search" not in [f.arguments.get("tool") for f in present.values()
                                                  if f.key == "tool_first"]:
        propose_change("tool_first", DIRECTIVES["tool_first"].text(tool="knowledge_search"),
                       "look the facts up: knowledge_search before answering", fact_misses)
    # shapes of the expected answers
    # the shape of prose answers (a JSON expected output's shape is its fields, handled above)
    expected = ["" if _expected_json(r.golden_item.expected_output or "") else r.golden_item.expected_output or ""
                for r in failures]
    actual = [r.actual_output or "" for r in failures]
    cites = [i for i, e in enumerate(expected) if ("Sources:" in e or re.search(r"\[\d+\]", e))
             and "Sources:" not in actual[i]]
    if cites and "cite_sources" not in present:
        propose_change("cite_sources", DIRECTIVES["cite_sources"].text(), "cite the sources", cites)
    bullets = [i for i, e in enumerate(expected) if re.match(r"^\s*[-*] ", e) and not re.match(r"^\s*[-*] ", actual[i])]
    if bullets and "bullet_list" not in present:
        propose_change("bullet_list", DIRECTIVES["bullet_list"].text(), "answer as a bullet list", bullets)
    quotes = [i for i, e in enumerate(expected) if re.search(r"\"[^\"]{20,}\"", e) and '"' not in actual[i]]
    if quotes and "quote_passage" not in present:
        propose_change("quote_passage", DIRECTIVES["quote_passage"].text(), "quote the retrieved passage", quotes)
    short = [i for i, e in enumerate(expected) if e and not _expected_json(e) and _sentences(e) == 1
             and _sentences(actual[i]) > 1]
    if short and len(short) * 2 >= len(failures) and "one_sentence" not in present and "json_fields" not in present:
        propose_change("one_sentence", DIRECTIVES["one_sentence"].text(), "answer in one sentence", short)
    unknown = [i for i, e in enumerate(expected) if _DONT_KNOW.match(e.strip())]
    if unknown and "unknown_answer" not in present:
        phrase = expected[unknown[0]].strip()
        if len(phrase) <= 80 and '"' not in phrase and "\n" not in phrase:
            propose_change("unknown_answer", DIRECTIVES["unknown_answer"].text(phrase=phrase),
                           f'say "{phrase}" when the sources do not answer', unknown)
    prefixes = {re.match(r"^(\w+:)", e.strip()).group(1) for e in expected if re.match(r"^(\w+:)", e.strip())}
    if len(prefixes) == 1 and len(expected) >= 2 and all(e and e.strip().startswith(next(iter(prefixes)))
                                                         for e in expected):
        prefix = next(iter(prefixes))
        misses = [i for i, a in enumerate(actual) if not a.startswith(prefix)]
        if misses and "prefix" not in present:
            propose_change("prefix", DIRECTIVES["prefix"].text(prefix=prefix), f'start with "{prefix}"', misses)

    if not changes:
        return Proposal(skipped="no rule explains the failures", rewriter="offline-rules",
                        failure_analysis=f"{len(failures)} failures; no grader verdict maps to a directive")
    texts, changelog, analysis = [], [], []
    for key, text, line, which in changes:
        if key == "json_fields" and "json_fields" in present:  # replace the old field list
            found = present["json_fields"]
            prompt = (prompt[:found.start] + prompt[found.end:]).strip()
        texts.append(text)
        changelog.append(line)
        analysis.append(f"{len(which)} of {len(failures)} failures: {line}")
        for index in which:
            addressed.setdefault(index, []).append(key)
    if any(key == "tool_first" for key, *_ in changes) and "knowledge_search" not in node["codeTools"]:
        node["codeTools"] = [*node["codeTools"], "knowledge_search"]
        changelog.append("add the knowledge_search tool")
    node["systemPrompt"] = (prompt.rstrip() + " " + " ".join(texts)).strip()
    confidence = round(len(addressed) / len(failures), 3)
    return Proposal(failure_analysis="; ".join(analysis), changelog=changelog, confidence=confidence, dsl=dsl,
                    rewriter="offline-rules")


# ------------------------------------------------------------------------------------------ a real model

def rewriter_model(node: dict) -> str:
    """The model that rewrites `node`'s prompt: EVAL_REWRITER_MODEL, else the node's own model."""
    from evals.conf import eval_settings

    return eval_settings().rewriter_model or node["gatewayModelId"]


def model_proposal(version: WorkflowVersion, node_id: str, failures: list[GoldenResult], *,
                   ask: Callable[[ChatRequest], ChatResponse] | None = None) -> Proposal:
    from durable import wait_alive
    from llm.chat import chat
    from llm.errors import ChatError
    from llm.types import ChatRequest

    node = next(n for n in version.dsl["nodes"] if n["nodeId"] == node_id)
    model = rewriter_model(node)
    cases = [{"input": _cut(r.golden_item.input), "expected": _cut(r.golden_item.expected_output),
              "actual": _cut(r.actual_output), "rationale": _cut(r.grading_rationale)} for r in failures]
    request = ChatRequest(
        model=model, temperature=0.3, max_tokens=1500,
        messages=[{"role": "system", "content": REWRITER_PROMPT},
                  {"role": "user", "content": json.dumps({"current_prompt": node.get("systemPrompt") or "",
                                                          "failures": cases}, ensure_ascii=False)}],
        response_format={"type": "json_object"})
    try:
        # in evolution's reflect step (a queued step) a wait for the provider heartbeats, so the step's
        # clock does not run out and hand it to another worker, which would ask the rewriter again
        response = ask(request) if ask is not None else chat(request, wait=wait_alive)[0]
    except ChatError as exc:
        return Proposal(skipped=f"the rewriter's model failed: {exc}", rewriter=model)
    try:
        answer = json.loads(response.content)
        improved = answer["improved_prompt"]
        confidence = float(answer.get("confidence", 0))
        if not isinstance(improved, str) or not improved.strip():
            raise ValueError("no improved_prompt")
    except (ValueError, KeyError, TypeError) as exc:
        return Proposal(skipped=f"the rewriter's answer was not usable: {exc}", rewriter=model)
    dsl = copy.deepcopy(version.dsl)
    next(n for n in dsl["nodes"] if n["nodeId"] == node_id)["systemPrompt"] = improved.strip()
    changelog = [str(line)[:200] for line in answer.get("changelog") or []][:10] or ["rewrote the prompt"]
    return Proposal(failure_analysis=str(answer.get("failure_analysis", ""))[:2000], changelog=changelog,
                    confidence=max(0.0, min(1.0, confidence)), dsl=dsl, rewriter=model)
