"""Regular expressions written by users, run so that none can hang or crash a worker (DESIGN.md: "user regexes:
`regex` with `timeout=`").

Every pattern a user supplies (a regex grader's, a golden item's expected output used as one, a JSON schema's
``pattern`` / ``patternProperties``, a string checked against ``"format": "regex"``) goes through this module:

- ``compile_pattern`` compiles with the `regex` package and raises ``PatternError`` (a ValueError) for a pattern
  that does not compile, or whose counted repeats would unroll past MAX_UNROLLED elements: `regex` expands
  ``x{m}`` into m copies as it compiles, with no limit of its own (``(?:ab|cd){1000000}`` exhausts memory or
  crashes the process).
- ``search`` matches with ``timeout=`` and raises ``PatternTimeout`` past it, in this process. `re` cannot be
  interrupted and holds the GIL while it backtracks (a worker's lease-renewing thread would stall); `regex` stops
  at the limit and, matching an immutable str with ``concurrent=True``, lets other threads run meanwhile.
- ``schema_validator`` / ``schema_errors``: a Draft 2020-12 validator whose ``pattern``, ``patternProperties``,
  ``additionalProperties`` and ``format: regex`` use the two functions above, every match of one validation
  sharing one time limit. ``unevaluatedProperties`` next to ``patternProperties`` is refused (``check_schema``):
  jsonschema matches those patterns with `re` in code that cannot be replaced keyword by keyword. Every `$ref`
  resolves inside the schema (``check_schema`` refuses one that names nothing); a reference to another address
  is never fetched (jsonschema's default would GET any URL a user writes into a schema).

This module is shared by the apps (the layering of DESIGN.md): it knows nothing of graders or workflows.
"""

from __future__ import annotations

import json
import time
from contextvars import ContextVar
from functools import lru_cache
from urllib.parse import urljoin

import regex
from jsonschema import Draft202012Validator, FormatChecker, validators
from jsonschema.exceptions import SchemaError, ValidationError
from referencing import Registry
from referencing.exceptions import NoSuchResource, Unresolvable
from referencing.jsonschema import DRAFT202012

FLAGS = {"i": regex.IGNORECASE, "m": regex.MULTILINE, "s": regex.DOTALL}
MAX_UNROLLED = 10_000  # elements of a pattern once its counted repeats are expanded (measured: ~25 MB, ~10 ms)
DEFAULT_TIMEOUT_SECONDS = 2.0  # a schema validated outside schema_errors


class PatternError(ValueError):
    """A user pattern that cannot be used: it does not compile, or would be too large once compiled."""


class PatternTimeout(Exception):
    """Matching a user pattern took longer than its limit (`seconds`)."""

    def __init__(self, seconds: float):
        self.seconds = seconds
        super().__init__(f"the pattern did not finish within {seconds:g} s")


def compile_pattern(pattern: str, flags: int = 0) -> regex.Pattern:
    """`pattern` compiled with `regex` (cached), or PatternError saying why not."""
    return _compiled(pattern, flags) if len(pattern) <= 2_000 else _compile(pattern, flags)


@lru_cache(maxsize=256)
def _compiled(pattern: str, flags: int) -> regex.Pattern:
    return _compile(pattern, flags)


def _compile(pattern: str, flags: int) -> regex.Pattern:
    size = unrolled_size(pattern, flags)
    if size > MAX_UNROLLED:
        raise PatternError(f"the pattern is too large once its counted repeats are expanded (about {size:,} "
                           f"elements; at most {MAX_UNROLLED:,})")
    try:
        return regex.compile(pattern, flags)
    except (regex.error, RecursionError, OverflowError, ValueError, MemoryError) as exc:
        raise PatternError(f"the pattern does not compile: {exc}") from None


def search(pattern: str | regex.Pattern, text: str, *, flags: int = 0, timeout: float) -> regex.Match | None:
    """The first match of `pattern` in `text`, or None; PatternError for a bad pattern, PatternTimeout when it
    takes more than `timeout` seconds."""
    compiled = pattern if isinstance(pattern, regex.Pattern) else compile_pattern(pattern, flags)
    if timeout <= 0:
        raise PatternTimeout(timeout)
    try:
        return compiled.search(text, timeout=timeout, concurrent=True)
    except TimeoutError:
        raise PatternTimeout(timeout) from None


def unrolled_size(pattern: str, flags: int = 0) -> int:
    """An upper bound on the elements `regex` builds for `pattern` once ``x{m}`` is expanded to m copies: each
    literal, escape or class counts 1, a group the sum of its alternatives, a repeat with a minimum m > 1 m
    times its atom. A plain scan, conservative where the syntax is ambiguous (it may count more, not less).
    A pattern that may be verbose (``(?x)``, even scoped) is also read as verbose, where whitespace and
    ``#`` comments are not atoms (``a {9}`` repeats the ``a``), and the larger count stands."""
    size = _unrolled_size(pattern, verbose=False)
    if flags & regex.VERBOSE or _VERBOSE_FLAG.search(pattern):
        size = max(size, _unrolled_size(pattern, verbose=True))
    return size


