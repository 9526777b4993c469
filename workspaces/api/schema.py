"""OpenAPI additions: every operation documents its errors, all in the one error body (see errors.py)."""

ERROR_SCHEMA = {
    "type": "object",
    "required": ["error"],
    "properties": {
        "error": {
            "type": "object",
            "required": ["status", "code", "message"],
            "properties": {
                "status": {"type": "integer", "description": "The HTTP status, repeated."},
                "code": {"type": "string", "description": "invalid, not_found, permission_denied, conflict..."},
                "message": {"type": "string", "description": "A readable sentence naming each offending field."},
                "fields": {"type": "object", "additionalProperties": True,
                           "description": "For invalid input: the messages of each offending field."},
            },
        },
    },
}
ERROR_RESPONSE = {
    "description": "An error: 400 invalid input (naming the field), 401 not signed in, 403 not allowed, "
                   "404 not found or not in your workspaces, 409 conflict, 413 body too large.",
    "content": {"application/json": {"schema": {"$ref": "#/components/schemas/Error"}}},
}


def add_error_responses(result, generator, request, public):
    """drf-spectacular post-processing hook: the Error component, and a 4XX response on every operation."""
    result.setdefault("components", {}).setdefault("schemas", {})["Error"] = ERROR_SCHEMA
    for item in result.get("paths", {}).values():
        for operation in item.values():
            if isinstance(operation, dict) and "responses" in operation:
                operation["responses"].setdefault("4XX", ERROR_RESPONSE)
    return result
