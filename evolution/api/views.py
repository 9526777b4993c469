"""Evolution runs over HTTP, scoped to the caller's workspaces: start, pause, resume, cancel a run, promote its
best version, and read its generations, individuals and genealogy; and a version's lineage. Another workspace's
rows are not in any queryset, so their ids are 404 like missing ones, and naming them in a body or a filter is a
400 on that field."""

from __future__ import annotations

from django.contrib.postgres.aggregates import ArrayAgg
from django.db.models import Exists, F, Max, Min, OuterRef, Q
from django_filters.utils import translate_validation
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.errors import Conflict
from evals.api.serializers import PromotionSerializer
from evals.models import EvalRun, Promotion
from evals.services import EvalError, PromotionRefused
from evolution import services
from evolution.api.filters import EvolutionRunFilter, IndividualFilter
from evolution.api.serializers import (
    GENEALOGY_MAX_NODES,
    LINEAGE_MAX_DEPTH,
    LINEAGE_MAX_NODES,
    EvolutionRunCancelSerializer,
    EvolutionRunDetailSerializer,
    EvolutionRunSerializer,
    EvolutionRunStartSerializer,
    GenealogySerializer,
    GenerationSerializer,
    IndividualSerializer,
    LineageSerializer,
    PromoteBestRefusedBodySerializer,
    config_guide,
)
from evolution.models import EvolutionRun, Generation, Individual
from evolution.selectors import ANCESTOR_DEPTH, run_genealogy_versions
from workflows.api.serializers import _link
from workflows.models import WorkflowVersion
from workflows.selectors import version_ancestors, version_descendants
from workspaces.api.base import WorkspaceScopedMixin
from workspaces.api.pagination import IdCursorPagination


class NumberCursorPagination(IdCursorPagination):
    ordering = ("number",)  # unique per run; the (evolution_run, number) unique index serves it


class IndividualCursorPagination(IdCursorPagination):
    ordering = ("id",)  # written generation by generation, so this is generation order


INDIVIDUAL_PARAMETERS = [
    OpenApiParameter("generation", OpenApiTypes.INT, description="Individuals of the generation with this number "
                                                                 "(0 is the first)."),
    OpenApiParameter("survived", OpenApiTypes.BOOL, description="Survived into the next generation (true) or not."),
    OpenApiParameter("kind", OpenApiTypes.STR, description='The operator that made it ("base", "prompt", "tool", '
                                                           '"crossover", "immigrant", ...).'),
]

START_DESCRIPTION = (
    "Starts a durable run that evolves the workflow from its base version; every individual is a version scored "
    "by an eval run on the golden set. The workflow, the golden set and the base version must be of one "
    "workspace. Refused (400, naming the field: `golden_set`, `base_version`, `config.population`, "
    "`base_version.tools`...) when the set has no items, a setting is unknown or out of range, or the base "
    "cannot run here.\n\nSettings (`config`), each optional:\n\n" + config_guide()
    + "\n\nAlso: `elites` < `population`; `crossover_rate` + `mutation_rate` <= 1.")

GENEALOGY_DESCRIPTION = (
    "Every version that took part in the run (its individuals and its base) and their ancestors through either "
    "parent, back to the base (the base's own ancestors are left out), as nodes, and parent-to-child edges "
    f"between them (ancestors at most {ANCESTOR_DEPTH} generations up). A node's fitness is the best it scored in "
    f"this run (0-100). At most {GENEALOGY_MAX_NODES} nodes: past that the run's individuals come first (oldest "
    "first), then their ancestors, and `truncated` is true. A fixed number of queries (one recursive), whatever the "
    "number of versions.")

LINEAGE_DESCRIPTION = (
    "The version's ancestors and descendants through either parent, each with its depth (generations away, "
    f"nearest first; at most {LINEAGE_MAX_NODES} each, {LINEAGE_MAX_DEPTH} generations deep), and its path back to "
    "its root following first parents, oldest first. Each step of the path has its fitness (0-100) from the "
    "step's **latest completed eval run on any golden set** (by end time, then id; `eval_run` and `golden_set` "
    "say which), and the change from the step before when both are known. Registered by the evolution app "
    "(evolution/api/urls.py).")


# ------------------------------------------------------------------------------------------------ reads

