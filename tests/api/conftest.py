import pytest

import tests.durable.workflows  # noqa: F401 - the suites walk every registered workflow, test ones included


@pytest.fixture(autouse=True)
def _no_celery_dispatch(settings):
    """Runs started through the API here are driven in-process (or left pending): no worker listens."""
    settings.DURABLE_DISPATCH_ENABLED = False


def make_world(workspace, user):
    """One object of every kind the API exposes, in `workspace`, created by `user`; returns a marker text
    found in its content (the isolation suite checks it never reaches another workspace's member)."""
    from durable.inprocess import run_until_settled
    from durable.services import run_start, schedule_save
    from tests.factories import KnowledgeChunkFactory, KnowledgeSourceFactory, SkillFactory

    marker = f"marker-{workspace.slug}-7431"
    source = KnowledgeSourceFactory(workspace=workspace, title=f"Source {marker}", text=f"Text {marker}",
                                    created_by=user, chunk_count=1)
    KnowledgeChunkFactory(source=source, content=f"Chunk about durable workflows {marker}")
    SkillFactory(workspace=workspace, name=f"skill-{workspace.slug}", description=f"Skill {marker}",
                 triggers=["durable"], created_by=user)
    run = run_start(workflow="tests.sequence", input={"steps": 2, "note": marker}, namespace=workspace.namespace,
                    tags=["vip"])
    run_until_settled(run.pk)
    run_start(workflow="tests.signal", input={"note": marker}, namespace=workspace.namespace)
    schedule_save(key=f"sched-{workspace.slug}", workflow="tests.sequence", namespace=workspace.namespace,
                  input={"note": marker}, every_seconds=3600)
    return marker


@pytest.fixture
def world(workspace, other_workspace, owner, outsider):
    """The owner's workspace and the outsider's, each with one object of every kind."""
    return {"mine": make_world(workspace, owner), "theirs": make_world(other_workspace, outsider)}


@pytest.fixture
def object_ids(world, api_as):
    """For a user: {collection path: the id of the first object they can list there}."""

    def ids_for(user) -> dict[str, str]:
        from tests.api.schema import collections

        client = api_as(user)
        found = {}
        for path in collections():
            response = client.get(path)
            if response.status_code != 200:
                continue
            rows = response.json()
            rows = rows["results"] if isinstance(rows, dict) and "results" in rows else rows
            if isinstance(rows, list) and rows:
                found[path] = str(rows[0]["id"])
        return found

    return ids_for
