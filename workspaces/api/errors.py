"""One error body for the whole API.

    {"error": {"status": 400, "code": "invalid", "message": "name: This field is required.",
               "fields": {"name": ["This field is required."]}}}

`fields` appears for validation errors and names every offending field; `message` is
always a readable sentence. Database integrity errors that slip past validation become 409,
data errors (a value the database refuses), Django validation errors and bodies Django refuses to
parse (too many fields) 400, and an oversized body 413, so a client never sees a 500 (or an HTML
page) for bad input. A service's error (config/errors.py) is answered here by its kind, so views do not
translate them: Invalid 400 naming its fields, Conflict 409, NotFound 404. ``api_not_found`` answers
unrouted URLs under /api/ in the same shape.
"""

from __future__ import annotations

from django.conf import settings
from django.core.exceptions import PermissionDenied as DjangoPermissionDenied
from django.core.exceptions import RequestDataTooBig, SuspiciousOperation
from django.core.exceptions import ValidationError as DjangoValidationError
from django.db import DataError, IntegrityError
from django.http import Http404, JsonResponse
from rest_framework import exceptions, status
from rest_framework.response import Response
from rest_framework.views import exception_handler as drf_exception_handler

from config import errors


def _flatten(detail, prefix: str = "") -> list[str]:
    if isinstance(detail, dict):
        out: list[str] = []
        for key, value in detail.items():
            name = key if key != "non_field_errors" else ""
            out.extend(_flatten(value, f"{prefix}.{name}" if prefix and name else (prefix or name)))
        return out
    if isinstance(detail, list):
        out = []
        for index, value in enumerate(detail):
            if isinstance(value, dict | list):
                out.extend(_flatten(value, f"{prefix}[{index}]"))
            else:
                out.extend(_flatten(value, prefix))
        return out
    return [f"{prefix}: {detail}" if prefix else str(detail)]


def _from_service(exc: errors.ServiceError) -> exceptions.APIException:
    """A service's error as DRF's: the first kind it is wins (a Conflict that is also an app's Invalid root is a
    409); any other is bad input, naming its fields."""
    if isinstance(exc, errors.Conflict):
        api = exceptions.APIException(detail=exc.message, code=exc.code)
        api.status_code = status.HTTP_409_CONFLICT
        return api
    if isinstance(exc, errors.NotFound):
        return exceptions.NotFound()
    return exceptions.ValidationError(exc.errors)


def exception_handler(exc, context):
    details = exc.details if isinstance(exc, errors.ServiceError) else {}
    if isinstance(exc, errors.ServiceError):
        exc = _from_service(exc)
    elif isinstance(exc, DjangoValidationError):
        exc = exceptions.ValidationError(exc.message_dict if hasattr(exc, "error_dict") else {"detail": exc.messages})
    elif isinstance(exc, IntegrityError):
        exc = exceptions.APIException(detail="The request conflicts with existing data.", code="conflict")
        exc.status_code = status.HTTP_409_CONFLICT
    elif isinstance(exc, DataError):
        # a value the database refuses (out of range, an invalid character) that validation let through
        exc = exceptions.ValidationError({"non_field_errors": ["A value in the request cannot be stored or "
                                                               "compared by the database."]})
    elif isinstance(exc, Http404):
        exc = exceptions.NotFound()
    elif isinstance(exc, DjangoPermissionDenied):
        exc = exceptions.PermissionDenied()
    elif isinstance(exc, RequestDataTooBig):
        limit_mb = settings.DATA_UPLOAD_MAX_MEMORY_SIZE / (1024 * 1024)
        exc = exceptions.APIException(
            detail=f"The request body is larger than {limit_mb:.1f} MB; send large content as a file upload.",
            code="too_large")
        exc.status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    elif isinstance(exc, SuspiciousOperation):
        # a body Django refuses to parse (too many fields or files): bad input, not a server error
        exc = exceptions.ParseError(f"The request was refused: {exc}")

    response = drf_exception_handler(exc, context)
    if response is None:
        return None
    detail = response.data
    body: dict = {"status": response.status_code}
    if isinstance(exc, exceptions.ValidationError):
        fields = detail if isinstance(detail, dict) else {"non_field_errors": detail}
        body["code"] = "invalid"
        body["message"] = "; ".join(_flatten(fields)) or "Invalid input."
        body["fields"] = fields
    else:
        codes = exc.get_codes() if isinstance(exc, exceptions.APIException) else None
        body["code"] = codes if isinstance(codes, str) else "error"
        body["message"] = "; ".join(_flatten(detail)) if not isinstance(detail, dict) or "detail" not in detail \
            else str(detail["detail"])
    body.update(details)
    return Response({"error": body}, status=response.status_code, headers=_headers(response))


def _headers(response) -> dict[str, str]:
    return {key: value for key, value in response.items() if key in {"WWW-Authenticate", "Retry-After", "Allow"}}


class ApiNotFoundMiddleware:
    """Django's 404 page (HTML, the technical page in DEBUG) for an unrouted URL under /api/ becomes
    the API's JSON error body. Placed before CommonMiddleware, so its slash redirects still happen."""

    def __init__(self, get_response):
        self.get_response = get_response

    def __call__(self, request):
        response = self.get_response(request)
        if (response.status_code == 404 and request.path.startswith("/api/")
                and not isinstance(response, Response)):
            return JsonResponse({"error": {"status": 404, "code": "not_found",
                                           "message": f"No API endpoint at {request.path}."}}, status=404)
        return response