def _version_url(request):
    """A function of a version id to its detail URL (reversed once, not per node)."""
    sample = _link(request, "workflow-version-detail", 0)
    prefix = sample[: -len("0/")]
    return lambda pk: f"{prefix}{pk}/"


def run_genealogy(run: EvolutionRun, *, request=None, limit: int = GENEALOGY_MAX_NODES) -> dict:
    """The run's genealogy graph ({"nodes", "edges", "truncated", "node_limit"}): the versions of
    evolution.selectors.run_genealogy_versions (those that took part and their ancestors back to the base) and the
    base, the run's individuals first, each with its best fitness in the run and the operator that first made it.
    Two queries, whatever the number of versions."""
    members = {row["workflow_version_id"]: row for row in Individual.objects.filter(evolution_run=run).order_by()
               .values("workflow_version_id").annotate(best=Max("fitness"), first_generation=Min("generation__number"),
                                                       kinds=ArrayAgg("kind", order_by=("generation__number", "id")))}
    took_part = Individual.objects.filter(evolution_run=run, workflow_version=OuterRef("pk"))
    rows = list(WorkflowVersion.objects.filter(Q(pk__in=run_genealogy_versions(run).values("pk"))
                                               | Q(pk=run.base_version_id))
                .annotate(took_part=Exists(took_part)).order_by("-took_part", "pk")
                .values_list("pk", "operation", "parent1_id", "parent2_id")[: limit + 1])
    truncated, rows = len(rows) > limit, rows[:limit]
    url = _version_url(request)
    kept = {row[0] for row in rows}
    nodes, edges = [], set()
    for pk, operation, parent1, parent2 in rows:
        member = members.get(pk, {})
        nodes.append({"id": pk, "generation": member.get("first_generation"), "operation": operation,
                      "fitness": member.get("best"), "kind": (member.get("kinds") or [""])[0],
                      "is_base": pk == run.base_version_id, "is_best": pk == run.best_version_id, "url": url(pk)})
        edges.update((parent, pk, operation) for parent in (parent1, parent2) if parent in kept)
    return {"nodes": nodes, "edges": [{"source": source, "target": target, "operation": operation}
                                      for source, target, operation in sorted(edges)],
            "truncated": truncated, "node_limit": limit}


def version_lineage(version: WorkflowVersion, *, request=None) -> dict:
    """A version's ancestors and descendants with their depth (one recursive query each), and its path back to
    its root along first parents, each step with the fitness of its latest completed eval run on any set."""
    ancestors = version_ancestors(version.pk, max_depth=LINEAGE_MAX_DEPTH)
    descendants = version_descendants(version.pk, max_depth=LINEAGE_MAX_DEPTH)
    truncated = any(len(found) > LINEAGE_MAX_NODES or (found and found[-1][1] >= LINEAGE_MAX_DEPTH)
                    for found in (ancestors, descendants))
    ancestors, descendants = ancestors[:LINEAGE_MAX_NODES], descendants[:LINEAGE_MAX_NODES]
    ids = {version.pk, *(pk for pk, _ in ancestors), *(pk for pk, _ in descendants)}
    rows = {row["id"]: row for row in WorkflowVersion.objects.filter(pk__in=ids, workflow_id=version.workflow_id)
            .values("id", "operation", "parent1_id", "parent2_id", "generation")}
    url = _version_url(request)

    def relatives(found):
        return [{"id": pk, "depth": depth, "operation": rows[pk]["operation"], "generation": rows[pk]["generation"],
                 "url": url(pk)} for pk, depth in found if pk in rows]

    chain, seen, current = [], set(), rows.get(version.pk)
    while current is not None and current["id"] not in seen:
        chain.append(current)
        seen.add(current["id"])
        current = rows.get(current["parent1_id"])
    chain.reverse()
    latest = {run["workflow_version_id"]: run for run in EvalRun.objects.filter(
        workflow_version_id__in=[step["id"] for step in chain], status=EvalRun.Status.COMPLETED)
        .exclude(config__has_key="item_ids")  # a minibatch run is not the version's fitness
        .order_by("workflow_version_id", F("ended_at").desc(nulls_last=True), "-id")
        .distinct("workflow_version_id").values("workflow_version_id", "id", "fitness", "golden_set_id")}
    path, previous = [], None
    for step in chain:
        run = latest.get(step["id"], {})
        fitness = run.get("fitness")
        path.append({"id": step["id"], "operation": step["operation"], "parent1": step["parent1_id"],
                     "parent2": step["parent2_id"], "fitness": fitness,
                     "fitness_change": None if fitness is None or previous is None else fitness - previous,
                     "eval_run": run.get("id"), "golden_set": run.get("golden_set_id"), "url": url(step["id"])})
        previous = fitness
    return {"version": version.pk, "url": url(version.pk), "ancestors": relatives(ancestors),
            "descendants": relatives(descendants), "path": path, "truncated": truncated}


