"""The browsable API's pages: DRF's, with a link to the admin's page of what they show."""

from __future__ import annotations

from django.contrib import admin
from django.contrib.admin.utils import quote
from django.urls import NoReverseMatch, reverse
from rest_framework.renderers import BrowsableAPIRenderer


class LinkedBrowsableAPIRenderer(BrowsableAPIRenderer):
    """A resource's page links to the admin's list of its model, a row's page to the row's change page
    (staff only: the admin is staff-only)."""

    def get_context(self, data, accepted_media_type, renderer_context):
        context = super().get_context(data, accepted_media_type, renderer_context)
        view, request = renderer_context.get("view"), renderer_context.get("request")
        queryset = getattr(view, "queryset", None)
        context["admin_url"] = None
        if queryset is not None and request is not None and request.user.is_staff:
            pk = (getattr(view, "kwargs", None) or {}).get(getattr(view, "lookup_url_kwarg", None)
                                                            or getattr(view, "lookup_field", "pk"))
            context["admin_url"] = admin_link(queryset.model, pk)
        return context


def admin_link(model, pk=None) -> str | None:
    """The admin's change page of row `pk` of `model` (its list without `pk`), or None when the admin has no
    page for the model (the browsable API links to it)."""
    if not admin.site.is_registered(model):
        return None
    name = f"admin:{model._meta.app_label}_{model._meta.model_name}_{'change' if pk is not None else 'changelist'}"
    try:
        # the admin escapes a key's "/", ":", "_"... in its URLs and reads them back so (a run id "ws-1:nightly_2F1")
        return reverse(name, args=[quote(pk)] if pk is not None else [])
    except NoReverseMatch:
        return None
