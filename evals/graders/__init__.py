"""Graders: how an eval scores one workflow answer against one golden item (evals/graders/guide.md).

A pure package (no models, no database): ``grade(actual, item, graders)`` returns a ``Verdict`` that an eval
run stores as a durable step result (``Verdict.as_dict()``) and as a ``GoldenResult`` row.

    graders = validate_graders([{"kind": "json_fields", "weight": 2}, {"kind": "token_f1"}])
    verdict = grade(answer, ItemSpec(input="...", expected_output='{"severity": "P1"}'), graders)
    verdict.score, verdict.grader, verdict.rationale   # 0.83, "json_fields+token_f1", "..."

Invariants:
- a grader's failure (the judge failed, the item cannot be graded as configured) is a grade with no score
  and an ``error``, and the verdict has no score: it is never recorded as the agent scoring 0;
- ``validate_graders`` is idempotent, and ``graders_hash`` of its result is the key under which a grading
  result is reused (it does not cover the judge model chosen outside the configuration, nor the
  ``output_schema`` passed to ``grade``: a caller reusing results keys on those too);
- every user pattern runs under the regex time limit; an empty answer scores 0 and the judge is not called.
"""

from evals.graders.base import Grade, ItemSpec, JudgePending, Verdict
from evals.graders.config import GRADER_KINDS, GraderConfigError, graders_hash, validate_graders
from evals.graders.grading import EMPTY_ANSWER, MAX_TEXT_CHARS, grade

__all__ = [
    "EMPTY_ANSWER",
    "GRADER_KINDS",
    "MAX_TEXT_CHARS",
    "Grade",
    "GraderConfigError",
    "ItemSpec",
    "JudgePending",
    "Verdict",
    "grade",
    "graders_hash",
    "validate_graders",
]
