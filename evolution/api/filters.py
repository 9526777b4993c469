"""Query parameters of the evolution lists. A row chosen by id (a workflow, a golden set) must be one of the
caller's workspaces: another workspace's id is "not a valid choice", exactly like a missing one."""

import django_filters

from evals.api.filters import StrictBooleanFilter
from evals.models import GoldenSet
from evolution.models import EvolutionRun, Individual
from workflows.api.filters import BoundedIntegerFilter, ScopedChoiceFilter
from workflows.models import Workflow
from workspaces.api.filters import WorkspaceFilter


class EvolutionRunFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter()
    workflow = ScopedChoiceFilter(field_name="workflow", model=Workflow, workspace_field="workspace",
                                  help_text="Evolution runs of this workflow (one of yours).")
    golden_set = ScopedChoiceFilter(field_name="golden_set", model=GoldenSet, workspace_field="workspace",
                                    help_text="Evolution runs scored on this golden set (one of yours).")
    status = django_filters.MultipleChoiceFilter(choices=EvolutionRun.Status.choices, help_text="Repeat for several.")
    mode = django_filters.MultipleChoiceFilter(choices=EvolutionRun.Mode.choices, help_text="Repeat for several.")

    class Meta:
        model = EvolutionRun
        fields = ["workspace", "workflow", "golden_set", "status", "mode"]


class IndividualFilter(django_filters.FilterSet):
    generation = BoundedIntegerFilter(field_name="generation__number",
                                      help_text="Individuals of the generation with this number (0 is the first).")
    survived = StrictBooleanFilter(help_text="Individuals that survived into the next generation (true) or not.")
    kind = django_filters.CharFilter(max_length=30, help_text='The operator that made it ("base", "prompt", '
                                                              '"crossover", "immigrant", ...).')

    class Meta:
        model = Individual
        fields = ["generation", "survived", "kind"]
