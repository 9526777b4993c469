import pytest


@pytest.fixture
def facts(workspace):
    """A small indexed knowledge base in the workspace (each sentence one fact an item asks about)."""
    from durable.inprocess import run_until_settled
    from knowledge.services import source_create_text

    texts = {
        "Refund policy": "Refunds take five business days. A refund needs the original invoice number.",
        "Shipping guide": "Orders ship within two days of payment. Express shipping costs twelve dollars.",
        "Support hours": "Support answers from nine to five on weekdays. Weekend tickets wait until Monday.",
    }
    for title, text in texts.items():
        source, _ = source_create_text(workspace=workspace, text=text, title=title)
        run_until_settled(source.ingest_run_id, max_wait=30)
    return texts


ITEMS = [
    ("How long do refunds take?", "Refunds take five business days.", ["five business days"]),
    ("What does a refund need?", "A refund needs the original invoice number.", ["invoice number"]),
    ("When do orders ship?", "Orders ship within two days of payment.", ["two days"]),
    ("How much is express shipping?", "Express shipping costs twelve dollars.", ["twelve dollars"]),
    ("When does support answer?", "Support answers from nine to five on weekdays.", ["nine to five"]),
    ("What happens to weekend tickets?", "Weekend tickets wait until Monday.", ["until Monday"]),
]


@pytest.fixture
def support_set(workspace):
    """A golden set of six support questions graded on the facts they must contain."""
    from evals.services import golden_item_add, golden_set_create

    golden = golden_set_create(workspace=workspace, name="support",
                               graders=[{"kind": "contains", "weight": 2.0}, {"kind": "token_f1", "weight": 1.0}],
                               pass_threshold=0.7)
    for question, expected, _terms in ITEMS:
        golden_item_add(golden_set=golden, input={"text": question}, expected_output=expected,
                        tags=["critical"] if "refund" in question else [])
    return golden


@pytest.fixture
def support_versions(make_version):
    """A base support agent that answers without looking anything up, and one that searches first."""
    from tests.workflows.conftest import graph, node

    base = make_version(graph("agent", node("agent", prompt="You are a helpful support agent.")), name="support")
    better_dsl = graph("agent", node("agent", tools=["knowledge_search"],
                                     prompt="You are a helpful support agent. Call knowledge_search before answering."))
    from workflows.services import workflow_version_create

    better, _ = workflow_version_create(workflow=base.workflow, dsl=better_dsl, parents=(base,),
                                        operation="mutation")
    return base, better


@pytest.fixture
def evaluate():
    """Start an eval run and drive it (and its item invocations) in-process to its end."""
    from durable.inprocess import run_until_settled
    from evals.services import eval_run_start

    def run(golden_set, version, **kwargs):
        eval_run = eval_run_start(golden_set=golden_set, version=version, **kwargs)
        run_until_settled(eval_run.durable_run_id, max_wait=60)
        eval_run.refresh_from_db()
        return eval_run

    return run


def result_key(golden_set, version, item) -> str:
    """The reuse key a result of `version` on `item` carries when graded with the set's present
    graders and judge (what comparisons accept as current evidence)."""
    from evals.conf import eval_settings
    from evals.execution import grading_digest, reuse_key
    from evals.graders import validate_graders

    digest = grading_digest(validate_graders(golden_set.graders), eval_settings().judge_model)
    return reuse_key(version.pk, item.content_hash, digest)
