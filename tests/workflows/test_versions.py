"""Workflow versions: content-addressed, immutable, their nodes derived, at most one active."""

import threading

import pytest
from django.db import IntegrityError, connections

from tests.workflows.test_dsl import SEED_EXPORT, two_nodes
from workflows.dsl import DslError
from workflows.models import NodeVersion, WorkflowVersion
from workflows.services import workflow_create, workflow_version_activate, workflow_version_create


@pytest.fixture
def workflow(workspace, owner):
    return workflow_create(workspace=workspace, name="research", owner=owner)


@pytest.mark.django_db
def test_the_same_dsl_returns_the_existing_version(workflow):
    first, created = workflow_version_create(workflow=workflow, dsl=two_nodes())
    assert created
    reordered = two_nodes()
    reordered["nodes"].reverse()
    again, created_again = workflow_version_create(workflow=workflow, dsl=reordered)
    assert (again.pk, created_again) == (first.pk, False)
    assert WorkflowVersion.objects.filter(workflow=workflow).count() == 1


@pytest.mark.django_db
def test_a_version_derives_its_nodes_and_lists_unresolved_tools(workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=SEED_EXPORT, commit_message="imported")
    nodes = {node.node_id: node for node in NodeVersion.objects.filter(workflow_version=version)}
    assert set(nodes) == {"researcher", "critic", "writer"}
    assert nodes["researcher"].llm_model == "openrouter#openai/gpt-4.1-mini"
    assert {"kind": "mcp", "name": "tavily"} in nodes["researcher"].tools
    assert nodes["researcher"].memory == {"lastTopic": "durable execution"}
    assert nodes["writer"].waiting_for == ["critic"]
    assert version.unresolved_tools == ["researcher.browserUse", "researcher.csvReader", "researcher.tavily"]


@pytest.mark.django_db
def test_an_invalid_dsl_writes_nothing(workflow):
    with pytest.raises(DslError) as error:
        workflow_version_create(workflow=workflow, dsl=two_nodes(entryNodeId="ghost"))
    assert "entryNodeId" in error.value.errors
    assert not WorkflowVersion.objects.exists()


@pytest.mark.django_db
def test_genealogy_links_parents_of_the_same_workflow_only(workflow, workspace):
    base, _ = workflow_version_create(workflow=workflow, dsl=two_nodes())
    changed = two_nodes()
    changed["nodes"][0]["systemPrompt"] = "Plan in three steps."
    child, _ = workflow_version_create(workflow=workflow, dsl=changed, operation="mutation", parents=(base,),
                                       commit_message="prompt: three steps")
    assert (child.parent1_id, child.parent2_id, child.operation) == (base.pk, None, "mutation")
    other = workflow_create(workspace=workspace, name="other")
    with pytest.raises(DslError):
        workflow_version_create(workflow=other, dsl=changed, parents=(base,))


@pytest.mark.django_db
def test_a_version_is_immutable_but_its_status_and_scores_move(workflow):
    version, _ = workflow_version_create(workflow=workflow, dsl=two_nodes())
    version.dsl["nodes"][0]["systemPrompt"] = "tampered"
    with pytest.raises(ValueError, match="immutable"):
        version.save()
    with pytest.raises(ValueError, match="immutable"):
        version.save(update_fields=["dsl"])
    version.avg_score = 0.8
    version.save(update_fields=["avg_score"])
    version.refresh_from_db()
    assert version.avg_score == 0.8 and version.dsl["nodes"][0]["systemPrompt"] == "Plan."


@pytest.mark.django_db
def test_the_database_allows_one_active_version_per_workflow(workflow):
    first, _ = workflow_version_create(workflow=workflow, dsl=two_nodes())
    changed = two_nodes()
    changed["nodes"][1]["systemPrompt"] = "Write briefly."
    second, _ = workflow_version_create(workflow=workflow, dsl=changed)
    workflow_version_activate(version=first)
    with pytest.raises(IntegrityError):
        WorkflowVersion.objects.filter(pk=second.pk).update(status="active")


