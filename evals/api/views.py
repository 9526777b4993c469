"""Golden sets and their items, eval runs and their results, comparisons, promotions and rollbacks over HTTP,
scoped to the caller's workspaces: another workspace's rows are not in any queryset, so their ids are 404 like
missing ones, and naming them in a body or a filter is a 400 on that field."""

from __future__ import annotations

from dataclasses import dataclass

from django.db import transaction
from django.db.models import Count, F, ProtectedError, Q
from django_filters.utils import translate_validation
from drf_spectacular.types import OpenApiTypes
from drf_spectacular.utils import OpenApiParameter, OpenApiResponse, extend_schema, extend_schema_view
from rest_framework import exceptions, mixins, parsers, serializers, status, viewsets
from rest_framework.decorators import action
from rest_framework.response import Response

from config.errors import Conflict
from evals import importing, rewriter, services
from evals.api.filters import EvalRunFilter, GoldenItemFilter, GoldenResultFilter, GoldenSetFilter, PromotionFilter
from evals.api.serializers import (
    GRADERS_GUIDE,
    CompareSerializer,
    EvalRunCancelSerializer,
    EvalRunDetailSerializer,
    EvalRunSerializer,
    EvalRunStartSerializer,
    GoldenItemSerializer,
    GoldenResultSerializer,
    GoldenSetSerializer,
    ImportRefusedBodySerializer,
    ImportRequestSerializer,
    ImportResultSerializer,
    ImportUploadSerializer,
    PromoteSerializer,
    PromotionRefusedBodySerializer,
    PromotionSerializer,
    ProposalSerializer,
)
from evals.models import EvalRun, GoldenItem, GoldenResult, GoldenSet, Promotion
from evals.splits import SPLITS
from workflows.models import Workflow, WorkflowVersion
from workspaces.api.base import WorkspaceScopedMixin, WorkspaceScopedReadOnlyViewSet, WorkspaceScopedViewSet
from workspaces.api.pagination import INVALID_CURSOR, IdCursorPagination
from workspaces.api.parsers import FormParser, JSONParser, MultiPartParser

MAX_INT = 2**31 - 1
ERRORS_IN_MESSAGE = 10


class TooLarge(exceptions.APIException):
    status_code = status.HTTP_413_REQUEST_ENTITY_TOO_LARGE
    default_code = "too_large"
    default_detail = "The file is too large."


class PositionCursorPagination(IdCursorPagination):
    """Items (and results) in their set's order: position, then id. A position is a whole number, checked
    before it reaches a query (results order by an annotation the base class cannot check)."""

    ordering = ("position", "id")

    def _check_position(self, position: str) -> None:
        if not (position.isascii() and position.isdigit() and len(position) <= 10 and int(position) <= MAX_INT):
            raise exceptions.ValidationError({"cursor": [INVALID_CURSOR]})


# ----------------------------------------------------------------------------------------- item files

class _RawItemsParser(parsers.BaseParser):
    """A file sent as the whole body; read up to the limit (plus one byte, to tell an oversized one)."""

    kind = ""

    def parse(self, stream, media_type=None, parser_context=None):
        return {"upload": RawUpload(self.kind, stream.read(importing.MAX_BYTES + 1))}


class JsonlParser(_RawItemsParser):
    media_type = "application/jsonl"
    kind = "jsonl"


class NdjsonParser(_RawItemsParser):
    media_type = "application/x-ndjson"
    kind = "jsonl"


class CsvParser(_RawItemsParser):
    media_type = "text/csv"
    kind = "csv"


@dataclass
class RawUpload:
    kind: str  # "jsonl" or "csv"
    content: bytes


# ----------------------------------------------------------------------------------------- golden sets

