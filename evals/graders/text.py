"""Graders of plain text: `exact` (or equal JSON), `contains` and `token_f1`."""

from __future__ import annotations

import unicodedata

from evals.graders.base import _Context, _GradingError, _Outcome
from evals.graders.normalize import _MISSING, _collapse, _cut, _f1_tokens, _loads, _norm_text, _quote, _token_f1


def _grade_exact(context: _Context, entry: dict) -> _Outcome:
    case_sensitive = entry.get("case_sensitive", False)
    actual_json, expected_json = _loads(context.actual), _loads(context.expected)
    if actual_json is not _MISSING and expected_json is not _MISSING:
        if _json_equal(actual_json, expected_json, case_sensitive):
            return _Outcome(1.0, "The answer's JSON equals the expected JSON.", {"compared": "json"})
        return _Outcome(0.0, "The answer's JSON differs from the expected JSON.", {"compared": "json"})
    if _exact_form(context.actual, case_sensitive) == _exact_form(context.expected, case_sensitive):
        return _Outcome(1.0, "The answer equals the expected output.", {"compared": "text"})
    how = "" if case_sensitive else " (ignoring case and whitespace)"
    return _Outcome(0.0, f"The answer differs from the expected output{how}: expected "
                         f"{_quote(_collapse(context.expected))}, got {_quote(_collapse(context.actual))}.",
                    {"compared": "text"})


def _exact_form(text: str, case_sensitive: bool) -> str:
    text = _collapse(unicodedata.normalize("NFC", text))
    return text if case_sensitive else text.casefold()


def _json_equal(a, b, case_sensitive: bool) -> bool:
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None:
        return type(a) is type(b) and a == b
    if isinstance(a, int | float) and isinstance(b, int | float):
        return a == b
    if isinstance(a, str) and isinstance(b, str):
        return _exact_form(a, case_sensitive) == _exact_form(b, case_sensitive)
    if isinstance(a, list) and isinstance(b, list):
        return len(a) == len(b) and all(_json_equal(x, y, case_sensitive) for x, y in zip(a, b, strict=True))
    if isinstance(a, dict) and isinstance(b, dict):
        return a.keys() == b.keys() and all(_json_equal(a[key], b[key], case_sensitive) for key in a)
    return False


def _grade_contains(context: _Context, entry: dict) -> _Outcome:
    terms = entry.get("terms")
    if not terms:
        if not context.expected.strip():
            raise _GradingError("nothing to look for: no `terms` and an empty expected output")
        haystack, needle = _norm_text(context.actual), _norm_text(context.expected)
        if needle in haystack:
            return _Outcome(1.0, "The answer contains the expected output.", {"missing": []})
        return _Outcome(0.0, f"The answer does not contain the expected output {_quote(context.expected.strip())}.",
                        {"missing": [_cut(context.expected.strip(), 200)]})
    haystack = _norm_text(context.actual)
    missing = [term for term in terms if _norm_text(term) not in haystack]
    found = len(terms) - len(missing)
    details = {"found": found, "terms": len(terms), "missing": [_cut(term, 200) for term in missing[:20]]}
    if not missing:
        return _Outcome(1.0, f"All {len(terms)} terms occur in the answer.", details)
    shown = ", ".join(_quote(term, 60) for term in missing[:10])
    more = f" and {len(missing) - 10} more" if len(missing) > 10 else ""
    return _Outcome(found / len(terms), f"Found {found} of {len(terms)} terms; missing: {shown}{more}.", details)


def _grade_token_f1(context: _Context, entry: dict) -> _Outcome:
    actual_tokens, expected_tokens = _f1_tokens(context.actual), _f1_tokens(context.expected)
    f1, precision, recall = _token_f1(actual_tokens, expected_tokens)
    details = {"f1": round(f1, 6), "precision": round(precision, 6), "recall": round(recall, 6),
               "answer_tokens": len(actual_tokens), "expected_tokens": len(expected_tokens)}
    return _Outcome(f1, f"Token F1 {f1:.2f} (precision {precision:.2f} over {len(actual_tokens)} answer tokens, "
                        f"recall {recall:.2f} over {len(expected_tokens)} expected tokens).", details)