def _unrolled_size(pattern: str, *, verbose: bool) -> int:
    count_of = _VERBOSE_COUNT if verbose else _COUNT
    frames = [[0, 0]]  # for each open group: [size so far, size of its last atom]
    index, end = 0, len(pattern)
    while index < end:
        char, frame, atom = pattern[index], frames[-1], 1
        if char == "\\":
            index += 2
            if pattern[index - 1:index] in ("x", "N", "p", "P") and pattern[index:index + 1] == "{":
                index = _after(pattern, "}", index)
        elif char == "[":
            index = _class_end(pattern, index)
        elif char == "(":
            if pattern.startswith("(?#", index):  # a comment
                index = _after(pattern, ")", index)
            else:
                frames.append([0, 0])
                prefix = _GROUP_PREFIX.match(pattern, index + 1)  # (?:  (?P<name>  (?<=  (?i)  ...
                index = prefix.end() if prefix else index + 1
            continue
        elif char == ")":
            index += 1
            if len(frames) == 1:
                continue
            atom = frames.pop()[0]
            frame = frames[-1]
        elif verbose and char.isspace():
            index += 1
            continue
        elif verbose and char == "#":
            index = _after(pattern, "\n", index)
            continue
        elif char == "{" and (count := count_of.match(pattern, index)):
            index = count.end()
            times = max(int(count["low"] or 0), 1)
            frame[0] += frame[1] * (times - 1)
            frame[1] *= times
            continue
        elif char in "*+?|^$":
            index += 1
            continue
        else:
            index += 1
        frame[0] += atom
        frame[1] = atom
    return sum(size for size, _ in frames)


_COUNT = regex.compile(r"\{(?P<low>\d*)(?:,\d*)?\}")
_VERBOSE_COUNT = regex.compile(r"\{\s*(?P<low>\d*)\s*(?:,\s*\d*\s*)?\}")
_VERBOSE_FLAG = regex.compile(r"\(\?[\w^-]*x")  # (?x)  (?ix)  (?x: ...; a false match only counts more
_GROUP_PREFIX = regex.compile(r"\?(?:<[=!]|P?<[^>)]*>|'[^')]*'|P=\w*|[=!>|]|[-\w^]*:?)")


def _after(pattern: str, closing: str, index: int) -> int:
    found = pattern.find(closing, index)
    return len(pattern) if found < 0 else found + 1


def _class_end(pattern: str, index: int) -> int:
    """The index after the character class opening at `index` (a leading ^ or ] is part of it)."""
    index += 1
    if pattern.startswith("^", index):
        index += 1
    if pattern.startswith("]", index):
        index += 1
    while index < len(pattern):
        char = pattern[index]
        if char == "\\":
            index += 2
        elif char == "[" and pattern.startswith(":", index + 1) and (close := pattern.find(":]", index + 2)) >= 0:
            index = close + 2
        elif char == "]":
            return index + 1
        else:
            index += 1
    return index


# ------------------------------------------------------------------------------------------ JSON schema

_budget: ContextVar[tuple[float, float] | None] = ContextVar("user_regex_budget", default=None)  # (limit, deadline)


def _schema_search(pattern: str, text: str) -> regex.Match | None:
    """`search` within what is left of the running validation's time limit (`schema_errors`)."""
    limit, deadline = _budget.get() or (DEFAULT_TIMEOUT_SECONDS, time.monotonic() + DEFAULT_TIMEOUT_SECONDS)
    try:
        return search(pattern, text, timeout=deadline - time.monotonic())
    except PatternTimeout:
        raise PatternTimeout(limit) from None


def _is_regex(instance) -> bool:
    if isinstance(instance, str):
        compile_pattern(instance)
    return True


FORMAT_CHECKER = FormatChecker(formats=())
FORMAT_CHECKER.checkers.update(Draft202012Validator.FORMAT_CHECKER.checkers)
FORMAT_CHECKER.checks("regex", raises=PatternError)(_is_regex)
_LIBRARY = Draft202012Validator.VALIDATORS


def _pattern(validator, pattern, instance, schema):
    if validator.is_type(instance, "string") and not _schema_search(pattern, instance):
        yield ValidationError(f"{instance!r} does not match {pattern!r}")


def _pattern_properties(validator, pattern_properties, instance, schema):
    if not validator.is_type(instance, "object"):
        return
    for pattern, subschema in pattern_properties.items():
        for key, value in instance.items():
            if _schema_search(pattern, key):
                yield from validator.descend(value, subschema, path=key, schema_path=pattern)


def _additional_properties(validator, additional, instance, schema):
    """The library's keyword, on the properties that no patternProperties pattern (matched here) claims."""
    if validator.is_type(instance, "object") and "patternProperties" in schema:
        patterns = list(schema["patternProperties"])
        instance = {key: value for key, value in instance.items()
                    if not any(_schema_search(pattern, key) for pattern in patterns)}
        schema = {keyword: value for keyword, value in schema.items() if keyword != "patternProperties"}
    yield from _LIBRARY["additionalProperties"](validator, additional, instance, schema)