IMPORT_DESCRIPTION = f"""Add items to the set from a file: JSONL (one JSON object a line) or CSV (a header row).

Send it as a multipart upload (`file`), as the whole body with the content type `application/jsonl`
(or `application/x-ndjson`) or `text/csv`, or as a JSON body `{{"items": [{{...}}, ...]}}`. The text must be
UTF-8 (a byte-order mark is fine).

Keys (JSONL) or columns (CSV): `input` (required), `expected_output`, `scoring_criteria`, `rubric` (JSON: a list
of {{"criterion", "max_points"}}), `tags` (a JSON list, or comma-separated names), `metadata` (a JSON object),
`split` (train, validation or test; left out or empty, the item is dealt one by its first tag: evals/splits.py).
In CSV, `input` is the cell's text, or the object when the cell starts with `{{` (then it must be a valid JSON
object: send text starting with `{{` as JSONL). An unknown key or column is an error; `expected_output` holds at
most {importing.MAX_EXPECTED_OUTPUT:,} characters, `scoring_criteria` {importing.MAX_CRITERIA:,}; JSON nested
deeper than {importing.MAX_JSON_DEPTH} levels, NaN, Infinity and NUL characters are refused (evals/importing.py).

All or nothing by default: any bad line refuses the whole file (400, nothing written) and each one is listed
under `error.errors` as `{{"line": 3, "fields": {{"input": ["is required"]}}}}`. With `?partial=1` the good lines
are written (201) and the bad ones reported in `errors`. Limits: {importing.MAX_BYTES // (1024 * 1024)} MB and
{importing.MAX_ITEMS:,} items a file (413 past them). New items go after the set's last item, in line order."""


