"""Graders of structured answers: `json_fields` (field by field, with partial credit), `numeric` (within a
tolerance) and `json_schema` (Draft 2020-12, its patterns under the regex time limit)."""

from __future__ import annotations

import json
import math
import re
import unicodedata

from jsonschema.exceptions import SchemaError

from config import user_regex
from evals.conf import eval_settings
from evals.graders.base import _Context, _GradingError, _Outcome
from evals.graders.normalize import (
    _MISSING,
    _as_text,
    _canonical,
    _cut,
    _f1_tokens,
    _fenced,
    _find_json,
    _fmt,
    _get_path,
    _is_number,
    _loads,
    _lookup,
    _norm_text,
    _quote,
    _token_f1,
)
from evals.graders.patterns import _timed_out

LONG_STRING_TOKENS = 4  # json_fields: an expected string this long may match by token F1


def _grade_json_fields(context: _Context, entry: dict) -> _Outcome:
    expected = _find_json(context.expected)
    if not isinstance(expected, dict):
        raise _GradingError("the expected output is not a JSON object, so there are no fields to compare")
    configured = entry.get("fields")
    paths = configured or list(expected)
    if not paths:
        raise _GradingError("the expected output is an empty JSON object and no `fields` are configured")
    actual = _find_json(context.actual)
    if not isinstance(actual, dict):
        return _Outcome(0.0, "The answer is not a JSON object (nor does it contain one).",
                        {"fields": dict.fromkeys(paths, 0.0)})
    min_f1 = entry.get("min_f1", 0.8)
    scores: dict[str, float] = {}
    problems = []
    for path in paths:
        # configured fields are dotted paths; the expected object's own keys are taken as they are
        want = _get_path(expected, path) if configured else expected[path]
        if want is _MISSING:
            raise _GradingError(f"the field {path!r} is not in the expected output")
        have = _get_path(actual, path) if configured else _lookup(actual, path)
        if have is _MISSING:
            scores[path] = 0.0
            problems.append(f"{path!r} is missing")
            continue
        score = _value_score(have, want, min_f1)
        scores[path] = round(score, 6)
        if score < 1:
            problems.append(f"{path!r} scores {score:.2f} (expected {_quote(want, 60)}, got {_quote(have, 60)})")
    mean = sum(scores.values()) / len(scores)
    matched = sum(1 for score in scores.values() if score >= 1)
    rationale = f"{matched} of {len(scores)} fields match"
    if problems:
        shown = "; ".join(problems[:5]) + (f"; and {len(problems) - 5} more" if len(problems) > 5 else "")
        rationale += f": {shown}"
    return _Outcome(mean, rationale + ".", {"fields": scores})


def _value_score(have, want, min_f1: float) -> float:
    if isinstance(want, dict):
        if not isinstance(have, dict):
            return 0.0
        if not want:
            return float(not have)
        total = 0.0
        for key, value in want.items():
            got = _lookup(have, key)
            total += 0.0 if got is _MISSING else _value_score(got, value, min_f1)
        return total / len(want)
    if isinstance(want, list):
        have_items = have if isinstance(have, list) else [have]
        want_set = {_element_form(value) for value in want}
        have_set = {_element_form(value) for value in have_items}
        union = want_set | have_set
        return len(want_set & have_set) / len(union) if union else 1.0
    if isinstance(want, bool):
        if isinstance(have, str):
            return float(_norm_text(have) == ("true" if want else "false"))
        return float(isinstance(have, bool) and have == want)
    if want is None:
        return float(have is None)
    if _is_number(want):
        number = have if _is_number(have) else _first_number(have, percent=False) if isinstance(have, str) else None
        if number is None:
            return 0.0
        return float(math.isclose(number, want, rel_tol=1e-9, abs_tol=1e-9))
    if isinstance(want, str):
        if isinstance(have, dict | list):
            return 0.0
        have_text = _as_text(have) if not isinstance(have, bool) else ("true" if have else "false")
        if _norm_text(have_text) == _norm_text(want):
            return 1.0
        want_tokens, have_tokens = _f1_tokens(want), _f1_tokens(have_text)
        if want_tokens and want_tokens == have_tokens:
            return 1.0
        if len(want_tokens) >= LONG_STRING_TOKENS and _token_f1(have_tokens, want_tokens)[0] >= min_f1:
            return 1.0
        return 0.0
    return float(have == want)


def _element_form(value) -> str:
    """A list element as a comparable string: normalized text, canonical numbers, canonical JSON."""
    if isinstance(value, bool) or value is None:
        return json.dumps(value)
    if _is_number(value):
        return _fmt(float(value))
    if isinstance(value, str):
        return _norm_text(value)
    return _norm_text(_canonical(value))


# ------------------------------------------------------------------------------------------ numeric

_NUMBER = re.compile(r"(?<![\d.,])([-+]?)(\d{1,3}(?:,\d{3})+(?:\.\d+)?|\d+(?:\.\d+)?|\.\d+)(?:[eE]([-+]?\d+))?"
                     r"(\s?%)?")
