"""`grade`: each configured grader on one answer, combined into a `Verdict` (the weighted mean, or no score
when any grader could not grade: a grader's failure is never the agent's 0)."""

from __future__ import annotations

import logging
from collections.abc import Callable

from evals.conf import eval_settings
from evals.graders.base import Grade, ItemSpec, JudgePending, Verdict, _Context, _GradingError, _Outcome
from evals.graders.config import validate_graders
from evals.graders.judge import _grade_llm_judge
from evals.graders.normalize import _as_text, _cut, _loads, _sentence
from evals.graders.patterns import _grade_regex
from evals.graders.structured import _grade_json_fields, _grade_json_schema, _grade_numeric
from evals.graders.text import _grade_contains, _grade_exact, _grade_token_f1
from llm.errors import UnknownModel
from llm.names import resolve_model
from llm.providers import OFFLINE_PROVIDER
from llm.types import ChatRequest, ChatResponse
from llm.usage import Usage

logger = logging.getLogger("evals.graders")

MAX_TEXT_CHARS = 200_000  # answers and expected outputs are cut to this before grading
EMPTY_ANSWER = "The answer is empty, so it scores 0 (nothing was graded and the judge was not called)."



_GRADERS: dict[str, Callable[[_Context, dict], _Outcome]] = {
    "exact": _grade_exact, "contains": _grade_contains, "regex": _grade_regex, "token_f1": _grade_token_f1,
    "json_fields": _grade_json_fields, "numeric": _grade_numeric, "json_schema": _grade_json_schema,
    "llm_judge": _grade_llm_judge,
}


def grade(actual: str, item: ItemSpec, graders: list[dict], *, output_schema: dict | None = None,
          judge_model: str | None = None, judge: Callable[[ChatRequest], ChatResponse] | None = None) -> Verdict:
    """Score `actual` (a workflow's answer) against `item` with each configured grader and combine the grades.

    Raises GraderConfigError for a bad configuration; everything about the item and the answer (bad JSON,
    a failing judge, a missing schema) ends up in the Verdict. Each grader is described in evals/graders/guide.md.
    `judge` answers the judge's calls in place of ``llm.chat.chat`` (raising ChatError as it would, or
    JudgePending, which stops the grading)."""
    entries = validate_graders(graders)
    notes = []
    actual_text, cut = _cap(_as_text(actual))
    if cut:
        notes.append(f"The answer was cut to its first {MAX_TEXT_CHARS:,} characters before grading.")
    expected_text, cut = _cap(_as_text(item.expected_output))
    if cut:
        notes.append(f"The expected output was cut to its first {MAX_TEXT_CHARS:,} characters before grading.")
    if not actual_text.strip():
        grades = tuple(Grade(kind=entry["kind"], score=0.0, weight=entry["weight"], rationale=EMPTY_ANSWER)
                       for entry in entries)
        return _verdict(grades, _label(entry["kind"] for entry in entries), notes)
    context = _Context(actual=actual_text, expected=expected_text, item=item, output_schema=output_schema,
                       judge=judge)
    grades: list[Grade] = []
    labels: list[str] = []
    for entry in entries:
        if entry["kind"] == "llm_judge":
            model = entry.get("model") or judge_model or eval_settings().judge_model
            try:
                offline = resolve_model(model).provider == OFFLINE_PROVIDER
            except UnknownModel as exc:
                grades.append(Grade(kind="llm_judge", score=None, weight=entry["weight"],
                                    rationale="The judge could not be called.", error=f"judge failed: {exc}",
                                    details={"model": model}))
                labels.append("llm_judge")
                continue
            if offline:
                fallback = _offline_fallback(context, entry, model)
                grades.extend(fallback)
                labels.append(f"llm_judge (offline fallback: {_label(g.kind for g in fallback)})")
                note = (f"The judge model {model!r} is answered by the offline model, which is not a judge: "
                        f"deterministic graders scored in its place.")
                if note not in notes:
                    notes.insert(0, note)
                continue
            grades.append(_run(_grade_llm_judge, context, {**entry, "model": model}))
        else:
            grades.append(_run(_GRADERS[entry["kind"]], context, entry))
        labels.append(entry["kind"])
    return _verdict(tuple(grades), _label(labels), notes)


def _run(grader: Callable, context: _Context, entry: dict, *, extra: dict | None = None, prefix: str = "") -> Grade:
    kind, weight = entry["kind"], entry["weight"]
    try:
        outcome = grader(context, entry)
    except JudgePending:
        raise
    except _GradingError as exc:
        return Grade(kind=kind, score=None, weight=weight, rationale=prefix + "Not graded: " + _sentence(str(exc)),
                     error=str(exc), details={**exc.details, **(extra or {})}, usage=exc.usage)
    except Exception as exc:  # a grader bug must not pass for the agent's failure, nor kill the eval run
        logger.exception("the %s grader failed", kind)
        message = f"the {kind} grader failed: {type(exc).__name__}: {_cut(str(exc), 200)}"
        return Grade(kind=kind, score=None, weight=weight, rationale=prefix + "Not graded: " + message + ".",
                     error=message, details=dict(extra or {}))
    score = round(min(1.0, max(0.0, float(outcome.score))), 6)
    return Grade(kind=kind, score=score, weight=weight, rationale=prefix + outcome.rationale,
                 details={**outcome.details, **(extra or {})}, usage=outcome.usage)


def _offline_fallback(context: _Context, entry: dict, model: str) -> list[Grade]:
    kinds = ["token_f1"]
    if isinstance(_loads(context.expected), dict):
        kinds.append("json_fields")
    weight = entry["weight"] / len(kinds)
    extra = {"fallback_for": "llm_judge", "judge_model": model}
    prefix = "[offline fallback for llm_judge] "
    grades = []
    for kind in kinds:
        options = {"kind": kind, "weight": weight, **({"min_f1": 0.8} if kind == "json_fields" else {})}
        grades.append(_run(_GRADERS[kind], context, options, extra=extra, prefix=prefix))
    return grades


def _verdict(grades: tuple[Grade, ...], label: str, notes: list[str]) -> Verdict:
    usage = Usage()
    for item in grades:
        usage = usage + item.usage
    errors = [f"{item.kind}: {item.error}" for item in grades if item.error]
    score = None
    if not errors:
        total = sum(item.weight for item in grades)
        score = round(min(1.0, max(0.0, sum(item.weight * item.score for item in grades) / total)), 6)
    if all(item.rationale == EMPTY_ANSWER for item in grades):
        parts = [EMPTY_ANSWER]
    elif len(grades) == 1:
        parts = [_sentence(grades[0].rationale)]
    else:
        parts = [f"{item.kind} ({'error' if item.score is None else f'{item.score:.2f}'}, weight {item.weight:g}): "
                 f"{_sentence(item.rationale)}" for item in grades]
    return Verdict(score=score, grades=grades, grader=label, rationale=" ".join([*notes, *parts]),
                   error="; ".join(errors), usage=usage)


def _label(kinds) -> str:
    return "+".join(dict.fromkeys(kinds))

def _cap(text: str) -> tuple[str, bool]:
    return (text[:MAX_TEXT_CHARS], True) if len(text) > MAX_TEXT_CHARS else (text, False)
