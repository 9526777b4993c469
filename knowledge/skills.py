"""Anthropic-style SKILL.md files: YAML front matter, then a markdown body.

    ---
    name: research-report
    description: Write a sourced research report with key findings and a confidence level.
    version: 1.2.0
    allowed-tools: [knowledge_search, web_fetch]
    triggers: [research, report, sources]
    metadata:
      author: Lineage
      domain: research
      agent: Research Analyst
    ---
    # Research report
    ...

``parse_skill(text)`` returns a ``ParsedSkill`` or raises ``SkillFormatError`` naming what is
wrong. ``skill_matches(skill, query)`` decides whether a skill applies to a query: a trigger,
its name, or one of the leading words of its description appears in the query.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

import yaml

NAME_PATTERN = re.compile(r"^[a-z0-9][a-z0-9-]{0,63}$")
SPEC_DESCRIPTION = 1024  # Anthropic's limit: longer is accepted with a warning (real skill files exceed it)
MAX_DESCRIPTION = 20_000
MAX_FRONT_MATTER = 64 * 1024
MAX_BODY = 200_000
DESCRIPTION_LEAD_WORDS = 5  # how many leading description words match a query
_FRONT_MATTER = re.compile(r"\A\ufeff?---[ \t]*\r?\n(.*?)\r?\n---[ \t]*(?:\r?\n|\Z)(.*)\Z", re.DOTALL)
_STOP = frozenset((
    "a", "an", "and", "are", "as", "at", "be", "but", "by", "for", "from", "how", "in", "into", "is", "it", "of",
    "on", "or", "the", "this", "to", "use", "when", "with", "you", "your",
))

class SkillFormatError(ValueError):
    pass


class _NoAliasLoader(yaml.SafeLoader):
    """safe_load without aliases: `*name` may expand a few hundred bytes into megabytes ("billion
    laughs"), and skill front matter has no use for them."""

    def compose_node(self, parent, index):
        if self.check_event(yaml.AliasEvent):
            raise yaml.composer.ComposerError(None, None, "aliases (*name) are not allowed in skill front matter",
                                              self.peek_event().start_mark)
        return super().compose_node(parent, index)


@dataclass(frozen=True)
class ParsedSkill:
    name: str
    description: str
    body: str
    version_label: str = ""
    allowed_tools: list[str] = field(default_factory=list)
    triggers: list[str] = field(default_factory=list)
    agent: str = ""
    frontmatter: dict = field(default_factory=dict)
    content_hash: str = ""
    warnings: list[str] = field(default_factory=list)  # accepted, but outside Anthropic's format


def _string_list(value, field_name: str) -> list[str]:
    if value is None:
        return []
    if isinstance(value, str):
        # allowed-tools is often written "Read, Grep" or "Read Grep"
        return [item for item in re.split(r"[,\s]+", value.strip()) if item]
    if isinstance(value, list) and all(isinstance(item, str | int | float) for item in value):
        return [str(item).strip() for item in value if str(item).strip()]
    raise SkillFormatError(f"`{field_name}` must be a list of strings")


def parse_skill(text: str) -> ParsedSkill:
    match = _FRONT_MATTER.match(text)
    if not match:
        raise SkillFormatError("no YAML front matter: the file must start with a line `---`, the fields, "
                               "and a closing `---`")
    raw_meta, body = match.groups()
    if len(raw_meta) > MAX_FRONT_MATTER:
        raise SkillFormatError(f"the front matter is larger than {MAX_FRONT_MATTER // 1024} KB")
    try:
        meta = yaml.load(raw_meta, Loader=_NoAliasLoader)  # noqa: S506 - a SafeLoader that also refuses aliases
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 2}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise SkillFormatError(f"invalid YAML front matter{where}: {problem}") from None
    if not isinstance(meta, dict):
        raise SkillFormatError("the front matter must be a mapping of fields")
    name = meta.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SkillFormatError("`name` is required")
    name = name.strip()
    if not NAME_PATTERN.match(name):
        raise SkillFormatError(f"`name` {name!r} must be lowercase letters, digits and hyphens (at most 64)")
    description = meta.get("description")
    if not isinstance(description, str) or not description.strip():
        raise SkillFormatError("`description` is required")
    description = " ".join(description.split())
    warnings = []
    if len(description) > MAX_DESCRIPTION:
        raise SkillFormatError(f"`description` is longer than {MAX_DESCRIPTION} characters")
    if len(description) > SPEC_DESCRIPTION:
        warnings.append(f"`description` is {len(description)} characters, longer than the {SPEC_DESCRIPTION} that "
                        "Anthropic's skill format allows; kept whole")
    body = body.strip()
    if not body:
        raise SkillFormatError("the markdown body after the front matter is empty")
    if len(body) > MAX_BODY:
        raise SkillFormatError(f"the body is longer than {MAX_BODY:,} characters")
    metadata = meta.get("metadata") or {}
    if not isinstance(metadata, dict):
        raise SkillFormatError("`metadata` must be a mapping")
    version = meta.get("version", metadata.get("version", ""))
    if version is not None and not isinstance(version, str | int | float):
        raise SkillFormatError("`version` must be a label such as 1.0.0")
    agent = metadata.get("agent", meta.get("agent", "")) or ""
    if not isinstance(agent, str):
        raise SkillFormatError("`metadata.agent` must be a string")
    tools = _string_list(meta.get("allowed-tools", meta.get("allowed_tools")), "allowed-tools")
    triggers = _string_list(meta.get("triggers"), "triggers") if not isinstance(meta.get("triggers"), str) \
        else [t.strip() for t in meta["triggers"].split(",") if t.strip()]
    frontmatter = yaml.safe_load(yaml.safe_dump(meta, sort_keys=True, default_flow_style=False))  # JSON-safe
    canonical = yaml.safe_dump(meta, sort_keys=True) + "\n---\n" + body
    return ParsedSkill(
        name=name, description=description, body=body, version_label=str(version or "")[:50],
        allowed_tools=tools, triggers=[t.lower() for t in triggers], agent=agent.strip()[:100],
        frontmatter=_jsonable(frontmatter), content_hash=hashlib.sha256(canonical.encode()).hexdigest(),
        warnings=warnings,
    )


