"""The one root of the errors a service raises for a request it cannot carry out, shared by the apps.

Three kinds, each answered once by the API's exception handler (workspaces/api/errors.py) in its one error body:

- ``Invalid``: bad input, 400 naming each field at fault (``errors`` maps a field to its messages);
- ``Conflict``: the current state forbids it (a run that has ended, an ingest under way), 409 with ``message``;
- ``NotFound``: no such row, 404 that says no more than a missing URL does (another workspace's row reads the
  same).

A plain ``ServiceError`` is answered as ``Invalid``. An app keeps a root of its own when callers catch it
(``EvalError``, ``EvolutionError``, ``KnowledgeError`` subclass ``Invalid``); an app error of another kind lists
that kind first and the app's root second (``class GoldenSetBusy(Conflict, EvalError)``): the API answers by
the kind, a caller catching the app's root still catches it. The admin and the management commands show
``str(exc)``. Views never translate these case by case.
"""

from __future__ import annotations


class ServiceError(Exception):
    """A request a service cannot carry out: `ServiceError({"field": ["message", ...]})`, or
    `ServiceError("message", field="field")` (no field: the request as a whole). `errors` maps each field at
    fault to its messages; `message` is the sentence shown (for a mapping, "field: message; ..."); `code` is the
    API's error code and `details` members its error body adds (PromotionRefused's evidence)."""

    code = "invalid"

    def __init__(self, errors: dict[str, list[str]] | str = "", *, field: str = ""):
        if isinstance(errors, dict):
            self.errors = errors
            self.message = "; ".join(f"{name}: {m}" for name, messages in errors.items() for m in messages)
        else:
            self.errors = {field or "non_field_errors": [errors]}
            self.message = errors
        self.field = field
        self.details: dict = {}
        super().__init__(self.message)


class Invalid(ServiceError, ValueError):
    """Bad input: the API answers 400, naming each field in `errors`."""


class Conflict(ServiceError):
    """The current state forbids the request: the API answers 409 with `message`."""

    code = "conflict"


class NotFound(ServiceError, LookupError):
    """No such row: the API answers 404."""

    code = "not_found"
