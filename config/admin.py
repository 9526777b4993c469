"""Admin building blocks shared by the apps (no models are registered here)."""

from collections.abc import Callable
from datetime import timedelta

from django.contrib import admin
from django.contrib.admin.options import IncorrectLookupParameters
from django.core.paginator import Paginator
from django.db import connection
from django.db.models import Count, Q
from django.utils import timezone
from django.utils.functional import cached_property


class EstimatedCountPaginator(Paginator):
    """On an unfiltered changelist the count comes from pg_class.reltuples (about 1 ms) rather than a
    COUNT(*) over the whole table; small or never-analysed tables, and filtered lists, count exactly."""

    exact_below = 10_000

    @cached_property
    def count(self):
        query = getattr(self.object_list, "query", None)
        if query is not None and not query.where:
            with connection.cursor() as cursor:
                cursor.execute("SELECT reltuples::bigint FROM pg_class WHERE oid = to_regclass(%s)",
                               [query.model._meta.db_table])
                row = cursor.fetchone()
            if row and row[0] is not None and row[0] >= self.exact_below:
                return int(row[0])
        return super().count


class ReadOnlyAdmin(admin.ModelAdmin):
    """History is never edited by hand: no add, change or delete."""

    def has_add_permission(self, request):
        return False

    def has_change_permission(self, request, obj=None):
        return False

    def has_delete_permission(self, request, obj=None):
        return False


class PostActionsMixin:
    """Buttons on a read-only change page that act on the row through a service (cancel, decide,
    promote...): each a POST view inside the admin, allowed with the model's change permission (the
    admin itself stays read-only), on a row the user may see (another workspace's row is missing)."""

    def has_act_permission(self, request) -> bool:
        return request.user.has_perm(f"{self.opts.app_label}.change_{self.opts.model_name}")

    def _acting_on(self, request, object_id):
        """The row a POST acts on, or the response that refuses it."""
        from django.contrib.admin.utils import unquote
        from django.core.exceptions import PermissionDenied
        from django.http import HttpResponseNotAllowed

        if request.method != "POST":
            return None, HttpResponseNotAllowed(["POST"])
        obj = self.get_object(request, unquote(object_id))
        if obj is None:  # missing or of another workspace: as the change page does
            return None, self._get_obj_does_not_exist_redirect(request, self.opts, object_id)
        if not self.has_view_permission(request, obj) or not self.has_act_permission(request):
            raise PermissionDenied
        return obj, None

    def _change_page(self, obj, anchor: str = ""):
        from django.contrib.admin.utils import quote
        from django.http import HttpResponseRedirect
        from django.urls import reverse

        url = reverse(f"admin:{self.opts.app_label}_{self.opts.model_name}_change", args=[quote(obj.pk)])
        return HttpResponseRedirect(url + (f"#{anchor}" if anchor else ""))


class NamedObjectMixin:
    """A change page titled, and its breadcrumb ended, by `object_name(obj)`: what a person calls the row (a
    version's hash, a set's name), where the model's `__str__` has only ids at hand."""

    def object_name(self, obj) -> str:
        return str(obj)

    def render_change_form(self, request, context, add=False, change=False, form_url="", obj=None):
        if obj is not None:
            context["subtitle"] = context["object_name"] = self.object_name(obj)
        return super().render_change_form(request, context, add, change, form_url, obj)


class ChangePagePanels:
    """Sections an app adds to the change page of a model of an app below it (the evals' scores and "add to
    golden set" on a workflow invocation's page): the lower app's page draws what the panels registered for its
    model give, and never imports the app above (DESIGN.md: apps depend downwards only). A panel is
    `panel(request, obj) -> dict | None`: the context of its section, with the "template" that draws it, or None
    to draw nothing; it is called once a page, and its queries count in the page's budget."""

    def __init__(self):
        self._panels: dict[str, dict[str, Callable]] = {}

    def register(self, model, panel: Callable) -> Callable:
        # keyed by the panel's name: importing the registering module again registers it once
        self._panels.setdefault(model._meta.label, {})[f"{panel.__module__}.{panel.__qualname__}"] = panel
        return panel

    def for_object(self, request, obj) -> list[dict]:
        drawn = (panel(request, obj) for panel in self._panels.get(obj._meta.label, {}).values())
        return [context for context in drawn if context]


change_page_panels = ChangePagePanels()


class BucketFilter(admin.SimpleListFilter):
    """A filter of named buckets, each a Q on the listed rows (`buckets`: key -> (label, a function giving the
    Q)); its facet counts are one aggregate, a count per bucket."""

    buckets: dict[str, tuple[str, Callable[[], Q]]] = {}

    def lookups(self, request, model_admin):
        return [(key, label) for key, (label, _) in self.buckets.items()]

    def queryset(self, request, queryset):
        if not self.value():
            return queryset
        if self.value() not in self.buckets:
            raise IncorrectLookupParameters(f"{self.parameter_name}: use one of {', '.join(self.buckets)}")
        return queryset.filter(self.buckets[self.value()][1]())

    def get_facet_counts(self, pk_attname, filtered_qs):
        return {f"{index}__c": Count(pk_attname, filter=match())
                for index, (_label, match) in enumerate(self.buckets.values())}


class CreatedWithinFilter(BucketFilter):
    """Rows created in the last hour, day, week or month (a created_at index serves it)."""

    title, parameter_name = "created", "created"
    buckets = {key: (label, lambda window=window: Q(created_at__gte=timezone.now() - window))
               for key, label, window in (("1h", "last hour", timedelta(hours=1)),
                                          ("24h", "last 24 hours", timedelta(days=1)),
                                          ("7d", "last 7 days", timedelta(days=7)),
                                          ("30d", "last 30 days", timedelta(days=30)))}
