"""What a grader is given (`ItemSpec`, `_Context`) and what it returns (`_Outcome`, or `_GradingError` when
the item cannot be graded as configured); `Grade` and `Verdict` are the stored results."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from llm.types import ChatRequest, ChatResponse
from llm.usage import Usage


@dataclass(frozen=True)
class ItemSpec:
    """What the graders know of a golden item. `expected_output` is text (a JSON expected output as its JSON
    text); `rubric` is a sequence of {"criterion": str, "max_points": number}."""

    input: object
    expected_output: str
    scoring_criteria: str = ""
    rubric: tuple = ()
    tags: tuple = ()
    metadata: dict = field(default_factory=dict)


@dataclass(frozen=True)
class Grade:
    """One grader's score (None on a grading error, with `error` set) and its weight in the verdict."""

    kind: str
    score: float | None
    weight: float
    rationale: str
    error: str = ""
    details: dict = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)  # the judge's tokens and cost; zero for the other graders

    def as_dict(self) -> dict:
        return {"kind": self.kind, "score": self.score, "weight": self.weight, "rationale": self.rationale,
                "error": self.error, "details": self.details, "usage": self.usage.as_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> Grade:
        score = data.get("score")
        return cls(kind=data["kind"], score=None if score is None else float(score),
                   weight=float(data.get("weight", 1.0)), rationale=data.get("rationale", ""),
                   error=data.get("error", ""), details=dict(data.get("details") or {}),
                   usage=Usage.from_dict(data.get("usage") or {}))


@dataclass(frozen=True)
class Verdict:
    """The grades of one answer combined: `score` is their weighted mean, or None when any grade had a grading
    error (never a 0 for a grader's failure)."""

    score: float | None
    grades: tuple[Grade, ...]
    grader: str  # which grader(s) scored: "json_fields+token_f1", "llm_judge (offline fallback: token_f1)"
    rationale: str
    error: str = ""
    usage: Usage = field(default_factory=Usage)

    def as_dict(self) -> dict:
        """A JSON-serialisable form (durable step results)."""
        return {"score": self.score, "grades": [grade.as_dict() for grade in self.grades], "grader": self.grader,
                "rationale": self.rationale, "error": self.error, "usage": self.usage.as_dict()}

    @classmethod
    def from_dict(cls, data: dict) -> Verdict:
        score = data.get("score")
        return cls(score=None if score is None else float(score),
                   grades=tuple(Grade.from_dict(grade) for grade in data.get("grades") or ()),
                   grader=data.get("grader", ""), rationale=data.get("rationale", ""), error=data.get("error", ""),
                   usage=Usage.from_dict(data.get("usage") or {}))

class JudgePending(Exception):
    """The `judge` given to ``grade`` has no answer yet to `request`: grading stops, so that the caller
    can make that call where it is recorded (its own durable step) and grade again with the answer."""

    def __init__(self, request: ChatRequest):
        super().__init__("the judge's answer is not there yet")
        self.request = request


class _GradingError(Exception):
    """This item cannot be graded as configured (or the judge failed): a grade with score None."""

    def __init__(self, message: str, *, usage: Usage | None = None, details: dict | None = None):
        super().__init__(message)
        self.usage = usage or Usage()
        self.details = details or {}


@dataclass(frozen=True)
class _Outcome:
    score: float
    rationale: str
    details: dict = field(default_factory=dict)
    usage: Usage = field(default_factory=Usage)


@dataclass(frozen=True)
class _Context:
    actual: str
    expected: str
    item: ItemSpec
    output_schema: dict | None
    judge: Callable[[ChatRequest], ChatResponse] | None = None
