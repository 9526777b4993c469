"""Request body parsers that refuse what the database or the Python stack cannot take, as 400s:
JSON nested deeper than MAX_JSON_DEPTH (the stdlib decoder would raise RecursionError, a 500), and
in any string or key a NUL character or half a surrogate pair (JSON may spell "\\ud800"; Postgres text
and jsonb cannot store either, nor can UTF-8 encode the second), with the messages DRF's text fields give."""

from __future__ import annotations

import re

from rest_framework import parsers
from rest_framework.exceptions import ParseError, ValidationError
from rest_framework.validators import ProhibitSurrogateCharactersValidator

MAX_JSON_DEPTH = 100
NUL = "\x00"
NUL_MESSAGE = "Null characters are not allowed."
_SURROGATE = re.compile("[\ud800-\udfff]")
_SURROGATES = ProhibitSurrogateCharactersValidator()  # what every DRF CharField runs


def text_problem(text: str) -> str | None:
    """Why `text` cannot be stored, in the words of DRF's text fields (a NUL, half a surrogate pair), or None."""
    if NUL in text:
        return NUL_MESSAGE
    if _SURROGATE.search(text):
        try:
            _SURROGATES(text)
        except ValidationError as exc:
            return str(exc.detail[0])
    return None


def nul_parameter(params) -> str | None:
    """The name of the first parameter of `params` (a QueryDict) whose name or a value holds a NUL (the name without
    it, "query" when nothing is left), else None: Postgres can neither store nor compare one, so a filter, a search
    or a cursor carrying it is refused (by the API's views and by every admin page) before anything reads it."""
    for name, values in params.lists():
        if NUL in name or any(NUL in value for value in values):
            return name.replace(NUL, "") or "query"
    return None


def _refuse(field: str, problem: str) -> ValidationError:
    if NUL in field:
        return ValidationError({"non_field_errors": ["A field name contains a null character."]})
    if text_problem(field):  # the name cannot be a key of the answer either (it cannot be encoded)
        return ValidationError({"non_field_errors": [f"A field name holds a character that is not allowed: "
                                                     f"{problem}"]})
    return ValidationError({field or "non_field_errors": [problem]})


def check_json(data) -> None:
    """Walk a parsed JSON value without recursion: too deep is a ParseError, a NUL or a lone surrogate a
    ValidationError naming the top-level field it is under."""
    stack = [(data, 1, "")]
    while stack:
        value, depth, field = stack.pop()
        if depth > MAX_JSON_DEPTH:
            raise ParseError(f"JSON parse error - nested too deeply (more than {MAX_JSON_DEPTH} levels).")
        if isinstance(value, dict):
            for key, item in value.items():
                top = field or key
                if problem := text_problem(key):
                    raise _refuse(top, problem)
                stack.append((item, depth + 1, top))
        elif isinstance(value, list):
            stack.extend((item, depth + 1, field) for item in value)
        elif isinstance(value, str) and (problem := text_problem(value)):
            raise _refuse(field, problem)


def check_form(data) -> None:
    for key, values in data.lists():
        for text in (key, *(value for value in values if isinstance(value, str))):
            if problem := text_problem(text):
                raise _refuse(key, problem)


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