# ------------------------------------------------------------------------------------------------- runs

def run_queryset(*, detail: bool = True):
    queryset = EvolutionRun.objects.select_related("created_by")
    return queryset if detail else queryset.defer("config", "goal_text", "error")


@extend_schema_view(
    list=extend_schema(summary="List evolution runs", description="Newest first, with their counters and what "
                                                                  "they found (the detail adds the config)."),
    retrieve=extend_schema(summary="An evolution run: config, counters, lift, stop reason, base and best versions "
                                   "and its durable run"),
    create=extend_schema(summary="Start an evolution run of a workflow on a golden set (202; it runs in the "
                                 "background)",
                         description=START_DESCRIPTION, request=EvolutionRunStartSerializer,
                         responses={202: EvolutionRunDetailSerializer}),
)
class EvolutionRunViewSet(WorkspaceScopedMixin, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Evolution runs of the caller's workspaces. Each is a durable run (`durable_run`) that breeds versions of
    a workflow and scores each on a golden set; generations/, individuals/ and genealogy/ show what it did."""

    queryset = EvolutionRun.objects.all()
    serializer_class = EvolutionRunSerializer
    filterset_class = EvolutionRunFilter

    def get_queryset(self):
        self.queryset = run_queryset(detail=self.action != "list")
        return super().get_queryset()

    def get_serializer_class(self):
        return {"retrieve": EvolutionRunDetailSerializer, "create": EvolutionRunStartSerializer,
                "cancel": EvolutionRunCancelSerializer, "generations": GenerationSerializer,
                "individuals": IndividualSerializer}.get(self.action, EvolutionRunSerializer)

    def workspace_of(self, obj):
        return obj.workspace_id

    def _detail(self, run: EvolutionRun, code: int = status.HTTP_200_OK) -> Response:
        run = run_queryset().get(pk=run.pk)
        return Response(EvolutionRunDetailSerializer(run, context=self.get_serializer_context()).data, status=code)

    def create(self, request, *args, **kwargs):
        serializer = EvolutionRunStartSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        workflow = data["workflow"]
        self.check_write_role(workflow.workspace_id)
        run = services.evolution_start(workflow=workflow, golden_set=data["golden_set"], mode=data["mode"],
                                       base_version=data.get("base_version"), config=data["config"],
                                       goal=data["goal"], user=request.user)
        return self._detail(run, status.HTTP_202_ACCEPTED)

    # -------------------------------------------------------------------------------------- control

    @extend_schema(summary="Pause the run at its next generation boundary (409 unless it is queued or running)",
                   description="The generation under way finishes first; `paused_at` then names the boundary "
                               "the run waits at.",
                   request=None, responses=EvolutionRunDetailSerializer)
    @action(detail=True, methods=["post"])
    def pause(self, request, pk=None):
        run = self.get_object()  # a write: the object permission checks the caller's role
        try:
            services.evolution_pause(run=run)
        except services.EvolutionError as exc:
            raise Conflict(f"Evolution run {run.pk}: {exc}.") from None
        return self._detail(run)

    @extend_schema(summary="Resume a paused run (409 unless it is paused)", request=None,
                   responses=EvolutionRunDetailSerializer)
    @action(detail=True, methods=["post"])
    def resume(self, request, pk=None):
        run = self.get_object()
        try:
            services.evolution_resume(run=run)
        except services.EvolutionError as exc:
            raise Conflict(f"Evolution run {run.pk}: {exc}.") from None
        return self._detail(run)

    @extend_schema(summary="Cancel a queued, running or paused run and its eval runs (409 once it has ended)",
                   request=EvolutionRunCancelSerializer, responses=EvolutionRunDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = self.get_object()
        serializer = EvolutionRunCancelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if not services.evolution_cancel(run=run, reason=serializer.validated_data["reason"]):
            current = EvolutionRun.objects.filter(pk=run.pk).values_list("status", flat=True).first()
            raise Conflict(f"status: evolution run {run.pk} is {current}; only queued, running or paused runs can "
                           "be cancelled.")
        return self._detail(run)

    @extend_schema(
        summary="Promote the run's best version over the workflow's active version when the evidence supports it",
        description="As workflow-versions/{id}/promote/ on the run's golden set, judged on items the search did not "
                    "select on: the best version must be significantly better than the active version (paired "
                    "Wilcoxon test) with no critical item regressed, on the run's test split when it has a held-out "
                    "claim (each one's latest completed eval run covering those items). A run without one is "
                    "judged on the whole set only once a fresh eval run of the best backs it (started after the "
                    "run ended, reuse off); until then 409 naming `report`. 200 with the promotion; 409 with "
                    "`error.evidence` when the evidence does not support it, and 409 naming the field when the run "
                    "has no best version yet, the best version is already active or has no completed eval run on "
                    "the items.",
        request=None,
        responses={200: PromotionSerializer,
                   409: OpenApiResponse(PromoteBestRefusedBodySerializer,
                                        description="Refused (with the evidence), or not possible now.")})
    @action(detail=True, methods=["post"], url_path="promote-best", url_name="promote-best")
    def promote_best(self, request, pk=None):
        run = self.get_object()
        try:
            promotion = services.evolution_promote_best(run=run, user=request.user)
        except PromotionRefused:
            raise  # the API's exception handler answers it, with its evidence
        except (EvalError, services.EvolutionError) as exc:
            # here every other refusal is the state of the run or of its best version (400 on evals' promote)
            raise Conflict(str(exc)) from None
        promotion = Promotion.objects.select_related("decided_by", "workflow").get(pk=promotion.pk)
        return Response(PromotionSerializer(promotion, context=self.get_serializer_context()).data)

    # ---------------------------------------------------------------------------------------- reads

    @extend_schema(summary="The run's generations in order, each with its fitness statistics (cursor pages)",
                   responses=GenerationSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=NumberCursorPagination, filter_backends=[])
    def generations(self, request, pk=None):
        run = self.get_object()
        page = self.paginate_queryset(Generation.objects.filter(evolution_run=run))
        return self.get_paginated_response(GenerationSerializer(page, many=True,
                                                                context=self.get_serializer_context()).data)

    @extend_schema(summary="The run's individuals: each version scored in a generation, how it was made, its "
                           "fitness and whether it survived (cursor pages, in generation order)",
                   parameters=INDIVIDUAL_PARAMETERS, responses=IndividualSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=IndividualCursorPagination, filter_backends=[])
    def individuals(self, request, pk=None):
        # the run without the list's filters: the query parameters here filter its individuals
        run = self.get_object()
        queryset = Individual.objects.filter(evolution_run=run).annotate(
            generation_number=F("generation__number"), operation=F("workflow_version__operation"),
            parent1=F("workflow_version__parent1_id"), parent2=F("workflow_version__parent2_id"))
        filterset = IndividualFilter(request.query_params, queryset=queryset, request=request)
        if not filterset.is_valid():
            raise translate_validation(filterset.errors)
        page = self.paginate_queryset(filterset.qs)
        return self.get_paginated_response(IndividualSerializer(page, many=True,
                                                                context=self.get_serializer_context()).data)

    @extend_schema(summary="The run's genealogy: the versions that took part and their ancestors, as a graph",
                   description=GENEALOGY_DESCRIPTION, responses=GenealogySerializer)
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def genealogy(self, request, pk=None):
        run = self.get_object()
        return Response(GenealogySerializer(run_genealogy(run, request=request)).data)


# ---------------------------------------------------------------------------------------------- lineage

class VersionLineageViewSet(WorkspaceScopedMixin, viewsets.GenericViewSet):
    """GET /api/workflow-versions/{id}/lineage/ (routed in evolution/api/urls.py: the evolution app owns it)."""

    queryset = WorkflowVersion.objects.only("pk", "workflow_id")
    serializer_class = LineageSerializer
    workspace_field = "workflow__workspace"
    filter_backends = []
    pagination_class = None

    @extend_schema(summary="A version's ancestors and descendants, and its path back to its root with the fitness "
                           "change of each step",
                   description=LINEAGE_DESCRIPTION, responses=LineageSerializer)
    def lineage(self, request, pk=None):
        version = self.get_object()
        return Response(LineageSerializer(version_lineage(version, request=request)).data)
