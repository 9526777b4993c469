"""User patterns (config/user_regex.py): compiled with `regex` under a size guard, matched with a time limit, and
a JSON-schema validator whose pattern keywords share one limit per validation."""

import itertools
from types import SimpleNamespace

import pytest
from jsonschema.exceptions import SchemaError

from config import user_regex
from tests.guards import finishes_within

HOSTILE_PATTERN, HOSTILE_TEXT = r"(a?){32}a{32}", ("a" * 31 + "b") * 150


@pytest.mark.parametrize(("pattern", "size"), [
    ("abc", 3), ("x{0,100000}", 1), ("x{5000}", 5000), ("(?:ab|cd){10}", 40), ("((a{10}){10}){10}", 1000),
    (r"[a{]{3}\{", 4), (r"\p{L}{7}", 7), ("(?P<name>ab){3}", 6), ("(?<=ab)c{4}", 6), ("(?#x{9999})a", 1),
])
def test_the_unrolled_size_counts_minimum_repeats_of_each_atom(pattern, size):
    assert user_regex.unrolled_size(pattern) == size


@pytest.mark.parametrize("pattern", ["(?:ab|cd){1000000}", "x{2000000000}", "((a{100}){100}){100}"])
def test_a_pattern_regex_would_unroll_past_memory_is_refused_before_it_compiles(pattern):
    """Each of these exhausts memory or crashes the process inside regex.compile."""
    with pytest.raises(user_regex.PatternError, match="too large"):
        user_regex.compile_pattern(pattern)


def test_a_pattern_that_does_not_compile_says_why():
    with pytest.raises(user_regex.PatternError, match="does not compile"):
        user_regex.compile_pattern("(unclosed")


def test_a_search_stops_at_its_limit():
    with finishes_within(30), pytest.raises(user_regex.PatternTimeout) as caught:
        user_regex.search(HOSTILE_PATTERN, HOSTILE_TEXT, timeout=0.1)
    assert caught.value.seconds == 0.1 and "0.1 s" in str(caught.value)
    assert user_regex.search(r"b(?=a)", "aab" + "a", timeout=1).span() == (2, 3)


def test_the_matches_of_one_validation_share_its_limit(monkeypatch):
    """Fifty strings: one limit for the whole validation, not fifty. A clock that moves 0.05 s a reading:
    each match is given what is left of the one limit, and the validation stops once it is spent."""
    readings = itertools.count()
    monkeypatch.setattr(user_regex, "time", SimpleNamespace(monotonic=lambda: next(readings) * 0.05))
    given: list[float] = []
    search = user_regex.search

    def recording(pattern, text, *, flags=0, timeout):
        given.append(timeout)
        return search(pattern, text, flags=flags, timeout=timeout)

    monkeypatch.setattr(user_regex, "search", recording)
    validator = user_regex.schema_validator({"type": "array", "items": {"type": "string", "pattern": "^a+$"}})
    with pytest.raises(user_regex.PatternTimeout) as caught:
        user_regex.schema_errors(validator, ["aaa"] * 50, timeout=0.2)
    assert caught.value.seconds == 0.2
    assert len(given) < 50 and given == sorted(given, reverse=True) and given[0] <= 0.2


def test_schema_keywords_keep_their_meaning():
    schema = {"type": "object", "properties": {"id": {"type": "string", "pattern": r"^\d{3}$"}},
              "patternProperties": {"^x-": {"type": "integer"}}, "additionalProperties": False}
    validator = user_regex.schema_validator(schema)
    assert user_regex.schema_errors(validator, {"id": "123", "x-a": 1}, timeout=1) == []
    messages = sorted(error.message for error in user_regex.schema_errors(
        validator, {"id": "12", "x-a": "1", "other": 0}, timeout=1))
    assert messages == ["'1' is not of type 'integer'", "'12' does not match '^\\\\d{3}$'",
                        "Additional properties are not allowed ('other' was unexpected)"]


