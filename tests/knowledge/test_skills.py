"""SKILL.md parsing, versioning with one active version, matching, and seed_skills."""

from io import StringIO
from pathlib import Path

import pytest
from django.core.exceptions import ValidationError
from django.core.management import CommandError, call_command
from django.db import IntegrityError, transaction

from knowledge import services
from knowledge.models import Skill
from knowledge.selectors import skill_match
from knowledge.services import SKILL_PACK_DIR, skill_files, skills_seed
from knowledge.skills import SkillFormatError, match_reason, parse_skill

SKILL = """---
name: bug-triage
description: Triage a bug report into a severity and reproduction steps.
version: 1.2.0
allowed-tools: Read, knowledge_search
triggers: [stack trace, crash]
metadata:
  author: Lineage
  agent: Bug Triage Assistant
---
# Bug triage

Read the report carefully.
"""


def test_parse_a_skill():
    parsed = parse_skill(SKILL)
    assert parsed.name == "bug-triage"
    assert parsed.version_label == "1.2.0"
    assert parsed.allowed_tools == ["Read", "knowledge_search"]
    assert parsed.triggers == ["stack trace", "crash"]
    assert parsed.agent == "Bug Triage Assistant"
    assert parsed.body.startswith("# Bug triage")
    assert parsed.frontmatter["metadata"]["author"] == "Lineage"
    assert parse_skill(SKILL).content_hash == parsed.content_hash
    assert parse_skill(SKILL.replace("carefully", "twice")).content_hash != parsed.content_hash


@pytest.mark.parametrize(("text", "reason"), [
    ("# no front matter", "no YAML front matter"),
    ("---\nname: [unclosed\n---\nbody", "invalid YAML front matter at line 2"),
    ("---\n- a list\n---\nbody", "must be a mapping"),
    ("---\ndescription: d\n---\nbody", "`name` is required"),
    ("---\nname: Bad Name\ndescription: d\n---\nbody", "lowercase letters"),
    ("---\nname: ok\n---\nbody", "`description` is required"),
    ("---\nname: ok\ndescription: d\n---\n   \n", "body after the front matter is empty"),
    ("---\nname: ok\ndescription: d\ntriggers: {a: 1}\n---\nbody", "`triggers` must be a list"),
    ("---\nname: ok\ndescription: d\nmetadata: 3\n---\nbody", "`metadata` must be a mapping"),
])
def test_malformed_skills_name_the_problem(text, reason):
    with pytest.raises(SkillFormatError, match=reason):
        parse_skill(text)


def test_matching_by_trigger_name_and_leading_description_words():
    def reason(query):
        return match_reason(name="bug-triage", description="Triage a bug report into a severity.",
                            triggers=["stack trace", "crash"], query=query)

    assert reason("Here is the STACK TRACE from prod") == "trigger: stack trace"
    assert reason("the app crashed") == ""  # whole words only
    assert reason("run bug-triage on this") == "name"
    assert reason("please triage this") == "description: triage"
    assert reason("a severity question") == ""  # not a leading word
    assert reason("bake a cake") == ""


def test_the_shipped_pack_parses_and_covers_the_seven_agents():
    files = skill_files(SKILL_PACK_DIR)
    parsed = [parse_skill(f.read_text()) for f in files]
    agents = {p.agent for p in parsed}
    assert {"General Assistant", "Research Analyst", "Code Review Agent", "Data Analyst", "Content Strategist",
            "Meeting Summarizer", "Bug Triage Assistant"} <= agents


