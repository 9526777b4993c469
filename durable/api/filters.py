"""Query parameters of the run list (also taken by facets and the bulk actions), parsed into the
keyword arguments of ``durable.selectors.run_filter``. A bad value is a 400 naming the parameter."""

from __future__ import annotations

import django_filters
from django import forms
from drf_spectacular.utils import extend_schema_field

from durable import selectors
from durable.errors import InvalidFilter
from durable.models import DurableRun, Schedule
from workspaces.api.filters import WorkspaceFilter


class MultiValueField(forms.Field):
    """A repeatable query parameter (`?tag=a&tag=b`) as a list of strings."""

    widget = forms.SelectMultiple

    def to_python(self, value):
        if not value:
            return []
        return [str(item) for item in value if str(item) != ""]


@extend_schema_field({"type": "array", "items": {"type": "string"}})
class MultiValueFilter(django_filters.Filter):
    field_class = MultiValueField

    def filter(self, qs, value):
        return qs  # applied by RunFilter.filter_queryset through the selectors


class RunFilter(django_filters.FilterSet):
    workflow = django_filters.CharFilter(help_text="Workflow name.")
    status = django_filters.MultipleChoiceFilter(choices=DurableRun.Status.choices,
                                                 help_text="Run status; repeat for several.")
    tag = MultiValueFilter(help_text="Runs carrying this tag; repeat to require several.")
    attr = MultiValueFilter(help_text="Attribute comparison key:op:value with op eq, ne, gt, gte, lt or lte "
                                      "(gt..lte compare numbers), e.g. amount:gte:10; repeatable.")
    parent = django_filters.CharFilter(help_text="Children of this run id.")
    workspace = WorkspaceFilter(help_text="Runs of one of your workspaces.")
    created_after = django_filters.IsoDateTimeFilter(help_text="Created at or after (ISO 8601).")
    created_before = django_filters.IsoDateTimeFilter(help_text="Created before (ISO 8601).")

    class Meta:
        model = DurableRun
        fields: list[str] = []

    def clean_attributes(self) -> list[selectors.AttributeFilter]:
        items = []
        for text in self.form.cleaned_data.get("attr") or []:
            try:
                items.append(selectors.AttributeFilter.parse(text))
            except InvalidFilter as exc:
                # the message quotes the caller's text: pass it as a parameter, never as a %-template
                self.form.add_error("attr", forms.ValidationError("%(message)s", params={"message": exc.message}))
        return items

    def is_valid(self):
        if not super().is_valid():
            return False
        self._attributes = self.clean_attributes()
        return not self.form.errors

    @property
    def errors(self):
        return self.form.errors

    def selector_kwargs(self) -> dict:
        data = self.form.cleaned_data
        kwargs = {
            "workflow": data.get("workflow") or None,
            "statuses": data.get("status") or None,
            "tags": data.get("tag") or None,
            "attributes": getattr(self, "_attributes", []),
            "parent": data.get("parent") or None,
            "created_after": data.get("created_after"),
            "created_before": data.get("created_before"),
        }
        if data.get("workspace") is not None:
            kwargs["namespaces"] = [data["workspace"].namespace]
        return kwargs

    def has_filters(self) -> bool:
        kwargs = self.selector_kwargs()
        return any(value not in (None, [], "") for value in kwargs.values())

    def filter_queryset(self, queryset):
        return selectors.run_filter(queryset, **self.selector_kwargs())


class ScheduleFilter(django_filters.FilterSet):
    workflow = django_filters.CharFilter()
    paused = django_filters.BooleanFilter()
    workspace = WorkspaceFilter(method="filter_workspace", help_text="Schedules of one of your workspaces.")

    def filter_workspace(self, queryset, name, value):
        return queryset.filter(namespace=value.namespace) if value is not None else queryset

    class Meta:
        model = Schedule
        fields = ["workflow", "paused"]

