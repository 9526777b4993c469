"""Knowledge sources, their embedded chunks, and versioned skills.

A source is what a user gave (a text, a file, a URL); ingestion (a durable workflow, see
``knowledge/durable_workflows.py``) turns it into chunks, each with an embedding for vector
search and a generated ``tsvector`` for full-text search. Chunks are written to a staging
table first and swapped in one transaction, so a search never sees half a source.
"""

from __future__ import annotations

from django.conf import settings
from django.contrib.postgres.fields import ArrayField
from django.contrib.postgres.indexes import GinIndex
from django.contrib.postgres.search import SearchVector, SearchVectorField
from django.core.exceptions import ValidationError
from django.db import models
from django.db.models import Q
from pgvector.django import HnswIndex, VectorField

SEARCH_CONFIG = "english"  # the text search configuration of the generated column and of every query


class KnowledgeSourceQuerySet(models.QuerySet):
    def for_workspace(self, workspace) -> KnowledgeSourceQuerySet:
        return self.filter(workspace=workspace)

    def stale(self, model: str | None = None) -> KnowledgeSourceQuerySet:
        """Indexed sources embedded with another model than the configured one (re-embed candidates)."""
        return self.filter(ingest_status=KnowledgeSource.Status.INDEXED).exclude(
            embedding_model=model or settings.EMBEDDING_MODEL
        )


class KnowledgeSource(models.Model):
    class Kind(models.TextChoices):
        TEXT = "text", "Text"
        FILE = "file", "File"
        URL = "url", "URL"

    class Status(models.TextChoices):
        PROCESSING = "processing", "Processing"
        INDEXED = "indexed", "Indexed"
        FAILED = "failed", "Failed"

    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="knowledge_sources")
    title = models.CharField(max_length=300)
    kind = models.CharField(max_length=10, choices=Kind.choices)
    # the URL of a url source, the original file name of a file source
    uri = models.CharField(max_length=2000, blank=True, default="")
    text = models.TextField(blank=True, default="", help_text="The content of a text source.")
    file = models.FileField(upload_to="knowledge/%Y/%m/", blank=True, max_length=500)
    content_type = models.CharField(max_length=100, blank=True, default="",
                                    help_text="The detected format: text/plain, text/markdown, text/html, "
                                              "text/csv, application/pdf or the docx type.")
    content_hash = models.CharField(max_length=64, blank=True, default="",
                                    help_text="SHA-256 of the content last indexed; the same content is not "
                                              "ingested twice.")
    byte_size = models.BigIntegerField(default=0)
    chunk_size = models.PositiveIntegerField(null=True, blank=True,
                                             help_text="Characters per chunk; empty: KNOWLEDGE_CHUNK_SIZE.")
    chunk_overlap = models.PositiveIntegerField(null=True, blank=True,
                                                help_text="Characters of overlap; empty: KNOWLEDGE_CHUNK_OVERLAP.")
    ingest_status = models.CharField(max_length=12, choices=Status.choices, default=Status.PROCESSING)
    ingest_error = models.TextField(blank=True, default="")
    ingest_run = models.ForeignKey("durable.DurableRun", null=True, blank=True, on_delete=models.SET_NULL,
                                   db_constraint=False, related_name="+")
    embedding_model = models.CharField(max_length=200, blank=True, default="")
    chunk_count = models.PositiveIntegerField(default=0)
    token_count = models.PositiveIntegerField(default=0, help_text="Estimated tokens over all chunks.")
    embedding_tokens = models.BigIntegerField(default=0, help_text="Tokens billed for embeddings, all ingests.")
    usd_cost = models.DecimalField(max_digits=12, decimal_places=8, default=0,
                                   help_text="Embedding cost in USD, all ingests.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)
    updated_at = models.DateTimeField(auto_now=True)
    indexed_at = models.DateTimeField(null=True, blank=True)

    objects = KnowledgeSourceQuerySet.as_manager()

    class Meta:
        indexes = [
            # the API list (newest first within the caller's workspaces) and the status filter / facets
            models.Index(fields=["workspace", "ingest_status"], name="knowledge_source_ws_status_idx"),
            # duplicate detection on create: same content in the same workspace
            models.Index(fields=["workspace", "content_hash"], name="knowledge_source_ws_hash_idx"),
        ]

    def __str__(self) -> str:
        return self.title

    @property
    def needs_reembed(self) -> bool:
        return self.ingest_status == self.Status.INDEXED and self.embedding_model != settings.EMBEDDING_MODEL


KnowledgeSource.Status.TERMINAL = frozenset({KnowledgeSource.Status.INDEXED, KnowledgeSource.Status.FAILED})


class KnowledgeChunk(models.Model):
    """A piece of a source, embedded and full-text indexed. Written only by ingestion."""

    source = models.ForeignKey(KnowledgeSource, on_delete=models.CASCADE, related_name="chunks", db_index=False)
    # denormalised from the source: every search filters on it first
    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="+",
                                  db_index=False)
    ordinal = models.PositiveIntegerField()
    content = models.TextField()
    token_count = models.PositiveIntegerField(default=0)
    embedding = VectorField(dimensions=settings.EMBEDDING_DIMENSIONS)
    search_vector = models.GeneratedField(
        expression=SearchVector("content", config=SEARCH_CONFIG),
        output_field=SearchVectorField(),
        db_persist=True,
    )

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["source", "ordinal"], name="%(app_label)s_%(class)s_one_per_ordinal",
                violation_error_message="A source has one chunk per ordinal.",
            ),
        ]
        indexes = [
            # exact vector scans and full-text searches of one workspace, the planner's row estimates
            models.Index(fields=["workspace"], name="knowledge_chunk_ws_idx"),
            # approximate nearest neighbours by cosine distance (large workspaces also get a partial
            # index of their own, see knowledge/search.py)
            HnswIndex(name="knowledge_chunk_embedding_hnsw", fields=["embedding"], m=16, ef_construction=64,
                      opclasses=["vector_cosine_ops"]),
            # full-text search
            GinIndex(fields=["search_vector"], name="knowledge_chunk_search_gin"),
        ]

    def __str__(self) -> str:
        return f"{self.source_id}#{self.ordinal}"


