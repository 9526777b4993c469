"""A grader configuration: the option validators of each kind, `validate_graders` (normalized, idempotent,
every error named `graders[i].option`) and `graders_hash`, the key under which a grading result is reused."""

from __future__ import annotations

import hashlib
from collections.abc import Callable

from jsonschema.exceptions import SchemaError

from config import user_regex
from evals.graders.normalize import _canonical, _cut, _is_number
from evals.graders.patterns import _regex_flags, _regex_problem
from llm.chat import model_problem

GRADER_KINDS = ("exact", "contains", "regex", "token_f1", "json_fields", "numeric", "json_schema", "llm_judge")

MAX_GRADERS = 10
MAX_WEIGHT = 1000.0
MAX_TERMS = 200
MAX_TERM_CHARS = 1000
MAX_FIELDS = 50
MAX_SCHEMA_CHARS = 100_000


class GraderConfigError(ValueError):
    """A grader configuration that cannot be used; `errors` maps "graders[i].option" to its messages."""

    def __init__(self, errors: dict[str, list[str]]):
        self.errors = errors
        super().__init__("; ".join(f"{path}: {message}" for path, messages in errors.items()
                                   for message in messages))


class _OptionError(ValueError):
    pass


def _bool_option(value):
    if not isinstance(value, bool):
        raise _OptionError("must be true or false")
    return value


def _fraction_option(value):
    if not _is_number(value) or not 0 <= value <= 1:
        raise _OptionError("must be a number from 0 to 1")
    return float(value)


def _non_negative_option(value):
    if not _is_number(value) or value < 0:
        raise _OptionError("must be a number >= 0")
    return float(value)


def _path_option(value):
    if not isinstance(value, str) or not value.strip():
        raise _OptionError("must be a non-empty dotted path such as \"owner\" or \"items.0.name\"")
    path = value.strip()
    if len(path) > 200 or any(not segment for segment in path.split(".")):
        raise _OptionError(f"{path[:80]!r} is not a dotted path (empty segment, or over 200 characters)")
    return path


def _paths_option(value):
    if not isinstance(value, list | tuple) or not value:
        raise _OptionError("must be a non-empty list of dotted paths")
    if len(value) > MAX_FIELDS:
        raise _OptionError(f"has {len(value)} fields; at most {MAX_FIELDS}")
    paths = []
    for index, path in enumerate(value):
        try:
            paths.append(_path_option(path))
        except _OptionError as exc:
            raise _OptionError(f"item {index} {exc}") from None
    return paths


def _terms_option(value):
    if not isinstance(value, list | tuple) or not value:
        raise _OptionError("must be a non-empty list of strings")
    if len(value) > MAX_TERMS:
        raise _OptionError(f"has {len(value)} terms; at most {MAX_TERMS}")
    for index, term in enumerate(value):
        if not isinstance(term, str) or not term.strip():
            raise _OptionError(f"item {index} must be a non-empty string")
        if len(term) > MAX_TERM_CHARS:
            raise _OptionError(f"item {index} is {len(term)} characters long; at most {MAX_TERM_CHARS}")
    return list(value)


def _flags_option(value):
    if not isinstance(value, str) or any(flag not in user_regex.FLAGS for flag in value):
        raise _OptionError('must be a string of the letters "i", "m", "s" (for example "im")')
    return "".join(sorted(set(value)))


def _pattern_option(value):
    if not isinstance(value, str) or not value:
        raise _OptionError("must be a non-empty string")
    return value  # compiled and checked with the flags in validate_graders


def _schema_option(value):
    if not isinstance(value, dict):
        raise _OptionError("must be a JSON schema object")
    if len(_canonical(value)) > MAX_SCHEMA_CHARS:
        raise _OptionError(f"is larger than {MAX_SCHEMA_CHARS:,} characters of JSON")
    try:
        user_regex.check_schema(value)
    except SchemaError as exc:
        raise _OptionError(f"is not a valid Draft 2020-12 schema: {_cut(exc.message, 300)}") from None
    return value


