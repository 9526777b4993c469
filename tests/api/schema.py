"""The API as its OpenAPI schema describes it: the schema-driven suites walk these operations, so an
endpoint added later is covered without a line in the tests."""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cache

METHODS = ("get", "post", "put", "patch", "delete")
PARAM = re.compile(r"\{([^}]+)\}")


@dataclass(frozen=True)
class Operation:
    method: str
    path: str  # with {placeholders}
    spec: dict

    @property
    def collection(self) -> str:
        """The list path the operation's placeholders refer to ("/api/durable/runs/" for .../{id}/timeline/)."""
        return self.path.split("{", 1)[0]

    @property
    def is_detail(self) -> bool:
        return "{" in self.path

    def query_parameters(self) -> list[str]:
        return [p["name"] for p in self.spec.get("parameters", []) if p.get("in") == "query"]

    def url(self, value) -> str:
        return PARAM.sub(str(value), self.path)

    @property
    def has_body(self) -> bool:
        return "requestBody" in self.spec

    def __str__(self) -> str:
        return f"{self.method.upper()} {self.path}"


@cache
def _schema() -> dict:
    from drf_spectacular.generators import SchemaGenerator

    return SchemaGenerator().get_schema(request=None, public=True)


def schema() -> dict:
    return _schema()


def operations(*, method: str | None = None) -> list[Operation]:
    found = []
    for path, item in schema()["paths"].items():
        if not path.startswith("/api/") or path.startswith(("/api/schema", "/api/auth/")):
            continue
        for verb in METHODS:
            if verb in item and (method is None or verb == method):
                found.append(Operation(verb, path, item[verb]))
    return found


def collections() -> list[str]:
    """List endpoints with detail routes: the kinds of objects the API exposes."""
    return sorted({op.collection for op in operations() if op.is_detail})


def request_properties(op: Operation) -> dict:
    """The JSON request body's properties (resolved through components)."""
    content = op.spec.get("requestBody", {}).get("content", {})
    body = content.get("application/json", {}).get("schema", {})
    ref = body.get("$ref", "")
    if ref:
        body = schema()["components"]["schemas"][ref.rsplit("/", 1)[-1]]
    return body.get("properties", {})


def assert_error_shape(response, *, status: int | None = None) -> dict:
    """The one error body: {"error": {"status", "code", "message"[, "fields"]}}, as JSON."""
    assert response["Content-Type"].startswith("application/json"), (response.status_code, response["Content-Type"])
    body = response.json()
    assert set(body) == {"error"}, body
    error = body["error"]
    assert error["status"] == response.status_code
    assert isinstance(error["code"], str) and error["code"]
    assert isinstance(error["message"], str) and error["message"]
    if status is not None:
        assert response.status_code == status, error
    return error