@pytest.mark.parametrize(("schema", "words"), [
    ({"pattern": "(unclosed"}, "the pattern '(unclosed' at pattern: the pattern does not compile"),
    ({"properties": {"a": {"pattern": "x{2000000000}"}}}, "too large"),
    ({"patternProperties": {"(": {}}}, "does not compile"),
    ({"allOf": [{"patternProperties": {"^a": {}}}], "unevaluatedProperties": False}, "unevaluatedProperties"),
    ({"type": 5}, "is not valid"),
    ({"properties": {"a": {"$ref": "#/$defs/missing"}}},
     "the $ref '#/$defs/missing' at properties/a/$ref names no part of this schema"),
    ({"items": {"$ref": "http://127.0.0.1:9/item.json"}}, "a reference to another address is not fetched"),
    ({"$id": "https://example.com/root", "$defs": {"a": {"$id": "part", "$defs": {"b": {}}}},
      "properties": {"x": {"$ref": "part#/$defs/c"}}}, "the $ref 'part#/$defs/c' at properties/x/$ref"),
])
def test_check_schema_names_what_cannot_be_used(schema, words):
    with pytest.raises(SchemaError) as caught:
        user_regex.check_schema(schema)
    assert words in caught.value.message, caught.value.message


def test_a_schemas_validator_is_built_once_and_kept_apart_from_the_callers_dict():
    schema = {"type": "object", "properties": {"n": {"type": "integer"}}}
    validator = user_regex.schema_validator(schema)
    assert user_regex.schema_validator({"properties": {"n": {"type": "integer"}}, "type": "object"}) is validator
    schema["properties"]["n"]["type"] = "string"  # the caller's dict changed: the kept validator did not
    assert [error.message for error in user_regex.schema_errors(validator, {"n": "1"}, timeout=1)] == \
        ["'1' is not of type 'integer'"]
    assert user_regex.schema_errors(user_regex.schema_validator(schema), {"n": "1"}, timeout=1) == []


@pytest.mark.parametrize("schema", [
    {"$defs": {"text": {"type": "string"}}, "properties": {"a": {"$ref": "#/$defs/text"}}},
    {"$defs": {"node": {"$anchor": "node", "items": {"$ref": "#node"}}}, "$ref": "#node"},  # itself, by anchor
    # a part with an $id of its own: its references resolve against it
    {"$id": "https://example.com/root", "$defs": {"a": {"$id": "part", "$defs": {"b": {"type": "integer"}},
                                                     "items": {"$ref": "#/$defs/b"}}},
     "properties": {"x": {"$ref": "part"}, "y": {"$ref": "part#/$defs/b"}}},
    # data, and names: no reference in them
    {"const": {"$ref": "#/nowhere"}, "default": {"$ref": "http://127.0.0.1:9/x"}},
    {"properties": {"$ref": {"type": "string"}}},
])
def test_check_schema_resolves_the_references_a_schema_may_make(schema):
    user_regex.check_schema(schema)
    user_regex.schema_errors(user_regex.schema_validator(schema), {}, timeout=1)


@pytest.mark.parametrize("pattern", [
    "(?x)((a{30}) {30}) {30}",  # verbose: the space between an atom and its repeat is ignored
    "(?x)((a{30}){ 30 }){ 30 }",  # verbose: so are spaces inside the braces
    "(?x)((a{30})#(\n{30})#(\n{30}",  # verbose: a comment, even one that opens a group
    "(?ix:((a{30}) {30}) {30})",  # verbose in a scoped group, with other flags
])
def test_a_verbose_pattern_is_measured_as_regex_reads_it(pattern):
    """Each unrolls to 27,000 elements, as ((a{30}){30}){30} does."""
    assert user_regex.compile_pattern("((a{30}) {30}) {30}")  # not verbose: the spaces are repeated
    with pytest.raises(user_regex.PatternError, match="too large"):
        user_regex.compile_pattern(pattern)
