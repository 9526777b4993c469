import django_filters
from django.conf import settings
from django.db.models import Q

from knowledge.models import KnowledgeSource, Skill
from workspaces.api.filters import WorkspaceFilter


class KnowledgeSourceFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter()
    q = django_filters.CharFilter(method="filter_q", help_text="Words in the title or the URL / file name.")
    needs_reembed = django_filters.BooleanFilter(
        method="filter_needs_reembed", help_text="Indexed with another embedding model than the configured one.")

    class Meta:
        model = KnowledgeSource
        fields = ["workspace", "kind", "ingest_status", "embedding_model"]

    def filter_q(self, queryset, name, value):
        return queryset.filter(Q(title__icontains=value) | Q(uri__icontains=value))

    def filter_needs_reembed(self, queryset, name, value):
        stale = Q(ingest_status=KnowledgeSource.Status.INDEXED) & ~Q(embedding_model=settings.EMBEDDING_MODEL)
        return queryset.filter(stale) if value else queryset.exclude(stale)


class SkillFilter(django_filters.FilterSet):
    workspace = WorkspaceFilter()
    q = django_filters.CharFilter(method="filter_q", help_text="Words in the name or the description.")

    class Meta:
        model = Skill
        fields = ["workspace", "name", "agent", "active", "origin"]

    def filter_q(self, queryset, name, value):
        return queryset.filter(Q(name__icontains=value) | Q(description__icontains=value))
