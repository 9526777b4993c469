from django.conf import settings
from drf_spectacular.utils import extend_schema_field
from rest_framework import serializers

from knowledge.models import KnowledgeChunk, KnowledgeSource, Skill
from knowledge.search import MAX_K, MODES
from knowledge.skills import render_skill
from workspaces.api.base import WorkspaceField

DETAIL_CHUNKS = 100


class KnowledgeSourceSerializer(serializers.ModelSerializer):
    ingest_run_status = serializers.CharField(source="ingest_run.status", read_only=True, default=None, allow_null=True,
                                              help_text="Status of the durable run of the last ingest.")
    needs_reembed = serializers.BooleanField(read_only=True,
                                             help_text="Indexed with another model than EMBEDDING_MODEL.")
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = KnowledgeSource
        fields = ["id", "workspace", "title", "kind", "uri", "content_type", "content_hash", "byte_size",
                  "chunk_size", "chunk_overlap", "ingest_status", "ingest_error", "ingest_run", "ingest_run_status",
                  "embedding_model", "needs_reembed", "chunk_count", "token_count", "embedding_tokens", "usd_cost",
                  "created_by", "created_at", "updated_at", "indexed_at"]
        read_only_fields = fields


class KnowledgeChunkSerializer(serializers.ModelSerializer):
    class Meta:
        model = KnowledgeChunk
        fields = ["id", "ordinal", "content", "token_count"]
        read_only_fields = fields


class KnowledgeSourceDetailSerializer(KnowledgeSourceSerializer):
    chunks = serializers.SerializerMethodField(
        help_text=f"The first {DETAIL_CHUNKS} chunks in order; all of them at chunks/ (paginated).")

    class Meta(KnowledgeSourceSerializer.Meta):
        fields = [*KnowledgeSourceSerializer.Meta.fields, "chunks"]
        read_only_fields = fields

    @extend_schema_field(KnowledgeChunkSerializer(many=True))
    def get_chunks(self, obj):
        chunks = KnowledgeChunk.objects.filter(source=obj).order_by("ordinal").only(
            "id", "ordinal", "content", "token_count")[:DETAIL_CHUNKS]
        return KnowledgeChunkSerializer(chunks, many=True).data


class KnowledgeSourceCreateSerializer(serializers.Serializer):
    """Give exactly one of `text`, `url` or `file` (a multipart upload)."""

    workspace = WorkspaceField()
    title = serializers.CharField(max_length=300, required=False, allow_blank=True, default="")
    text = serializers.CharField(required=False, trim_whitespace=False, help_text="The content of a text source.")
    url = serializers.CharField(max_length=2000, required=False, help_text="One public web page (http or https).")
    file = serializers.FileField(required=False, help_text="A .txt .md .html .csv .pdf or .docx file.")
    chunk_size = serializers.IntegerField(required=False, min_value=200, max_value=20_000, allow_null=True)
    chunk_overlap = serializers.IntegerField(required=False, min_value=0, max_value=10_000, allow_null=True)

    def validate(self, attrs):
        given = [name for name in ("text", "url", "file") if attrs.get(name) not in (None, "")]
        if not given:
            raise serializers.ValidationError({"text": ["Give one of text, url or file."]})
        if len(given) > 1:
            raise serializers.ValidationError({given[1]: [f"Give only one of text, url or file, not {given[0]} "
                                                          f"and {given[1]}."]})
        upload = attrs.get("file")
        limit = settings.KNOWLEDGE_UPLOAD_MAX_BYTES
        if upload is not None and upload.size > limit:
            raise serializers.ValidationError({"file": [f"The file is {upload.size:,} bytes, over the "
                                                        f"{limit:,}-byte limit."]})
        return attrs


class KnowledgeReingestSerializer(serializers.Serializer):
    force = serializers.BooleanField(default=False, help_text="Ingest again even if the content is unchanged.")


class WorkspaceReembedSerializer(serializers.Serializer):
    workspace = WorkspaceField()
    all = serializers.BooleanField(default=False, help_text="Re-embed every indexed source, not only stale ones.")


class KnowledgeSearchSerializer(serializers.Serializer):
    workspace = WorkspaceField()
    query = serializers.CharField(max_length=2000, trim_whitespace=True)
    mode = serializers.ChoiceField(choices=MODES, default="hybrid")
    k = serializers.IntegerField(min_value=1, max_value=MAX_K, default=8)
    sources = serializers.ListField(child=serializers.IntegerField(min_value=1), required=False, max_length=500,
                                    help_text="Only these sources of the workspace.")

    def validate(self, attrs):
        sources = attrs.get("sources")
        if sources:
            known = set(KnowledgeSource.objects.filter(workspace=attrs["workspace"], pk__in=sources)
                        .values_list("pk", flat=True))
            unknown = sorted(set(sources) - known)
            if unknown:
                raise serializers.ValidationError(
                    {"sources": [f"Not sources of this workspace: {', '.join(map(str, unknown[:20]))}."]})
        return attrs


class SearchHitSerializer(serializers.Serializer):
    chunk_id = serializers.IntegerField()
    source_id = serializers.IntegerField()
    source_title = serializers.CharField()
    ordinal = serializers.IntegerField()
    content = serializers.CharField()
    score = serializers.FloatField()
    distance = serializers.FloatField(allow_null=True)
    vector_rank = serializers.IntegerField(allow_null=True)
    text_rank = serializers.IntegerField(allow_null=True)


class SearchResultSerializer(serializers.Serializer):
    query = serializers.CharField()
    mode = serializers.CharField()
    plan = serializers.CharField(help_text="The vector plan: exact, partial or iterative (empty for full text).")
    candidates = serializers.IntegerField(help_text="Chunks the workspace / source filter selects.")
    notes = serializers.ListField(child=serializers.CharField())
    hits = SearchHitSerializer(many=True)


class SkillSerializer(serializers.ModelSerializer):
    created_by = serializers.SlugRelatedField(slug_field="username", read_only=True)

    class Meta:
        model = Skill
        fields = ["id", "workspace", "name", "version", "version_label", "description", "agent", "triggers",
                  "allowed_tools", "active", "origin", "source_path", "content_hash", "created_by", "created_at"]
        read_only_fields = fields


class SkillDetailSerializer(SkillSerializer):
    skill_md = serializers.SerializerMethodField(help_text="The version as a SKILL.md file.")

    class Meta(SkillSerializer.Meta):
        fields = [*SkillSerializer.Meta.fields, "frontmatter", "content_md", "skill_md"]
        read_only_fields = fields

    def get_skill_md(self, obj) -> str:
        return render_skill(name=obj.name, description=obj.description, body=obj.content_md,
                            frontmatter=obj.frontmatter)


class SkillCreateSerializer(serializers.Serializer):
    workspace = WorkspaceField()
    content = serializers.CharField(max_length=250_000, trim_whitespace=False,
                                    help_text="A whole SKILL.md: YAML front matter, then the markdown body.")
    activate = serializers.BooleanField(default=True, help_text="Make the new version the active one.")


class SkillMatchQuerySerializer(serializers.Serializer):
    workspace = WorkspaceField()
    q = serializers.CharField(max_length=2000)
    agent = serializers.CharField(max_length=100, required=False)


class SkillMatchSerializer(SkillSerializer):
    reason = serializers.CharField(read_only=True, help_text="Why it matched: a trigger, the name, or a "
                                                               "description word.")

    class Meta(SkillSerializer.Meta):
        fields = [*SkillSerializer.Meta.fields, "reason"]
        read_only_fields = fields
