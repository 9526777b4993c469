from rest_framework.routers import DefaultRouter


class ApiRouter(DefaultRouter):
    """DefaultRouter without format-suffix URLs (`.../timeline.json`): every view would have to take a
    `format` argument, and one that does not answers a 500. `?format=json` and the Accept header choose
    the format instead."""

    include_format_suffixes = False