def _model_option(value):
    if not isinstance(value, str) or not value.strip():
        raise _OptionError("must be a model name such as \"gpt-4.1-mini\"")
    problem = model_problem(value.strip())
    if problem:
        raise _OptionError(problem)
    return value.strip()


# kind -> {option: (validator, default or _NO_DEFAULT)}; an option without a default means "use the item's"
_NO_DEFAULT = object()
_OPTIONS: dict[str, dict[str, tuple[Callable, object]]] = {
    "exact": {"case_sensitive": (_bool_option, False)},
    "contains": {"terms": (_terms_option, _NO_DEFAULT)},
    "regex": {"pattern": (_pattern_option, _NO_DEFAULT), "flags": (_flags_option, "")},
    "token_f1": {},
    "json_fields": {"fields": (_paths_option, _NO_DEFAULT), "min_f1": (_fraction_option, 0.8)},
    "numeric": {"field": (_path_option, _NO_DEFAULT), "tolerance": (_non_negative_option, 0.0),
                "relative": (_fraction_option, 0.0), "percent": (_bool_option, False)},
    "json_schema": {"schema": (_schema_option, _NO_DEFAULT)},
    "llm_judge": {"model": (_model_option, _NO_DEFAULT)},
}


def validate_graders(config) -> list[dict]:
    """The normalized grader configuration: each entry {"kind", "weight", ...options} with weights as floats and
    option defaults filled in. Raises GraderConfigError naming each bad entry and option ("graders[2].pattern")."""
    errors: dict[str, list[str]] = {}
    if not isinstance(config, list | tuple):
        raise GraderConfigError({"graders": ["must be a list of grader entries such as [{\"kind\": \"exact\"}]"]})
    if not config:
        raise GraderConfigError({"graders": ["at least one grader is required"]})
    if len(config) > MAX_GRADERS:
        raise GraderConfigError({"graders": [f"{len(config)} graders given; at most {MAX_GRADERS}"]})
    normalized = []
    for index, entry in enumerate(config):
        prefix = f"graders[{index}]"
        if not isinstance(entry, dict):
            errors.setdefault(prefix, []).append('must be an object such as {"kind": "exact"}')
            continue
        kind = entry.get("kind")
        if kind not in GRADER_KINDS:
            errors.setdefault(f"{prefix}.kind", []).append(
                f"unknown grader kind {kind!r}; known: {', '.join(GRADER_KINDS)}")
            continue
        clean: dict = {"kind": kind, "weight": 1.0}
        weight = entry.get("weight", 1.0)
        if not _is_number(weight) or not 0 < weight <= MAX_WEIGHT:
            errors.setdefault(f"{prefix}.weight", []).append(f"must be a number > 0 and at most {MAX_WEIGHT:g}")
        else:
            clean["weight"] = float(weight)
        options = _OPTIONS[kind]
        for name, value in entry.items():
            if name in ("kind", "weight"):
                continue
            if name not in options:
                known = ", ".join(["weight", *options])
                errors.setdefault(f"{prefix}.{name}", []).append(
                    f"unknown option for the {kind} grader; known: {known}")
                continue
            try:
                clean[name] = options[name][0](value)
            except _OptionError as exc:
                errors.setdefault(f"{prefix}.{name}", []).append(str(exc))
        for name, (_, default) in options.items():
            if name not in entry and default is not _NO_DEFAULT:
                clean[name] = default
        if kind == "regex" and isinstance(clean.get("pattern"), str) and f"{prefix}.flags" not in errors:
            problem = _regex_problem(clean["pattern"], _regex_flags(clean["flags"]))
            if problem:
                errors.setdefault(f"{prefix}.pattern", []).append(problem)
        normalized.append(clean)
    if errors:
        raise GraderConfigError(errors)
    return normalized


def graders_hash(config: list[dict]) -> str:
    """SHA-256 of the canonical JSON of the normalized configuration (the key for reusing a grading result)."""
    return hashlib.sha256(_canonical(validate_graders(config)).encode()).hexdigest()