@pytest.mark.django_db
class TestVersions:
    def test_new_content_becomes_the_next_active_version(self, workspace):
        first, outcome = services.skill_create_from_text(workspace=workspace, content=SKILL)
        assert (first.version, first.active, outcome) == (1, True, "created")
        same, outcome = services.skill_create_from_text(workspace=workspace, content=SKILL)
        assert same.pk == first.pk and outcome == "skipped"
        second, outcome = services.skill_create_from_text(workspace=workspace,
                                                          content=SKILL.replace("carefully", "twice"))
        assert (second.version, second.active, outcome) == (2, True, "updated")
        first.refresh_from_db()
        assert not first.active
        services.skill_activate(skill=first)
        assert list(Skill.objects.filter(active=True).values_list("version", flat=True)) == [1]

    def test_one_active_version_is_a_database_constraint(self, workspace):
        services.skill_create_from_text(workspace=workspace, content=SKILL)
        parsed = parse_skill(SKILL.replace("carefully", "again"))
        with pytest.raises(IntegrityError), transaction.atomic():
            Skill.objects.create(workspace=workspace, name=parsed.name, version=2, description="d", content_md="b",
                                 content_hash=parsed.content_hash, active=True)

    def test_versions_are_immutable(self, workspace):
        skill, _ = services.skill_create_from_text(workspace=workspace, content=SKILL)
        skill.content_md = "changed"
        with pytest.raises(ValidationError, match="immutable"):
            skill.save()
        skill.refresh_from_db()
        skill.active = False
        skill.save(update_fields=["active"])

    def test_skill_match_uses_active_versions(self, workspace):
        services.skill_create_from_text(workspace=workspace, content=SKILL)
        matches = skill_match(workspace=workspace, query="it crashed with a crash log")
        assert [(m.skill.name, m.reason) for m in matches] == [("bug-triage", "trigger: crash")]
        assert skill_match(workspace=workspace, query="crash", agent="Data Analyst") == []


def _pack(tmp_path: Path, files: dict[str, str]) -> Path:
    for folder, text in files.items():
        (tmp_path / folder).mkdir(parents=True, exist_ok=True)
        (tmp_path / folder / "SKILL.md").write_text(text)
    return tmp_path


@pytest.mark.django_db
class TestSeedSkills:
    def test_the_shipped_pack_seeds_idempotently(self, workspace):
        out = StringIO()
        call_command("seed_skills", "--workspace", "acme", stdout=out)
        count = len(skill_files(SKILL_PACK_DIR))
        assert Skill.objects.filter(workspace=workspace, active=True).count() == count
        assert f"{count} created, 0 updated, 0 skipped" in out.getvalue()
        out = StringIO()
        call_command("seed_skills", "--workspace", "acme", stdout=out)
        assert f"0 created, 0 updated, {count} skipped" in out.getvalue()
        assert Skill.objects.count() == count

    def test_changed_file_becomes_a_new_version_and_malformed_files_are_reported(self, workspace, tmp_path):
        pack = _pack(tmp_path, {"bug": SKILL, "other": SKILL.replace("bug-triage", "other-skill")})
        call_command("seed_skills", "--path", str(pack), "--workspace", "acme", stdout=StringIO())
        (pack / "bug" / "SKILL.md").write_text(SKILL.replace("carefully", "twice"))
        _pack(pack, {"broken": "---\nname: [x\n---\nbody", "nested/deeper/fine": SKILL.replace("bug-triage", "deep")})
        out, err = StringIO(), StringIO()
        with pytest.raises(CommandError, match="1 malformed skill file"):
            call_command("seed_skills", "--path", str(pack), "--workspace", "acme", stdout=out, stderr=err)
        assert "1 created, 1 updated, 1 skipped" in out.getvalue()
        assert f"malformed {pack / 'broken' / 'SKILL.md'}: invalid YAML front matter" in err.getvalue()
        assert list(Skill.objects.filter(name="bug-triage").order_by("version")
                    .values_list("version", "active")) == [(1, False), (2, True)]
        assert Skill.objects.filter(name="deep", active=True).exists()

    def test_dry_run_writes_nothing(self, workspace, tmp_path):
        pack = _pack(tmp_path, {"bug": SKILL})
        out = StringIO()
        call_command("seed_skills", "--path", str(pack), "--workspace", "acme", "--dry-run", stdout=out)
        assert "[dry run] would have created: 1" in out.getvalue()
        assert not Skill.objects.exists()

    def test_prune_deactivates_seeded_skills_that_left_the_pack(self, workspace, tmp_path):
        pack = _pack(tmp_path, {"bug": SKILL, "other": SKILL.replace("bug-triage", "other-skill")})
        skills_seed(workspace=workspace, root=pack)
        services.skill_create_from_text(workspace=workspace, content=SKILL.replace("bug-triage", "mine"))
        (pack / "other" / "SKILL.md").unlink()
        report = skills_seed(workspace=workspace, root=pack, prune=True)
        assert report.pruned == ["other-skill"]
        assert set(Skill.objects.filter(active=True).values_list("name", flat=True)) == {"bug-triage", "mine"}

    def test_every_workspace_by_default_and_unknown_slug(self, workspace, other_workspace, tmp_path):
        pack = _pack(tmp_path, {"bug": SKILL})
        call_command("seed_skills", "--path", str(pack), stdout=StringIO())
        assert Skill.objects.filter(name="bug-triage").count() == 2
        with pytest.raises(CommandError, match="No workspace with the slug 'nope'"):
            call_command("seed_skills", "--workspace", "nope", stdout=StringIO())