@extend_schema_view(
    list=extend_schema(summary="List golden sets", description="Newest first, each with its item count."),
    retrieve=extend_schema(summary="A golden set: its graders, threshold and item count"),
    create=extend_schema(summary="Create a golden set in one of your workspaces",
                         description="Graders (evals/graders/guide.md):\n\n" + GRADERS_GUIDE),
    update=extend_schema(summary="Change a golden set (name, description, workflow, threshold, graders)",
                         description="Graders (evals/graders/guide.md):\n\n" + GRADERS_GUIDE),
    partial_update=extend_schema(summary="Change some fields of a golden set",
                                 description="Graders (evals/graders/guide.md):\n\n" + GRADERS_GUIDE),
    destroy=extend_schema(summary="Delete a golden set, its items, eval runs and results (409 while one runs)"),
)
class GoldenSetViewSet(WorkspaceScopedViewSet):
    """Golden sets of the caller's workspaces: items an agent workflow is scored on, with the graders that
    score them. import/ adds items from a JSONL or CSV file; compare/ compares two versions' latest runs on it."""

    queryset = GoldenSet.objects.select_related("created_by").annotate(
        item_count=Count("items"), **{f"{split}_count": Count("items", filter=Q(items__split=split))
                                      for split in SPLITS})
    serializer_class = GoldenSetSerializer
    filterset_class = GoldenSetFilter

    def get_serializer_class(self):
        return {"import_items": ImportRequestSerializer}.get(self.action, GoldenSetSerializer)

    def perform_create(self, serializer):
        data = serializer.validated_data
        self.check_write_role(data["workspace"])
        golden_set = services.golden_set_create(
            workspace=data["workspace"], name=data["name"], workflow=data.get("workflow"),
            description=data.get("description", ""), graders=data["graders"],
            pass_threshold=data["pass_threshold"], created_by=self.request.user)
        serializer.instance = self.get_queryset().get(pk=golden_set.pk)

    def perform_update(self, serializer):
        serializer.save()
        serializer.instance = self.get_queryset().get(pk=serializer.instance.pk)

    def perform_destroy(self, instance):
        try:
            with transaction.atomic():
                services.golden_set_ensure_idle(golden_set_id=instance.pk)
                instance.delete()
        except ProtectedError as exc:
            kinds = sorted({str(row._meta.verbose_name_plural) for row in exc.protected_objects})
            raise Conflict(f"Golden set {instance.pk} is used by {', '.join(kinds)}; their history keeps it, so it "
                           "cannot be deleted.") from None

    # --------------------------------------------------------------------------------------- import

    @extend_schema(
        summary="Import items from a JSONL or CSV file (all or nothing; ?partial=1 keeps the good lines)",
        description=IMPORT_DESCRIPTION,
        parameters=[OpenApiParameter("partial", OpenApiTypes.BOOL,
                                     description="Write the good lines and report the bad (default: refuse the "
                                                 "whole file when a line is bad).")],
        request={"multipart/form-data": ImportUploadSerializer, "application/json": ImportRequestSerializer,
                 "text/csv": OpenApiTypes.STR, "application/jsonl": OpenApiTypes.STR},
        responses={201: ImportResultSerializer,
                   400: OpenApiResponse(ImportRefusedBodySerializer,
                                        description="Bad lines (listed in `error.errors`; nothing written), an "
                                                    "unreadable file, or bad parameters.")})
    @action(detail=True, methods=["post"], url_path="import", url_name="import", filter_backends=[],
            parser_classes=[JSONParser, MultiPartParser, FormParser, JsonlParser, NdjsonParser, CsvParser])
    def import_items(self, request, pk=None):
        golden_set = self.get_object()  # a write: the object permission checks the caller's role
        partial = _partial(request)
        field, lines = self._import_lines(request)
        created, errors = services.golden_items_import(golden_set=golden_set, items=lines, partial=partial,
                                                       field=field)
        if not created:
            return _import_refused(field, errors)
        body = {"created": len(created), "items": [item.pk for item in created], "errors": errors,
                "items_url": GoldenSetSerializer(golden_set, context=self.get_serializer_context()).get_items_url(
                    golden_set)}
        return Response(ImportResultSerializer(body).data, status=status.HTTP_201_CREATED)

    def _import_lines(self, request) -> tuple[str, list[importing.ImportLine]]:
        """(the field errors are reported on: "file" or "items", the items read by evals.importing); a file
        that cannot be read as a whole is a 400 on that field, or a 413 past a limit."""
        data = request.data
        upload = data.get("upload") if isinstance(data, dict) else None
        field = "file"
        try:
            if isinstance(upload, RawUpload):
                return field, importing.read_file(upload.content, kind=upload.kind)
            if "file" in request.FILES:
                file = request.FILES["file"]
                kind = importing.file_kind(file.name, getattr(file, "content_type", ""))
                return field, importing.read_file(importing.read_upload(file), kind=kind)
            if request.content_type.startswith("application/json"):
                field = "items"
                serializer = ImportRequestSerializer(data=data)
                serializer.is_valid(raise_exception=True)
                return field, importing.read_objects(serializer.validated_data["items"])
        except importing.TooLarge as exc:
            raise TooLarge(str(exc)) from None
        except importing.Unreadable as exc:
            raise exceptions.ValidationError({field: [str(exc)]}) from None
        raise exceptions.ValidationError({"file": ["Send a JSONL or CSV file: a multipart upload named `file`, or the "
                                                   "body with the content type application/jsonl or text/csv."]})

    # -------------------------------------------------------------------------------------- compare

    @extend_schema(
        summary="Compare two versions on the set: their latest completed eval runs, item by item",
        description="A paired test on per-item scores (Wilcoxon signed-rank, two-sided; a paired-bootstrap 95% "
                    "interval of the mean difference b - a) and the critical items b regressed. 400 when a version "
                    "has no completed eval run on the set.",
        parameters=[OpenApiParameter("a", OpenApiTypes.INT, required=True,
                                     description="The baseline version (of the set's workspace)."),
                    OpenApiParameter("b", OpenApiTypes.INT, required=True,
                                     description="The version compared with it.")],
        responses=CompareSerializer)
    @action(detail=True, methods=["get"], filter_backends=[], pagination_class=None)
    def compare(self, request, pk=None):
        golden_set = self.get_object()
        versions = {}
        for name in ("a", "b"):
            raw = request.query_params.get(name, "")
            if not (raw.isascii() and raw.isdigit() and len(raw) <= 10 and int(raw) <= MAX_INT):
                raise exceptions.ValidationError({name: ["A version id is required."]})
            version = WorkflowVersion.objects.filter(pk=int(raw), workflow__workspace_id=golden_set.workspace_id) \
                .only("pk", "workflow_id").first()
            if version is None:
                raise exceptions.ValidationError({name: [f"No version {raw} in this golden set's workspace."]})
            versions[name] = version
        result = services.compare_versions(golden_set=golden_set, version_a=versions["a"],
                                           version_b=versions["b"])
        return Response(CompareSerializer(result).data)


