import difflib

from django import forms
from django.contrib import admin, messages
from django.contrib.postgres.search import SearchQuery
from django.db import transaction
from django.urls import reverse
from django.utils.html import format_html, format_html_join

from config.admin import EstimatedCountPaginator, ReadOnlyAdmin
from knowledge import services
from knowledge.models import SEARCH_CONFIG, KnowledgeChunk, KnowledgeSource, Skill
from knowledge.skills import render_skill
from workspaces.admin_scope import WorkspaceScopedAdmin

# -------------------------------------------------------------------------------------------- sources


class KnowledgeSourceAddForm(forms.ModelForm):
    text = forms.CharField(widget=forms.Textarea(attrs={"rows": 12}), required=False,
                           help_text="Paste text (markdown welcome)…")
    url = forms.URLField(required=False, assume_scheme="https", help_text="…or one public web page…")
    upload = forms.FileField(required=False, label="File", help_text="…or a .txt .md .html .csv .pdf .docx file.")

    class Meta:
        model = KnowledgeSource
        fields = ["workspace", "title", "chunk_size", "chunk_overlap"]

    def clean(self):
        data = super().clean()
        given = [name for name in ("text", "url", "upload") if data.get(name)]
        if len(given) != 1:
            raise forms.ValidationError("Give exactly one of text, URL or file.")
        return data


