from rest_framework.exceptions import NotFound, ValidationError
from rest_framework.pagination import CursorPagination


class IdCursorPagination(CursorPagination):
    """Cursor pages over the primary key: stable under inserts, served by the pk index."""

    ordering = "-id"
    page_size = 50
    page_size_query_param = "page_size"
    max_page_size = 200

    def decode_cursor(self, request):
        try:
            return super().decode_cursor(request)
        except NotFound:
            raise ValidationError({"cursor": ["Invalid cursor: use the `next` or `previous` link as given."]}) \
                from None

    def get_page_size(self, request):
        raw = request.query_params.get(self.page_size_query_param)
        if raw is not None and (not raw.isdigit() or int(raw) < 1):
            raise ValidationError({self.page_size_query_param: [f"Must be an integer from 1 to {self.max_page_size}."]})
        return super().get_page_size(request)