def _partial(request) -> bool:
    raw = request.query_params.get("partial")
    if raw is None or raw == "":
        return False
    field = serializers.BooleanField()
    try:
        return field.to_internal_value(raw)
    except exceptions.ValidationError:
        raise exceptions.ValidationError({"partial": ["Must be true or false (1 or 0)."]}) from None


def _import_refused(field: str, bad: list[dict]) -> Response:
    lines = [importing.line_text(entry) for entry in bad]
    more = f"; and {len(lines) - ERRORS_IN_MESSAGE} more" if len(lines) > ERRORS_IN_MESSAGE else ""
    message = (f"{len(bad)} line{'s' if len(bad) != 1 else ''} with errors, nothing was imported: "
               + "; ".join(lines[:ERRORS_IN_MESSAGE]) + more)
    body = {"status": 400, "code": "invalid", "message": message, "fields": {field: lines[:100]}, "errors": bad}
    return Response({"error": body}, status=status.HTTP_400_BAD_REQUEST)


# ---------------------------------------------------------------------------------------------- items

@extend_schema_view(
    list=extend_schema(summary="List golden items", description="In their set's order (position, then id); "
                                                                "`?golden_set=` for one set, `?split=` for the "
                                                                "items of a split (repeat for several)."),
    retrieve=extend_schema(summary="A golden item"),
    create=extend_schema(summary="Add an item to a golden set (after its last item unless `position` is given)"),
    update=extend_schema(summary="Change an item (409 while an eval run of its set is in progress)"),
    partial_update=extend_schema(summary="Change some fields of an item (409 while an eval run of its set is in "
                                         "progress)"),
    destroy=extend_schema(summary="Delete an item and its results (409 while an eval run of its set is in "
                                  "progress)"),
)
class GoldenItemViewSet(WorkspaceScopedViewSet):
    """Items of the caller's golden sets. A result depends on an item's input, expected output, criteria and
    rubric (its `content_hash`): changing them makes the next eval run grade the item again."""

    queryset = GoldenItem.objects.all()
    serializer_class = GoldenItemSerializer
    filterset_class = GoldenItemFilter
    pagination_class = PositionCursorPagination
    workspace_field = "golden_set__workspace"

    def workspace_of(self, obj):
        return obj.golden_set.workspace_id

    def get_queryset(self):
        return super().get_queryset().select_related("golden_set")

    def perform_create(self, serializer):
        data = serializer.validated_data
        golden_set = data["golden_set"]
        self.check_write_role(golden_set.workspace_id)
        serializer.instance = services.golden_item_add(
            golden_set=golden_set, input=data["input"], expected_output=data.get("expected_output", ""),
            scoring_criteria=data.get("scoring_criteria", ""), rubric=data.get("rubric"), tags=data.get("tags"),
            metadata=data.get("metadata"), position=data.get("position"), split=data.get("split"))

    def perform_update(self, serializer):
        with transaction.atomic():
            services.golden_set_ensure_idle(golden_set_id=serializer.instance.golden_set_id)
            serializer.save()

    def perform_destroy(self, instance):
        with transaction.atomic():
            services.golden_set_ensure_idle(golden_set_id=instance.golden_set_id)
            instance.delete()


# ------------------------------------------------------------------------------------------ eval runs

def eval_run_queryset():
    # the workflow's id through one join, never the version row (its DSL) per run
    return EvalRun.objects.select_related("created_by").annotate(workflow_pk=F("workflow_version__workflow_id"))


