"""Reads for the knowledge base and the skill library.

``knowledge_search`` (vector, full-text, hybrid) lives in knowledge/search.py with its plan
logic and is re-exported here, so callers (API, admin, workflow tools) import reads from one place.
"""

from __future__ import annotations

from dataclasses import dataclass

from django.db import connection

from knowledge.models import KnowledgeChunk, Skill
from knowledge.search import SearchHit, SearchResult, knowledge_search
from knowledge.skills import match_reason

__all__ = ["SearchHit", "SearchResult", "embedding_column_width", "knowledge_search", "skill_match", "skill_versions",
           "source_chunks"]


@dataclass(frozen=True)
class SkillMatch:
    skill: Skill
    reason: str


def skill_match(*, workspace, query: str, agent: str | None = None) -> list[SkillMatch]:
    """The active skills of a workspace that apply to `query` (a trigger, the name, or a leading
    description word appears in it), optionally only those written for `agent` or for any agent."""
    skills = Skill.objects.filter(workspace=workspace, active=True).order_by("name")
    if agent:
        skills = skills.filter(agent__in=[agent, ""])
    matches = []
    for skill in skills:
        reason = match_reason(name=skill.name, description=skill.description, triggers=skill.triggers, query=query)
        if reason:
            matches.append(SkillMatch(skill, reason))
    return matches


def skill_versions(*, skill: Skill):
    """Every version of the skill's (workspace, name), newest first."""
    return Skill.objects.filter(workspace_id=skill.workspace_id, name=skill.name).select_related("created_by") \
        .order_by("-version")


def source_chunks(*, source):
    return KnowledgeChunk.objects.filter(source=source).order_by("ordinal").only(
        "id", "ordinal", "content", "token_count")


def embedding_column_width() -> int | None:
    """The width N of the stored vectors (the chunk table's vector(N) column), or None before the
    knowledge tables exist."""
    with connection.cursor() as cursor:
        cursor.execute("SELECT atttypmod FROM pg_attribute WHERE attrelid = to_regclass(%s) AND attname = 'embedding'",
                       [KnowledgeChunk._meta.db_table])
        row = cursor.fetchone()
    return int(row[0]) if row and row[0] > 0 else None
