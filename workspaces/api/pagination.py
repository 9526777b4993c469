from django.core.exceptions import FieldDoesNotExist
from django.core.exceptions import ValidationError as DjangoValidationError
from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination

INVALID_CURSOR = "Invalid cursor: use the `next` or `previous` link as given."


class IdCursorPagination(CursorPagination):
    """Cursor pages over the primary key: stable under inserts, served by the pk index.

    A cursor is client-held text: its position is checked against the ordering field (type and range)
    before it reaches a query, so a tampered one is a 400 on `cursor`, never a database error."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def paginate_queryset(self, queryset, request, view=None):
        self._model = queryset.model
        return super().paginate_queryset(queryset, request, view)

    def decode_cursor(self, request):
        try:
            cursor = super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": [INVALID_CURSOR]}) from None
        if cursor is not None and cursor.position is not None:
            self._check_position(cursor.position)
        return cursor

    def _check_position(self, position: str) -> None:
        first = self.ordering if isinstance(self.ordering, str) else self.ordering[0]
        name = first.lstrip("-")
        try:
            field = self._model._meta.get_field(name)
        except FieldDoesNotExist:
            return  # an annotation: nothing to check it against
        try:
            if "\x00" in position:
                raise DjangoValidationError("null character")
            field.run_validators(field.to_python(position))
        except DjangoValidationError:
            raise ValidationError({"cursor": [INVALID_CURSOR]}) from None

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        # ASCII digits only: str.isdigit() accepts "²", which int() refuses
        if raw is not None and not (raw.isascii() and raw.isdigit() and len(raw) <= 6 and int(raw) >= 1):
            raise ValidationError({self.page_size_query_param: [f"Must be an integer from 1 to {self.max_page_size}."]})
        return super().get_page_size(request)
