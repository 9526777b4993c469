"""The regex grader and the checks every user pattern passes: compiled by `config.user_regex` (the `regex`
package, with its size guard) and matched under `EVAL_REGEX_TIMEOUT_SECONDS`, a timeout being a grading
error, never a 0."""

from __future__ import annotations

from config import user_regex
from evals.conf import eval_settings
from evals.graders.base import _Context, _GradingError, _Outcome
from evals.graders.normalize import _quote

REGEX_MAX_PATTERN = 1000
REGEX_INPUT_CHARS = 100_000


def _regex_flags(flags: str) -> int:
    bits = 0
    for flag in flags:
        bits |= user_regex.FLAGS[flag]
    return bits


def _regex_problem(pattern: str, flags: int) -> str | None:
    """Why `pattern` cannot be used (too long, does not compile, too large once compiled), or None."""
    if len(pattern) > REGEX_MAX_PATTERN:
        return f"the pattern is {len(pattern):,} characters long; at most {REGEX_MAX_PATTERN:,}"
    try:
        user_regex.compile_pattern(pattern, flags)
    except user_regex.PatternError as exc:
        return str(exc)
    return None


def _timed_out(kind: str, exc: user_regex.PatternTimeout) -> _GradingError:
    return _GradingError(f"the {kind} grader's pattern matching took longer than its {exc.seconds:g} s limit on "
                         f"this answer (EVAL_REGEX_TIMEOUT_SECONDS)", details={"timeout_seconds": exc.seconds})


def _grade_regex(context: _Context, entry: dict) -> _Outcome:
    flags = _regex_flags(entry.get("flags", ""))
    pattern = entry.get("pattern")
    source = "pattern"
    if pattern is None:
        pattern, source = context.expected.strip(), "expected output"
        if not pattern:
            raise _GradingError("no `pattern` and an empty expected output")
        problem = _regex_problem(pattern, flags)
        if problem:
            raise _GradingError(f"the expected output used as the pattern: {problem}")
    text = context.actual[:REGEX_INPUT_CHARS]
    note = (f" (only the first {REGEX_INPUT_CHARS:,} characters were searched)"
            if len(context.actual) > REGEX_INPUT_CHARS else "")
    try:
        match = user_regex.search(pattern, text, flags=flags, timeout=eval_settings().regex_timeout)
    except user_regex.PatternTimeout as exc:
        raise _timed_out("regex", exc) from None
    details = {"pattern_from": source, "span": list(match.span()) if match else None}
    if match is None:
        return _Outcome(0.0, f"The {source} {_quote(pattern, 80)} does not match the answer{note}.", details)
    return _Outcome(1.0, f"The {source} {_quote(pattern, 80)} matches {_quote(match.group(), 80)}{note}.", details)