@pytest.mark.django_db(transaction=True)
def test_concurrent_activations_leave_exactly_one_active_version(workspace):
    workflow = workflow_create(workspace=workspace, name="race")
    versions = []
    for index in range(4):
        document = two_nodes()
        document["nodes"][0]["systemPrompt"] = f"Plan, variant {index}."
        versions.append(workflow_version_create(workflow=workflow, dsl=document)[0])
    barrier = threading.Barrier(len(versions))
    errors = []

    def activate(version):
        try:
            barrier.wait(5)
            workflow_version_activate(version=version)
        except Exception as exc:  # reported to the test
            errors.append(exc)
        finally:
            connections.close_all()

    threads = [threading.Thread(target=activate, args=(version,)) for version in versions]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(20)
    assert not any(thread.is_alive() for thread in threads), "an activation never finished"
    assert errors == []
    statuses = list(WorkflowVersion.objects.filter(workflow=workflow).values_list("status", flat=True))
    assert statuses.count("active") == 1 and statuses.count("archived") == 3


@pytest.mark.django_db
def test_the_admin_shows_a_version_read_only_and_only_to_its_workspace(admin_client, workflow, client,
                                                                         other_workspace):
    from django.contrib.auth import get_user_model
    from django.urls import reverse

    from tests.factories import MembershipFactory

    version, _ = workflow_version_create(workflow=workflow, dsl=SEED_EXPORT)
    url = reverse("admin:workflows_workflowversion_change", args=[version.pk])
    page = admin_client.get(url)
    assert page.status_code == 200
    html = page.content.decode()
    assert "openrouter#openai/gpt-4.1-mini" in html and "researcher.tavily" in html
    assert admin_client.post(url, {"commit_message": "edited"}).status_code == 403
    staff = get_user_model().objects.create_user("staff", password="x", is_staff=True)
    MembershipFactory(user=staff, workspace=other_workspace)
    client.force_login(staff)
    from django.contrib.auth.models import Permission

    staff.user_permissions.add(*Permission.objects.filter(content_type__app_label="workflows"))
    assert client.get(url).status_code in (302, 404)
    listing = client.get(reverse("admin:workflows_workflowversion_changelist"))
    assert listing.status_code == 200 and version.dsl_hash[:12] not in listing.content.decode()


@pytest.mark.django_db
def test_ancestors_and_descendants_in_one_query_each_through_both_parents(workspace, django_assert_num_queries):
    from workflows.selectors import version_ancestors, version_descendants

    workflow = workflow_create(workspace=workspace, name="lineage")

    def version(label, *parents):
        document = two_nodes()
        document["nodes"][0]["systemPrompt"] = label
        return workflow_version_create(workflow=workflow, dsl=document, parents=parents,
                                       operation="crossover" if len(parents) == 2 else "mutation")[0]

    root = version("root")
    left, right = version("left", root), version("right", root)
    child = version("child", left, right)  # a crossover: a diamond back to the root
    chain = [child]
    for n in range(30):
        chain.append(version(f"deep {n}", chain[-1]))
    with django_assert_num_queries(1):
        ancestors = version_ancestors(chain[-1])
    assert ancestors[:2] == [(chain[-2].pk, 1), (chain[-3].pk, 2)]
    assert dict(ancestors)[root.pk] == 32 and {left.pk, right.pk} <= dict(ancestors).keys()
    assert len(ancestors) == 33  # 29 in the chain above, child, left, right, root: each once
    with django_assert_num_queries(1):
        descendants = version_descendants(root)
    assert dict(descendants)[left.pk] == 1 and dict(descendants)[child.pk] == 2 and len(descendants) == 33
    assert version_ancestors(root) == [] and version_descendants(chain[-1]) == []
    assert len(version_ancestors(chain[-1], max_depth=3)) == 3


@pytest.mark.django_db
def test_hand_offs_in_another_order_are_another_version_that_answers_from_its_own_last_node(workflow, invoke):
    from tests.builders import graph, node

    def ordered(*targets):
        return graph("a", node("a", prompt="Route the question.", handoffs=targets),
                     node("b", prompt="Answer in one sentence.", handoffs=["end"]),
                     node("c", prompt="Answer with a bullet list.", handoffs=["end"]))

    first, created_first = workflow_version_create(workflow=workflow, dsl=ordered("b", "c"))
    second, created_second = workflow_version_create(workflow=workflow, dsl=ordered("c", "b"))
    assert created_first and created_second and second.pk != first.pk
    assert second.dsl["nodes"][0]["handOffs"] == ["c", "b"]
    answers = [invoke(version, {"text": "How do durable runs survive a crash?"}) for version in (first, second)]
    assert [answer.status for answer in answers] == ["completed", "completed"]
    assert [answer.output["node_id"] for answer in answers] == ["c", "b"]