@extend_schema_view(
    list=extend_schema(summary="List eval runs", description="Newest first, with progress and aggregates."),
    retrieve=extend_schema(summary="An eval run: config, aggregates, score histogram and its durable run"),
    create=extend_schema(summary="Start an eval run of a version on a golden set (202; it runs in the background)",
                         description="Refused (400, naming the field) when the set has no items, the version is "
                                     "of another workspace than the set, or it cannot run here (missing tools or "
                                     "models, named in `tools` and `models`).",
                         request=EvalRunStartSerializer, responses={202: EvalRunDetailSerializer}),
)
class EvalRunViewSet(WorkspaceScopedMixin, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Eval runs of the caller's workspaces. Each is a durable run (`durable_run`) that invokes the version on
    every item and grades the answers; results/ lists them in item order."""

    queryset = EvalRun.objects.all()
    serializer_class = EvalRunSerializer
    filterset_class = EvalRunFilter

    def get_queryset(self):
        self.queryset = eval_run_queryset()
        return super().get_queryset()

    def get_serializer_class(self):
        return {"retrieve": EvalRunDetailSerializer, "create": EvalRunStartSerializer,
                "cancel": EvalRunCancelSerializer, "results": GoldenResultSerializer,
                "rewrite": ProposalSerializer}.get(self.action, EvalRunSerializer)

    def _detail(self, run: EvalRun, code: int = status.HTTP_200_OK) -> Response:
        run = eval_run_queryset().get(pk=run.pk)
        return Response(EvalRunDetailSerializer(run, context=self.get_serializer_context()).data, status=code)

    def create(self, request, *args, **kwargs):
        serializer = EvalRunStartSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        golden_set = data["golden_set"]
        self.check_write_role(golden_set.workspace_id)
        run = services.eval_run_start(golden_set=golden_set, version=data["workflow_version"], user=request.user,
                                      reuse=data["reuse"], concurrency=data.get("concurrency"),
                                      node_budget=data.get("node_budget"), usd_budget=data.get("usd_budget"))
        return self._detail(run, status.HTTP_202_ACCEPTED)

    @extend_schema(summary="Cancel a queued or running eval run (409 once it has ended)",
                   request=EvalRunCancelSerializer, responses=EvalRunDetailSerializer)
    @action(detail=True, methods=["post"])
    def cancel(self, request, pk=None):
        run = self.get_object()
        serializer = EvalRunCancelSerializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        if not services.eval_run_cancel(eval_run=run, reason=serializer.validated_data["reason"]):
            current = EvalRun.objects.filter(pk=run.pk).values_list("status", flat=True).first()
            raise Conflict(f"Eval run {run.pk} is {current}; only queued or running eval runs can be cancelled.")
        return self._detail(run)

    @extend_schema(summary="The run's per-item results in item order (cursor pages)",
                   parameters=[OpenApiParameter("passed", OpenApiTypes.BOOL, description="Passed (true) or not."),
                               OpenApiParameter("grading_error", OpenApiTypes.BOOL,
                                                description="Results whose grading failed (their score is empty).")],
                   responses=GoldenResultSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=PositionCursorPagination, filter_backends=[])
    def results(self, request, pk=None):
        # the run without the list's filters: the query parameters here filter its results
        run = self.get_object()
        queryset = GoldenResult.objects.filter(eval_run=run).annotate(position=F("golden_item__position"))
        filterset = GoldenResultFilter(request.query_params, queryset=queryset, request=request)
        if not filterset.is_valid():
            raise translate_validation(filterset.errors)
        page = self.paginate_queryset(filterset.qs)
        return self.get_paginated_response(GoldenResultSerializer(page, many=True,
                                                                  context=self.get_serializer_context()).data)

    @extend_schema(
        summary="Propose a rewrite of the version from the run's worst failures (201 with the new candidate)",
        description=(rewriter.__doc__ or "").strip() + "\n\n201 when a candidate version was created; 200 with "
                    "`skipped` saying why when none was (or with the existing version when the rewrite was already "
                    "one). 409 unless the run has completed.",
        request=None, responses={201: ProposalSerializer, 200: ProposalSerializer})
    @action(detail=True, methods=["post"])
    def rewrite(self, request, pk=None):
        run = self.get_object()
        if run.status != EvalRun.Status.COMPLETED:
            raise Conflict(f"Eval run {run.pk} is {run.status}; a rewrite learns from a completed run.")
        run = EvalRun.objects.select_related("workflow_version__workflow").get(pk=run.pk)
        proposal = rewriter.propose(eval_run=run, user=request.user)
        body = ProposalSerializer(proposal.as_dict(), context=self.get_serializer_context()).data
        return Response(body, status=status.HTTP_201_CREATED if proposal.created else status.HTTP_200_OK)


# ------------------------------------------------------------------------------------------ lifecycle

class PromotionViewSet(WorkspaceScopedReadOnlyViewSet):
    """Activations of the caller's workflow versions decided here: promotions (with the comparison they were
    decided on) and rollbacks, newest first."""

    queryset = Promotion.objects.select_related("decided_by", "workflow")
    serializer_class = PromotionSerializer
    filterset_class = PromotionFilter
    workspace_field = "workflow__workspace"


class VersionPromoteViewSet(WorkspaceScopedMixin, viewsets.GenericViewSet):
    """POST /api/workflow-versions/{id}/promote/ (routed in evals/api/urls.py: the evals app owns it)."""

    queryset = WorkflowVersion.objects.select_related("workflow").defer("dsl", "input_schema", "output_schema")
    serializer_class = PromoteSerializer
    workspace_field = "workflow__workspace"
    filter_backends = []
    pagination_class = None

    def workspace_of(self, obj):
        return obj.workflow.workspace_id

    @extend_schema(
        summary="Promote a candidate over the workflow's active version when a golden set shows it is better",
        description="Compares the candidate with the active version on the golden set (each one's latest completed "
                    "eval run): significantly better (paired Wilcoxon test, p < EVAL_ALPHA) and no critical item "
                    "regressed beyond the tolerance activates it and records the evidence (200). Otherwise 409 "
                    "with `error.evidence`. A workflow with no active version takes the candidate on its own "
                    "completed run. 400 (naming the field) when a run is missing or the set is of another "
                    "workspace.",
        request=PromoteSerializer,
        responses={200: PromotionSerializer,
                   409: OpenApiResponse(PromotionRefusedBodySerializer,
                                        description="Refused: the evidence does not support it.")})
    def promote(self, request, pk=None):
        version = self.get_object()
        serializer = PromoteSerializer(data=request.data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        golden_set = serializer.validated_data["golden_set"]
        if golden_set.workspace_id != version.workflow.workspace_id:
            raise exceptions.ValidationError({"golden_set": ["Belongs to another workspace than the version."]})
        promotion = services.version_promote(candidate=version, golden_set=golden_set, user=request.user)
        promotion = Promotion.objects.select_related("decided_by", "workflow").get(pk=promotion.pk)
        return Response(PromotionSerializer(promotion, context=self.get_serializer_context()).data)


class WorkflowRollbackViewSet(WorkspaceScopedMixin, viewsets.GenericViewSet):
    """POST /api/workflows/{id}/rollback/ (routed in evals/api/urls.py: the evals app owns it)."""

    queryset = Workflow.objects.all()
    serializer_class = PromotionSerializer
    filter_backends = []
    pagination_class = None

    @extend_schema(summary="Re-activate the version active before the current one, by the workflow's activation "
                           "history (409 when there is none)",
                   request=None, responses={200: PromotionSerializer})
    def rollback(self, request, pk=None):
        workflow = self.get_object()
        try:
            promotion = services.version_rollback(workflow=workflow, user=request.user)
        except services.EvalError as exc:
            raise Conflict(f"Workflow {workflow.pk} has no earlier active version to roll back to.") from exc
        promotion = Promotion.objects.select_related("decided_by", "workflow").get(pk=promotion.pk)
        return Response(PromotionSerializer(promotion, context=self.get_serializer_context()).data)
