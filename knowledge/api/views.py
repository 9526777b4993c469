from django.db import transaction
from drf_spectacular.utils import OpenApiParameter, extend_schema
from rest_framework import mixins, status, viewsets
from rest_framework.decorators import action
from rest_framework.exceptions import ValidationError
from rest_framework.response import Response

from knowledge import selectors, services
from knowledge.api.filters import KnowledgeSourceFilter, SkillFilter
from knowledge.api.serializers import (
    KnowledgeChunkSerializer,
    KnowledgeReingestSerializer,
    KnowledgeSearchSerializer,
    KnowledgeSourceCreateSerializer,
    KnowledgeSourceDetailSerializer,
    KnowledgeSourceSerializer,
    SearchResultSerializer,
    SkillCreateSerializer,
    SkillDetailSerializer,
    SkillMatchQuerySerializer,
    SkillMatchSerializer,
    SkillSerializer,
    WorkspaceReembedSerializer,
)
from knowledge.models import KnowledgeChunk, KnowledgeSource, Skill
from knowledge.search import SearchError
from workspaces.api.base import WorkspaceScopedMixin
from workspaces.api.pagination import IdCursorPagination
from workspaces.api.parsers import FormParser, JSONParser, MultiPartParser


class OrdinalCursorPagination(IdCursorPagination):
    ordering = "ordinal"