_MINUSES = str.maketrans({"\u2212": "-", "\u2012": "-", "\u2013": "-", "\ufe63": "-", "\uff0d": "-"})


def _first_number(text: str, *, percent: bool) -> float | None:
    """The first finite number in `text` ("1,234.5", "-3", "1e3", "50%": 0.5 when `percent`), or None."""
    text = unicodedata.normalize("NFKC", text).translate(_MINUSES)
    for match in _NUMBER.finditer(text):
        sign, digits, exponent, percent_sign = match.groups()
        try:
            value = float(sign + digits.replace(",", "") + (f"e{exponent}" if exponent else ""))
        except ValueError:
            continue
        if not math.isfinite(value):
            continue
        if percent and percent_sign:
            value /= 100
        return value
    return None


def _number_in(text: str, path: str | None, *, percent: bool, answer: bool) -> tuple[float | None, str]:
    """(number, why there is none) from the answer or the expected output: at `path` when the text is a JSON
    object (for the expected output: one that has the field), else the first number in the text."""
    if path:
        obj = _find_json(text)
        value = _get_path(obj, path) if isinstance(obj, dict) else _MISSING
        if _is_number(value):
            return float(value), ""
        if isinstance(value, str):
            number = _first_number(value, percent=percent)
            return number, "" if number is not None else f"no number at the field {path!r}"
        if value is not _MISSING:
            return None, f"the field {path!r} holds no number"
        if answer:
            return None, f"no field {path!r}" if isinstance(obj, dict) else f"not a JSON object (no field {path!r})"
    number = _first_number(text, percent=percent)
    return number, "" if number is not None else "no number"


def _grade_numeric(context: _Context, entry: dict) -> _Outcome:
    path, percent = entry.get("field"), entry.get("percent", False)
    expected, why = _number_in(context.expected, path, percent=percent, answer=False)
    if expected is None:
        raise _GradingError(f"the expected output holds no number ({why})")
    actual, why = _number_in(context.actual, path, percent=percent, answer=True)
    if actual is None:
        return _Outcome(0.0, f"The answer has {why}; expected {_fmt(expected)}.", {"expected": expected,
                                                                                  "actual": None})
    allowed = max(entry.get("tolerance", 0.0), entry.get("relative", 0.0) * abs(expected))
    difference = abs(actual - expected)
    ok = difference <= allowed + 1e-9 * max(1.0, abs(expected))
    details = {"expected": expected, "actual": actual, "difference": difference, "allowed": allowed}
    return _Outcome(float(ok), f"{_fmt(actual)} against the expected {_fmt(expected)}: difference "
                               f"{_fmt(difference)}, {'within' if ok else 'outside'} the allowed {_fmt(allowed)}.",
                    details)


# -------------------------------------------------------------------------------------- JSON schema


def _grade_json_schema(context: _Context, entry: dict) -> _Outcome:
    schema = entry.get("schema") if entry.get("schema") is not None else context.output_schema
    source = "the grader's schema" if entry.get("schema") is not None else "the output schema"
    if schema is None:
        raise _GradingError("no JSON schema to check against")
    try:
        validator = user_regex.schema_validator(schema)
    except SchemaError as exc:
        raise _GradingError(f"{source} is not a valid Draft 2020-12 schema: {_cut(exc.message, 300)}") from None
    except (TypeError, ValueError) as exc:
        raise _GradingError(f"{source} is not a JSON schema: {exc}") from None
    stripped = context.actual.strip()
    value = _loads(stripped)
    if value is _MISSING:
        blocks = _fenced(stripped)
        if len(blocks) == 1 and stripped.startswith("```") and stripped.endswith("```"):
            value = _loads(blocks[0].strip())
    if value is _MISSING:
        return _Outcome(0.0, "The answer is not JSON, so it cannot match the schema.", {"errors": []})
    try:
        errors = user_regex.schema_errors(validator, value, timeout=eval_settings().regex_timeout)
    except RecursionError:
        return _Outcome(0.0, "The answer's JSON is too deeply nested to validate.", {"errors": []})
    except user_regex.PatternTimeout as exc:
        raise _timed_out("json_schema", exc) from None
    except SchemaError as exc:
        raise _GradingError(f"{source} cannot be used: {_cut(exc.message, 300)}") from None
    errors.sort(key=lambda error: list(error.absolute_path))
    if not errors:
        return _Outcome(1.0, f"The answer is JSON that validates against {source}.", {"errors": []})
    messages = [f"{'/'.join(str(part) for part in error.absolute_path) or '(root)'}: {_cut(error.message, 160)}"
                for error in errors[:3]]
    more = f" (and {len(errors) - 3} more)" if len(errors) > 3 else ""
    return _Outcome(0.0, f"The answer does not validate against {source}: {'; '.join(messages)}{more}.",
                    {"errors": messages})