_Validator = validators.extend(Draft202012Validator, {
    "pattern": _pattern, "patternProperties": _pattern_properties, "additionalProperties": _additional_properties,
}, format_checker=FORMAT_CHECKER)


def _no_retrieval(uri: str):
    """A schema's references resolve inside the schema only: a `$ref` to another address is never fetched
    (jsonschema's default would GET any URL a user writes into a schema)."""
    raise NoSuchResource(ref=uri)


NO_RETRIEVAL = Registry(retrieve=_no_retrieval)
# keywords whose values are data, not schemas (a `$ref` key in them is no reference); and those whose values map
# names to schemas (their keys are names, not keywords)
_DATA_KEYWORDS = frozenset({"const", "enum", "default", "examples"})
_SCHEMA_MAPS = frozenset({"properties", "patternProperties", "$defs", "definitions", "dependentSchemas"})


def check_schema(schema: dict) -> None:
    """SchemaError unless `schema` is a valid Draft 2020-12 schema whose patterns compile here and whose every
    `$ref` names a part of the schema itself (the message names the pattern or the reference and says why)."""
    try:
        Draft202012Validator.check_schema(schema, format_checker=FORMAT_CHECKER)
    except SchemaError as exc:
        if exc.validator == "format" and isinstance(exc.cause, PatternError):
            raise SchemaError(f"the pattern {_snippet(exc.instance)} at {_where(exc.absolute_path)}: "
                              f"{exc.cause}") from None
        raise
    if _has_both(schema, "patternProperties", "unevaluatedProperties"):
        raise SchemaError("unevaluatedProperties cannot be used in a schema that has patternProperties (jsonschema "
                          "would match those patterns with no time limit); use additionalProperties")
    _check_references(schema)


def _check_references(schema) -> None:
    """Every `$ref` of `schema` resolved against the schema (its `$id`s and anchors), nothing fetched: one that
    names nothing would fail each validation that reaches it."""
    if not isinstance(schema, dict):
        return
    root = schema["$id"] if isinstance(schema.get("$id"), str) else ""
    resource = DRAFT202012.create_resource(schema)
    registry = NO_RETRIEVAL.with_resources([("", resource), (root, resource)]).crawl()
    stack: list[tuple[object, str, tuple, bool]] = [(schema, root, (), False)]
    while stack:
        value, base, path, names = stack.pop()
        if isinstance(value, list):
            stack.extend((item, base, (*path, index), False) for index, item in enumerate(value))
            continue
        if not isinstance(value, dict):
            continue
        if names:  # {name: schema}
            stack.extend((item, base, (*path, key), False) for key, item in value.items())
            continue
        if isinstance(value.get("$id"), str):
            base = urljoin(base, value["$id"])
        reference = value.get("$ref")
        if isinstance(reference, str):
            try:
                registry.resolver(base_uri=base).lookup(reference)
            except Unresolvable:
                raise SchemaError(f"the $ref {_snippet(reference)} at {_where((*path, '$ref'))} names no part of "
                                  "this schema (a reference to another address is not fetched)") from None
        stack.extend((item, base, (*path, key), key in _SCHEMA_MAPS) for key, item in value.items()
                     if key not in _DATA_KEYWORDS)


def _where(path) -> str:
    return "/".join(str(part) for part in path) or "(root)"


def _snippet(value) -> str:
    text = str(value)
    return repr(text if len(text) <= 80 else text[:79] + "…")


def _has_both(schema, *keywords: str) -> bool:
    found, stack = set(), [schema]
    while stack:
        value = stack.pop()
        if isinstance(value, dict):
            found.update(keyword for keyword in keywords if keyword in value)
            stack.extend(value.values())
        elif isinstance(value, list):
            stack.extend(value)
    return found == set(keywords)


def schema_validator(schema: dict):
    """A validator for `schema` (checked by `check_schema`: SchemaError when it cannot be used) whose pattern
    matching is time-limited; run it through `schema_errors`. Built once per schema and kept (the check costs
    about a millisecond: a version's input schema is checked at each start, a grader's at each item)."""
    return _schema_validator(json.dumps(schema, sort_keys=True, separators=(",", ":")))


@lru_cache(maxsize=128)
def _schema_validator(canonical: str):
    schema = json.loads(canonical)  # its own copy: a caller changing its dict changes no cached validator
    check_schema(schema)
    return _Validator(schema, format_checker=FORMAT_CHECKER, registry=NO_RETRIEVAL)


def schema_errors(validator, instance, *, timeout: float) -> list[ValidationError]:
    """The validation errors of `instance`; PatternTimeout when its pattern matching takes more than `timeout`
    seconds in all; SchemaError when a reference the validation reaches names nothing (check_schema resolves
    every `$ref`: a `$dynamicRef` can still)."""
    token = _budget.set((timeout, time.monotonic() + timeout))
    try:
        return list(validator.iter_errors(instance))
    except Unresolvable as exc:
        raise SchemaError(f"a reference of the schema names nothing: {_snippet(exc)}") from None
    finally:
        _budget.reset(token)