class KnowledgeChunkStage(models.Model):
    """Chunks of an ingest in progress, keyed by its run: the final step moves them into
    KnowledgeChunk and replaces the source's old chunks in one transaction. No vector or text
    index here, so embedding steps write cheaply and idempotently."""

    run_key = models.CharField(max_length=255)
    source = models.ForeignKey(KnowledgeSource, on_delete=models.CASCADE, related_name="+", db_index=False)
    ordinal = models.PositiveIntegerField()
    content = models.TextField()
    token_count = models.PositiveIntegerField(default=0)
    embedding = VectorField(dimensions=settings.EMBEDDING_DIMENSIONS, null=True)

    class Meta:
        constraints = [
            models.UniqueConstraint(fields=["run_key", "ordinal"], name="%(app_label)s_%(class)s_one_per_ordinal"),
        ]
        indexes = [
            # clean-up of a source's abandoned stages
            models.Index(fields=["source"], name="knowledge_stage_source_idx"),
        ]

    def __str__(self) -> str:
        return f"{self.run_key}#{self.ordinal}"


class SkillQuerySet(models.QuerySet):
    def for_workspace(self, workspace) -> SkillQuerySet:
        return self.filter(workspace=workspace)

    def active(self) -> SkillQuerySet:
        return self.filter(active=True)


class Skill(models.Model):
    """One version of an Anthropic-style skill (SKILL.md: YAML front matter and a markdown body).

    Versions of a (workspace, name) are numbered 1, 2, ... and immutable; at most one is active.
    """

    class Origin(models.TextChoices):
        SEED = "seed", "Seeded from a skill pack"
        API = "api", "Created through the API"
        ADMIN = "admin", "Created in the admin"

    workspace = models.ForeignKey("workspaces.Workspace", on_delete=models.CASCADE, related_name="skills")
    name = models.CharField(max_length=64)
    version = models.PositiveIntegerField()
    version_label = models.CharField(max_length=50, blank=True, default="",
                                     help_text="The front matter's `version`, as the author wrote it.")
    description = models.TextField()
    content_md = models.TextField(help_text="The markdown body, after the front matter.")
    frontmatter = models.JSONField(default=dict, blank=True)
    triggers = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    allowed_tools = ArrayField(models.CharField(max_length=200), default=list, blank=True)
    agent = models.CharField(max_length=100, blank=True, default="",
                             help_text="The agent the skill is written for (metadata.agent), if any.")
    active = models.BooleanField(default=False)
    content_hash = models.CharField(max_length=64, help_text="SHA-256 of the whole SKILL.md as parsed.")
    origin = models.CharField(max_length=10, choices=Origin.choices, default=Origin.API)
    source_path = models.CharField(max_length=500, blank=True, default="",
                                   help_text="The SKILL.md it was seeded from, relative to its pack.")
    created_by = models.ForeignKey(settings.AUTH_USER_MODEL, null=True, blank=True, on_delete=models.SET_NULL,
                                   related_name="+")
    created_at = models.DateTimeField(auto_now_add=True)

    objects = SkillQuerySet.as_manager()

    IMMUTABLE_FIELDS = ("workspace_id", "name", "version", "version_label", "description", "content_md",
                        "frontmatter", "triggers", "allowed_tools", "agent", "content_hash")

    class Meta:
        constraints = [
            models.UniqueConstraint(
                fields=["workspace", "name", "version"], name="%(app_label)s_%(class)s_unique_version",
                violation_error_message="This skill version already exists.",
            ),
            models.UniqueConstraint(
                fields=["workspace", "name"], condition=Q(active=True),
                name="%(app_label)s_%(class)s_one_active_version",
                violation_error_message="Another version of this skill is already active.",
            ),
        ]
        indexes = [
            # skill matching and the API list: active skills of a workspace, optionally one agent's
            models.Index(fields=["workspace", "agent"], name="knowledge_skill_active_idx", condition=Q(active=True)),
        ]

    def __str__(self) -> str:
        return f"{self.name} v{self.version}"

    def save(self, *args, **kwargs):
        # versions are immutable: once written only `active` may change
        if self.pk is not None and not self._state.adding:
            update_fields = kwargs.get("update_fields")
            if update_fields is None or set(update_fields) - {"active"}:
                stored = Skill.objects.filter(pk=self.pk).values(*self.IMMUTABLE_FIELDS).first()
                if stored and any(stored[f] != getattr(self, f) for f in self.IMMUTABLE_FIELDS):
                    raise ValidationError("A skill version is immutable: save a new version instead.")
        super().save(*args, **kwargs)