class KnowledgeSourceViewSet(WorkspaceScopedMixin, mixins.CreateModelMixin, mixins.DestroyModelMixin,
                             viewsets.ReadOnlyModelViewSet):
    """Knowledge sources of the caller's workspaces. Create one from text, a file upload
    (multipart) or a URL; it is ingested in the background (ingest_status processing, then indexed
    or failed with ingest_error). The same content (or URL) twice returns the existing source with
    200 instead of 201."""

    queryset = KnowledgeSource.objects.select_related("ingest_run", "created_by")
    serializer_class = KnowledgeSourceSerializer
    filterset_class = KnowledgeSourceFilter
    parser_classes = [JSONParser, MultiPartParser, FormParser]

    def get_serializer_class(self):
        return {
            "retrieve": KnowledgeSourceDetailSerializer,
            "create": KnowledgeSourceCreateSerializer,
            "reingest": KnowledgeReingestSerializer,
            "reembed_workspace": WorkspaceReembedSerializer,
            "chunks": KnowledgeChunkSerializer,
        }.get(self.action, KnowledgeSourceSerializer)

    @extend_schema(request=KnowledgeSourceCreateSerializer, responses={201: KnowledgeSourceSerializer,
                                                                       200: KnowledgeSourceSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        workspace = data["workspace"]
        self.check_write_role(workspace)
        source, created = services.source_create(
            workspace=workspace, text=data.get("text") or "", url=data.get("url") or "", upload=data.get("file"),
            title=data.get("title", ""), created_by=request.user, chunk_size=data.get("chunk_size"),
            chunk_overlap=data.get("chunk_overlap"))
        source = self.get_queryset().get(pk=source.pk)
        body = {**KnowledgeSourceSerializer(source, context=self.get_serializer_context()).data, "created": created}
        return Response(body, status=status.HTTP_201_CREATED if created else status.HTTP_200_OK)

    def perform_destroy(self, instance):
        services.source_delete(source=instance)

    @extend_schema(request=KnowledgeReingestSerializer, responses={202: KnowledgeSourceSerializer})
    @action(detail=True, methods=["post"])
    def reingest(self, request, pk=None):
        """Ingest the source again (a URL is fetched anew). Unchanged content is a no-op unless
        `force` is set. 409 while an ingest of it is running."""
        source = self.get_object()
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        return self._start(source, force=serializer.validated_data["force"])

    @extend_schema(request=None, responses={202: KnowledgeSourceSerializer})
    @action(detail=True, methods=["post"])
    def reembed(self, request, pk=None):
        """Re-embed the source's chunks with the configured embedding model (after changing it)."""
        return self._start(self.get_object(), mode="reembed")

    def _start(self, source, **kwargs):
        self.check_object_permissions(self.request, source)
        services.source_ingest(source=source, **kwargs)
        source = self.get_queryset().get(pk=source.pk)
        return Response(KnowledgeSourceSerializer(source, context=self.get_serializer_context()).data,
                        status=status.HTTP_202_ACCEPTED)

    @extend_schema(request=WorkspaceReembedSerializer, responses={202: None},
                   operation_id="knowledge_workspace_reembed")
    @action(detail=False, methods=["post"], url_path="reembed")
    def reembed_workspace(self, request):
        """Re-embed a workspace's sources indexed with another model than EMBEDDING_MODEL
        (`all`: every indexed source)."""
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        workspace = serializer.validated_data["workspace"]
        self.check_write_role(workspace)
        with transaction.atomic():
            runs = services.workspace_reembed(workspace=workspace, stale_only=not serializer.validated_data["all"])
        return Response({"started": len(runs), "runs": [run.pk for run in runs]}, status=status.HTTP_202_ACCEPTED)

    @extend_schema(responses=KnowledgeChunkSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=OrdinalCursorPagination)
    def chunks(self, request, pk=None):
        """The source's chunks in order (cursor pages)."""
        source = self.get_object()
        page = self.paginate_queryset(selectors.source_chunks(source=source))
        return self.get_paginated_response(KnowledgeChunkSerializer(page, many=True).data)


class KnowledgeSearchViewSet(WorkspaceScopedMixin, viewsets.GenericViewSet):
    """Search a workspace's knowledge: hybrid (reciprocal-rank fusion of vector and full-text
    ranks), vector or full-text; optionally only some sources. GET with query parameters or POST
    with a JSON body."""

    queryset = KnowledgeChunk.objects.all()
    serializer_class = KnowledgeSearchSerializer
    pagination_class = None
    filter_backends = []

    def _search(self, data):
        serializer = KnowledgeSearchSerializer(data=data, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        params = serializer.validated_data
        try:
            result = selectors.knowledge_search(workspace=params["workspace"], query=params["query"],
                                                mode=params["mode"], k=params["k"], source_ids=params.get("sources"))
        except SearchError as exc:
            raise ValidationError({"query": [str(exc)]}) from None
        return Response(SearchResultSerializer(result).data)

    @extend_schema(parameters=[KnowledgeSearchSerializer], responses=SearchResultSerializer)
    def list(self, request):
        data = request.query_params.copy()
        if "sources" in data:
            raw = ",".join(data.getlist("sources"))
            try:
                data.setlist("sources", [int(s) for s in raw.split(",") if s.strip()])
            except ValueError:
                raise ValidationError({"sources": ["A comma-separated list of source ids."]}) from None
        return self._search(data)

    @extend_schema(request=KnowledgeSearchSerializer, responses=SearchResultSerializer)
    def create(self, request):
        return self._search(request.data)


class SkillViewSet(WorkspaceScopedMixin, mixins.CreateModelMixin, viewsets.ReadOnlyModelViewSet):
    """Skill versions of the caller's workspaces (`?active=true` for the library as it is used).
    POST a SKILL.md to add a skill or a new version of one: unchanged content returns the latest
    version with 200."""

    queryset = Skill.objects.select_related("created_by")
    serializer_class = SkillSerializer
    filterset_class = SkillFilter

    def get_serializer_class(self):
        return {"retrieve": SkillDetailSerializer, "create": SkillCreateSerializer,
                "match": SkillMatchQuerySerializer}.get(self.action, SkillSerializer)

    @extend_schema(request=SkillCreateSerializer, responses={201: SkillDetailSerializer, 200: SkillDetailSerializer})
    def create(self, request, *args, **kwargs):
        serializer = self.get_serializer(data=request.data)
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        self.check_write_role(data["workspace"])
        skill, outcome = services.skill_create_from_text(workspace=data["workspace"], content=data["content"],
                                                         created_by=request.user, activate=data["activate"])
        body = {**SkillDetailSerializer(skill, context=self.get_serializer_context()).data, "outcome": outcome}
        return Response(body, status=status.HTTP_200_OK if outcome == "skipped" else status.HTTP_201_CREATED)

    @extend_schema(responses=SkillSerializer(many=True))
    @action(detail=True, methods=["get"], pagination_class=None, filter_backends=[])
    def versions(self, request, pk=None):
        """Every version of this skill, newest first."""
        skill = self.get_object()
        return Response(SkillSerializer(selectors.skill_versions(skill=skill), many=True).data)

    @extend_schema(request=None, responses=SkillSerializer)
    @action(detail=True, methods=["post"])
    def activate(self, request, pk=None):
        """Make this version the active one (the one active before is deactivated)."""
        skill = self.get_object()
        self.check_object_permissions(request, skill)
        services.skill_activate(skill=skill)
        return Response(SkillSerializer(skill, context=self.get_serializer_context()).data)

    @extend_schema(parameters=[SkillMatchQuerySerializer, OpenApiParameter("q", str, required=True)],
                   responses=SkillMatchSerializer(many=True))
    @action(detail=False, methods=["get"], pagination_class=None, filter_backends=[])
    def match(self, request):
        """Active skills that apply to a query: a trigger, the name or a leading description word."""
        serializer = SkillMatchQuerySerializer(data=request.query_params, context=self.get_serializer_context())
        serializer.is_valid(raise_exception=True)
        data = serializer.validated_data
        matches = selectors.skill_match(workspace=data["workspace"], query=data["q"], agent=data.get("agent"))
        rows = []
        for match in matches:
            match.skill.reason = match.reason
            rows.append(match.skill)
        return Response(SkillMatchSerializer(rows, many=True).data)