@admin.register(KnowledgeSource)
class KnowledgeSourceAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    list_display = ["title", "workspace", "kind", "ingest_status", "chunk_count", "embedding_model", "indexed_at",
                    "created_at"]
    list_filter = ["ingest_status", "kind", "embedding_model", ("workspace", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["workspace"]
    search_fields = ["title", "uri", "content_hash"]
    search_help_text = "Title, URL or file name, content hash, or words of the content (full-text search)."
    raw_id_fields = ["workspace", "created_by"]
    date_hierarchy = "created_at"
    actions = ["reingest", "reingest_force", "reembed"]
    readonly_fields = ["kind", "uri", "content_type", "content_hash", "byte_size", "ingest_status", "ingest_error",
                       "ingest_run_link", "embedding_model", "chunk_count", "token_count", "embedding_tokens",
                       "usd_cost", "created_by", "created_at", "updated_at", "indexed_at", "chunks_link", "file",
                       "text"]
    fieldsets = [
        (None, {"fields": ["workspace", "title", "kind", "uri", "file", "text"]}),
        ("Ingestion", {"fields": ["ingest_status", "ingest_error", "ingest_run_link", "content_type", "content_hash",
                                  "byte_size", "chunk_size", "chunk_overlap", "chunks_link", "chunk_count",
                                  "token_count", "embedding_model", "embedding_tokens", "usd_cost", "indexed_at"]}),
        ("History", {"fields": ["created_by", "created_at", "updated_at"]}),
    ]

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = KnowledgeSourceAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return [(None, {"fields": ["workspace", "title", "text", "url", "upload", "chunk_size",
                                       "chunk_overlap"]})]
        return self.fieldsets

    def get_readonly_fields(self, request, obj=None):
        if obj is None:
            return []
        return [*self.readonly_fields, "workspace", "chunk_size", "chunk_overlap"]

    def save_model(self, request, obj, form, change):
        if change:
            obj.save(update_fields=["title"])
            return
        data = form.cleaned_data
        try:
            source, created = services.source_create(
                workspace=data["workspace"], text=data.get("text") or "", url=data.get("url") or "",
                upload=data.get("upload"), title=data.get("title", ""), created_by=request.user,
                chunk_size=data.get("chunk_size"), chunk_overlap=data.get("chunk_overlap"))
        except services.KnowledgeError as exc:
            self.message_user(request, f"Not created: {exc}", messages.ERROR)
            source, created = None, False
        if source is not None and not created:
            self.message_user(request, f"The same content is already source #{source.pk} “{source.title}”.",
                              messages.WARNING)
        obj.pk = source.pk if source is not None else None
        if source is not None:
            obj.__dict__.update({k: v for k, v in source.__dict__.items() if not k.startswith("_")})

    def response_add(self, request, obj, post_url_continue=None):
        if obj.pk is None:
            return self.response_post_save_add(request, obj)
        return super().response_add(request, obj, post_url_continue)

    def save_related(self, request, form, formsets, change):
        if change:
            super().save_related(request, form, formsets, change)

    def get_search_results(self, request, queryset, search_term):
        results, may_have_duplicates = super().get_search_results(request, queryset, search_term)
        if search_term.strip():
            # sources whose chunks match the words, through the chunks' GIN index
            matching = KnowledgeChunk.objects.filter(
                search_vector=SearchQuery(search_term, config=SEARCH_CONFIG, search_type="websearch"),
            ).values("source_id")
            results = results | queryset.filter(pk__in=matching)
        return results, may_have_duplicates

    def delete_model(self, request, obj):
        services.source_delete(source=obj)

    def delete_queryset(self, request, queryset):
        for source in queryset:
            services.source_delete(source=source)

    @admin.display(description="ingest run")
    def ingest_run_link(self, obj):
        if not obj.ingest_run_id:
            return "-"
        try:
            url = reverse("admin:durable_durablerun_change", args=[obj.ingest_run_id])
        except Exception:  # the durable admin is not registered
            return obj.ingest_run_id
        return format_html('<a href="{}">{}</a>', url, obj.ingest_run_id)

    @admin.display(description="chunks")
    def chunks_link(self, obj):
        url = reverse("admin:knowledge_knowledgechunk_changelist") + f"?source__id__exact={obj.pk}"
        return format_html('<a href="{}">{} chunk(s)</a>', url, obj.chunk_count)

    def _start(self, request, queryset, **kwargs):
        started, busy = 0, 0
        for source in queryset.order_by("id"):
            try:
                with transaction.atomic():
                    services.source_ingest(source=source, **kwargs)
                started += 1
            except services.IngestInProgress:
                busy += 1
            except services.KnowledgeError as exc:
                self.message_user(request, f"{source}: {exc}", messages.WARNING)
        message = f"Started {started} ingest run(s)."
        if busy:
            message += f" {busy} source(s) were being ingested already and were left alone."
        self.message_user(request, message, messages.SUCCESS if started else messages.WARNING)

    @admin.action(description="Re-ingest (skips unchanged content)")
    def reingest(self, request, queryset):
        self._start(request, queryset)

    @admin.action(description="Re-ingest even if unchanged")
    def reingest_force(self, request, queryset):
        self._start(request, queryset, force=True)

    @admin.action(description="Re-embed with the configured embedding model")
    def reembed(self, request, queryset):
        self._start(request, queryset.filter(chunk_count__gt=0), mode="reembed")


@admin.register(KnowledgeChunk)
class KnowledgeChunkAdmin(WorkspaceScopedAdmin, ReadOnlyAdmin):
    """Chunks are written by ingestion only: read-only here."""

    list_display = ["__str__", "source", "ordinal", "token_count", "preview"]
    list_select_related = ["source"]
    list_filter = [("workspace", admin.RelatedOnlyFieldListFilter)]
    raw_id_fields = ["source", "workspace"]
    search_fields = ["content"]
    show_full_result_count = False
    paginator = EstimatedCountPaginator
    fields = ["source", "workspace", "ordinal", "token_count", "content"]
    readonly_fields = fields

    def get_queryset(self, request):
        return super().get_queryset(request).defer("embedding", "search_vector")

    @admin.display(description="content")
    def preview(self, obj):
        return obj.content[:120] + ("…" if len(obj.content) > 120 else "")


# --------------------------------------------------------------------------------------------- skills


class SkillAddForm(forms.ModelForm):
    skill_md = forms.CharField(label="SKILL.md", widget=forms.Textarea(attrs={"rows": 24, "cols": 100}),
                               help_text="YAML front matter (name, description, version, allowed-tools, triggers, "
                                         "metadata) between --- lines, then the markdown body.")
    make_active = forms.BooleanField(required=False, initial=True, label="Make it the active version")

    class Meta:
        model = Skill
        fields = ["workspace"]

    def clean(self):
        from knowledge.skills import SkillFormatError, parse_skill

        data = super().clean()
        if data.get("skill_md"):
            try:
                self.parsed = parse_skill(data["skill_md"])
            except SkillFormatError as exc:
                self.add_error("skill_md", str(exc))
        return data


@admin.register(Skill)
class SkillAdmin(WorkspaceScopedAdmin, admin.ModelAdmin):
    list_display = ["name", "version", "version_label", "active", "agent", "workspace", "origin", "created_at"]
    list_filter = ["active", "origin", "agent", ("workspace", admin.RelatedOnlyFieldListFilter)]
    list_select_related = ["workspace"]
    search_fields = ["name", "description", "agent"]
    raw_id_fields = ["workspace", "created_by"]
    actions = ["activate_versions"]
    readonly_fields = ["workspace", "name", "version", "version_label", "description", "agent", "triggers",
                       "allowed_tools", "active", "origin", "source_path", "content_hash", "created_by", "created_at",
                       "frontmatter_pretty", "content_md", "version_history", "diff_against_active"]
    fieldsets = [
        (None, {"fields": ["workspace", "name", "version", "version_label", "active", "description", "agent",
                           "triggers", "allowed_tools"]}),
        ("Content", {"fields": ["frontmatter_pretty", "content_md"]}),
        ("Versions", {"fields": ["version_history", "diff_against_active"]}),
        ("Provenance", {"fields": ["origin", "source_path", "content_hash", "created_by", "created_at"]}),
    ]

    def get_form(self, request, obj=None, change=False, **kwargs):
        if obj is None:
            kwargs["form"] = SkillAddForm
        return super().get_form(request, obj, change=change, **kwargs)

    def get_fieldsets(self, request, obj=None):
        if obj is None:
            return [(None, {"fields": ["workspace", "skill_md", "make_active"]})]
        return self.fieldsets

    def get_readonly_fields(self, request, obj=None):
        return [] if obj is None else self.readonly_fields

    def has_change_permission(self, request, obj=None):
        # versions are immutable; the change page is a read-only view with the history and the diff
        return request.method in ("GET", "HEAD") and super().has_change_permission(request, obj)

    def save_model(self, request, obj, form, change):
        skill, outcome = services.skill_save(workspace=form.cleaned_data["workspace"], parsed=form.parsed,
                                             origin=Skill.Origin.ADMIN, created_by=request.user,
                                             activate=form.cleaned_data.get("make_active", True))
        if outcome == "skipped":
            self.message_user(request, f"Unchanged: {skill} already holds this content.", messages.WARNING)
        obj.pk = skill.pk
        obj.__dict__.update({k: v for k, v in skill.__dict__.items() if not k.startswith("_")})

    def save_related(self, request, form, formsets, change):
        pass

    @admin.action(description="Activate the selected version(s)")
    def activate_versions(self, request, queryset):
        chosen: dict[tuple, Skill] = {}
        for skill in queryset.order_by("version"):
            chosen[(skill.workspace_id, skill.name)] = skill  # the newest selected version per skill wins
        changed = 0
        for skill in chosen.values():
            if not skill.active:
                services.skill_activate(skill=skill)
                changed += 1
        self.message_user(request, f"Activated {changed} version(s); {len(chosen) - changed} were active already.")

    @admin.display(description="front matter")
    def frontmatter_pretty(self, obj):
        import json

        return format_html("<pre>{}</pre>", json.dumps(obj.frontmatter, indent=2, ensure_ascii=False))

    @admin.display(description="versions")
    def version_history(self, obj):
        versions = Skill.objects.filter(workspace_id=obj.workspace_id, name=obj.name).order_by("-version") \
            .values_list("pk", "version", "version_label", "active", "created_at")
        rows = format_html_join(
            "", '<tr><td><a href="{}">v{}</a></td><td>{}</td><td>{}</td><td>{}</td></tr>',
            ((reverse("admin:knowledge_skill_change", args=[pk]), number, label or "", "active" if active else "",
              created.strftime("%Y-%m-%d %H:%M")) for pk, number, label, active, created in versions),
        )
        return format_html("<table><tr><th>version</th><th>label</th><th></th><th>created</th></tr>{}</table>", rows)

    @admin.display(description="diff against the active version")
    def diff_against_active(self, obj):
        active = Skill.objects.filter(workspace_id=obj.workspace_id, name=obj.name, active=True).first()
        if active is None:
            return "No version is active."
        if active.pk == obj.pk:
            return "This is the active version."
        before = render_skill(name=active.name, description=active.description, body=active.content_md,
                              frontmatter=active.frontmatter).splitlines()
        after = render_skill(name=obj.name, description=obj.description, body=obj.content_md,
                             frontmatter=obj.frontmatter).splitlines()
        diff = list(difflib.unified_diff(before, after, f"v{active.version} (active)", f"v{obj.version}", lineterm=""))
        if not diff:
            return "Same content as the active version."
        styles = {"+": "color:#0a0;", "-": "color:#c00;", "@": "color:#06c;"}
        lines = format_html_join("\n", '<span style="{}">{}</span>',
                                 ((styles.get(line[:1], ""), line) for line in diff))
        return format_html('<pre style="white-space:pre-wrap">{}</pre>', lines)
