"""Request body parsers that refuse what the database or the Python stack cannot take, as 400s:
JSON nested deeper than MAX_JSON_DEPTH (the stdlib decoder would raise RecursionError, a 500) and
NUL characters in any string or key (Postgres text and jsonb cannot store them)."""

from __future__ import annotations

from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError

MAX_JSON_DEPTH = 100
NUL = "\x00"
NUL_MESSAGE = "Null characters are not allowed."


def _refuse_nul(field: str) -> ValidationError:
    if NUL in field:
        return ValidationError({"non_field_errors": ["A field name contains a null character."]})
    return ValidationError({field or "non_field_errors": [NUL_MESSAGE]})


def check_json(data) -> None:
    """Walk a parsed JSON value without recursion: too deep is a ParseError, a NUL a ValidationError
    naming the top-level field it is under."""
    stack = [(data, 1, "")]
    while stack:
        value, depth, field = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ParseError(f"JSON parse error - nested too deeply (more than {MAX_JSON_DEPTH} levels).")
        if isinstance(value, dict):
            for key, item in value.items():
                top = field or key
                if NUL in key:
                    raise _refuse_nul(top)
                stack.append((item, depth + 1, top))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, field) for item in value)
        elif isinstance(value, str) and NUL in value:
            raise _refuse_nul(field)


def check_form(data) -> None:
    for key, values in data.lists():
        if NUL in key or any(isinstance(value, str) and NUL in value for value in values):
            raise _refuse_nul(key)


class JSONParser(parsers.JSONParser):
    def parse(self, stream, media_type=None, parser_context=None):
        try:
            data = super().parse(stream, media_type, parser_context)
        except RecursionError:
            raise ParseError(f"JSON parse error - nested too deeply (more than {MAX_JSON_DEPTH} levels).") \
                from None
        check_json(data)
        return data


class FormParser(parsers.FormParser):
    def parse(self, stream, media_type=None, parser_context=None):
        data = super().parse(stream, media_type, parser_context)
        check_form(data)
        return data


class MultiPartParser(parsers.MultiPartParser):
    def parse(self, stream, media_type=None, parser_context=None):
        result = super().parse(stream, media_type, parser_context)
        check_form(result.data)
        return result