def _jsonable(value):
    if isinstance(value, dict):
        return {str(k): _jsonable(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_jsonable(v) for v in value]
    if isinstance(value, str | int | float | bool) or value is None:
        return value
    return str(value)  # dates and other YAML scalars


def render_skill(*, name: str, description: str, body: str, frontmatter: dict | None = None) -> str:
    """A SKILL.md text for a stored version (the admin's diff and the API's download)."""
    meta = dict(frontmatter or {})
    meta.setdefault("name", name)
    meta.setdefault("description", description)
    return "---\n" + yaml.safe_dump(meta, sort_keys=False, allow_unicode=True).strip() + "\n---\n\n" + body + "\n"


# ------------------------------------------------------------------------------------------ matching

_QUERY_WORDS = re.compile(r"[\w-]+")


def _words(text: str) -> set[str]:
    return {w.lower() for w in _QUERY_WORDS.findall(text)}


def match_reason(*, name: str, description: str, triggers: Iterable[str], query: str) -> str:
    """Why a skill applies to `query` ("trigger: bug", "name", "description: triage"), or ""."""
    lowered = " ".join(query.lower().split())
    words = _words(lowered) | {w for word in _words(lowered) for w in word.split("-")}
    for trigger in triggers:
        trigger = " ".join(trigger.lower().split())
        if trigger and re.search(rf"(?<![\w-]){re.escape(trigger)}(?![\w-])", lowered):
            return f"trigger: {trigger}"
    if name.lower() in words or name.lower().replace("-", " ") in lowered:
        return "name"
    lead = [w.lower() for w in _QUERY_WORDS.findall(description)[:DESCRIPTION_LEAD_WORDS]]
    for word in lead:
        if word not in _STOP and len(word) > 2 and word in words:
            return f"description: {word}"
    return ""