# a "billion laughs": each level of aliases nine times the one before (five levels: 59,049 strings)
ALIAS_BOMB = "---\nname: bomb\ndescription: d\na: &a [" + ",".join(['"lol"'] * 9) + "]\n" + "".join(
    f"{level}: &{level} [" + ",".join([f"*{below}"] * 9) + "]\n" for below, level in zip("abcd", "bcde", strict=True)
) + "---\n# Bomb\n\nbody\n"


def test_aliases_in_front_matter_are_refused_before_they_expand():
    with pytest.raises(SkillFormatError, match="aliases"):
        parse_skill(ALIAS_BOMB)
    with pytest.raises(SkillFormatError, match="aliases"):
        parse_skill("---\nname: ok\ndescription: &d text\nmetadata: {agent: *d}\n---\nbody")


def test_front_matter_is_limited_in_size():
    with pytest.raises(SkillFormatError, match="front matter is larger"):
        parse_skill("---\nname: ok\ndescription: d\nnotes: " + "x" * 70_000 + "\n---\nbody")


@pytest.mark.django_db
def test_an_alias_bomb_is_refused_by_the_api_the_admin_and_seed_skills(api_as, owner, workspace, admin_client,
                                                                       tmp_path):
    response = api_as(owner).post("/api/knowledge/skills/", {"workspace": workspace.pk, "content": ALIAS_BOMB},
                                  format="json")
    assert response.status_code == 400
    assert "aliases" in response.json()["error"]["fields"]["content"][0]
    page = admin_client.post("/admin/knowledge/skill/add/", {"workspace": workspace.pk, "skill_md": ALIAS_BOMB})
    assert page.status_code == 200 and "aliases" in page.content.decode()
    (tmp_path / "bomb").mkdir()
    (tmp_path / "bomb" / "SKILL.md").write_text(ALIAS_BOMB)
    report = skills_seed(workspace=workspace, root=tmp_path)
    assert report.errors and "aliases" in report.errors[0][1]
    assert not Skill.objects.exists()


LONG_DESCRIPTION = ("Use this skill whenever the user wants to create, read, edit or convert documents; " * 14)[:1080]


@pytest.mark.django_db
def test_a_long_description_is_accepted_with_a_warning(workspace, tmp_path):
    text = f"---\nname: docx\ndescription: \"{LONG_DESCRIPTION}\"\n---\n# Docx\n\nWork with documents.\n"
    parsed = parse_skill(text)
    assert parsed.description == LONG_DESCRIPTION.strip()
    assert parsed.warnings == [f"`description` is {len(LONG_DESCRIPTION.strip())} characters, longer than the "
                               "1024 that Anthropic's skill format allows; kept whole"]
    (tmp_path / "docx").mkdir()
    (tmp_path / "docx" / "SKILL.md").write_text(text)
    out, err = StringIO(), StringIO()
    call_command("seed_skills", "--workspace", workspace.slug, "--path", str(tmp_path), stdout=out, stderr=err)
    assert "created: 1" in out.getvalue()
    assert f"docx/SKILL.md: `description` is {len(parsed.description)} characters" in err.getvalue()
    assert Skill.objects.get(name="docx").description == LONG_DESCRIPTION.strip()
    with pytest.raises(SkillFormatError, match="longer than 20000"):
        parse_skill(f"---\nname: docx\ndescription: {'x' * 20_001}\n---\nbody")