@pytest.mark.django_db
def test_versions_hashed_before_hand_off_order_counted_are_found_again_after_the_migration(workflow):
    """A version written when the hash sorted every list: the migration recomputes its hash, so
    posting its DSL again returns it instead of writing a second version."""
    import importlib

    from django.apps import apps

    from tests.builders import graph, node

    migration = importlib.import_module("workflows.migrations.0004_dsl_hash_keeps_handoff_order")
    document = graph("a", node("a", handoffs=["c", "b"]), node("b", handoffs=["end"]), node("c", handoffs=["end"]))
    stored, _ = workflow_version_create(workflow=workflow, dsl=document)
    untouched, _ = workflow_version_create(workflow=workflow, dsl=graph("b", node("b", handoffs=["end"])))
    WorkflowVersion.objects.filter(pk=stored.pk).update(dsl_hash=migration._hash(stored.dsl, ordered=False))
    assert migration.rehash(apps) == 1
    again, created = workflow_version_create(workflow=workflow, dsl=document)
    assert (again.pk, created) == (stored.pk, False)
    assert WorkflowVersion.objects.get(pk=untouched.pk).dsl_hash == untouched.dsl_hash


@pytest.mark.django_db
def test_each_activation_is_recorded_and_activating_the_active_version_records_nothing(workflow, owner):
    from workflows.models import VersionActivation

    first, _ = workflow_version_create(workflow=workflow, dsl=two_nodes())
    second, _ = workflow_version_create(workflow=workflow, dsl=two_nodes(entryNodeId="writer"))
    workflow_version_activate(version=first, user=owner)
    workflow_version_activate(version=second)
    workflow_version_activate(version=second)
    history = list(VersionActivation.objects.filter(workflow=workflow).order_by("id"))
    assert [(row.workflow_version, row.previous_version, row.kind) for row in history] == [
        (first, None, "activate"), (second, first, "activate")]
    assert history[1].parent == history[0] and history[0].created_by == owner
    with pytest.raises(ValueError, match="never rewritten"):
        history[0].save()


@pytest.mark.django_db
def test_the_backfill_gives_versions_activated_before_the_history_their_order_of_archiving(workflow):
    import importlib

    from django.apps import apps
    from django.utils import timezone

    from workflows.models import VersionActivation
    from workflows.selectors import rollback_target

    migration = importlib.import_module("workflows.migrations.0005_version_activation_history")
    versions = [workflow_version_create(workflow=workflow, dsl=two_nodes(description=str(n)))[0] for n in range(3)]
    for version in versions:
        workflow_version_activate(version=version)
    VersionActivation.objects.all().delete()  # as a database migrated from before the history was kept
    WorkflowVersion.objects.filter(pk=versions[1].pk).update(updated_at=timezone.now())  # archived last
    migration.backfill(apps, None)
    assert rollback_target(workflow_id=workflow.pk) == versions[1]
    assert VersionActivation.objects.filter(workflow=workflow).count() == 3


@pytest.mark.django_db
def test_the_diff_of_two_versions_names_a_change_of_hand_off_order_and_not_of_tool_order(workflow):
    from tests.builders import graph, node
    from workflows.selectors import version_diff

    def ordered(targets, tools):
        return graph("a", node("a", handoffs=targets, tools=tools), node("b", handoffs=["end"]),
                     node("c", handoffs=["end"]))

    old, _ = workflow_version_create(workflow=workflow, dsl=ordered(["b", "c"], ["knowledge_search", "skill_load"]))
    new, _ = workflow_version_create(workflow=workflow, dsl=ordered(["c", "b"], ["skill_load", "knowledge_search"]))
    assert version_diff(old, new)["nodes"]["a"] == {"change": "changed", "fields": ["handOffs"], "prompt_diff": []}
