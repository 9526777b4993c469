"""Query parameters of the evals lists. A row chosen by id (a golden set, a workflow, a version) must be one of
the caller's workspaces: another workspace's id is "not a valid choice", exactly like a missing one."""

import django_filters
from django import forms
from django.db.models import Q
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import extend_schema_field

from evals.models import EvalRun, EvalRunStatus, GoldenItem, GoldenResult, GoldenSet, Promotion
from workflows.api.filters import ScopedChoiceFilter
from workflows.models import Workflow, WorkflowVersion
from workspaces.api.filters import WorkspaceFilter


def _golden_set_filter(field_name: str, **kwargs):
    return ScopedChoiceFilter(field_name=field_name, model=GoldenSet, workspace_field="workspace", **kwargs)


def _workflow_filter(field_name: str, **kwargs):
    return ScopedChoiceFilter(field_name=field_name, model=Workflow, workspace_field="workspace", **kwargs)


def _version_filter(field_name: str, **kwargs):
    return ScopedChoiceFilter(field_name=field_name, model=WorkflowVersion, workspace_field="workflow__workspace",
                              **kwargs)


class StrictBooleanField(forms.Field):
    """true/false, 1/0, yes/no; anything else is an error (the stock boolean filter ignores it, so a typo
    would silently answer every row)."""

    VALUES = {"true": True, "1": True, "yes": True, "false": False, "0": False, "no": False}

    def to_python(self, value):
        if value in (None, ""):
            return None
        try:
            return self.VALUES[str(value).strip().lower()]
        except KeyError:
            raise forms.ValidationError("Must be true or false (1 or 0).", code="invalid") from None


@extend_schema_field(OpenApiTypes.BOOL)
class StrictBooleanFilter(django_filters.Filter):
    field_class = StrictBooleanField


class GoldenSetFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter()
    workflow = _workflow_filter("workflow", help_text="Golden sets of this workflow (one of yours).")
    q = django_filters.CharFilter(method="filter_q", max_length=200, help_text="Words in the name or description.")

    class Meta:
        model = GoldenSet
        fields = ["workspace", "workflow"]

    def filter_q(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(description__icontains=value))


class GoldenItemFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter(field_name="golden_set__workspace")
    golden_set = _golden_set_filter("golden_set", help_text="Items of this golden set (one of yours).")
    tag = django_filters.CharFilter(method="filter_tag", max_length=50,
                                    help_text='Items carrying this tag (for example "critical").')
    split = django_filters.MultipleChoiceFilter(choices=GoldenItem.Split.choices,
                                                help_text="Items of this split: train, validation or test (repeat "
                                                          "for several).")

    class Meta:
        model = GoldenItem
        fields = ["workspace", "golden_set", "tag", "split"]

    def filter_tag(self, queryset, name, value):
        return queryset.filter(tags__contains=[value])


class EvalRunFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter()
    golden_set = _golden_set_filter("golden_set", help_text="Eval runs on this golden set.")
    workflow_version = _version_filter("workflow_version", help_text="Eval runs of this version.")
    workflow = _workflow_filter("workflow_version__workflow", help_text="Eval runs of this workflow's versions.")
    status = django_filters.MultipleChoiceFilter(choices=EvalRunStatus.choices, help_text="Repeat for several.")
    origin = django_filters.MultipleChoiceFilter(choices=EvalRun.Origin.choices, help_text="Repeat for several.")

    class Meta:
        model = EvalRun
        fields = ["workspace", "golden_set", "workflow_version", "workflow", "status", "origin"]


class GoldenResultFilter(django_filters.FilterSet):
    passed = StrictBooleanFilter(help_text="Results that passed (true) or did not (false).")
    grading_error = StrictBooleanFilter(help_text="Results whose grading failed (their score is empty).")

    class Meta:
        model = GoldenResult
        fields = ["passed", "grading_error"]


class PromotionFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter(field_name="workflow__workspace")
    workflow = _workflow_filter("workflow", help_text="Promotions and rollbacks of this workflow.")
    workflow_version = _version_filter("workflow_version", help_text="Activations of this version.")
    golden_set = _golden_set_filter("golden_set", help_text="Promotions decided on this golden set.")

    class Meta:
        model = Promotion
        fields = ["workspace", "workflow", "workflow_version", "golden_set", "action"]
