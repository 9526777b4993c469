import pytest

from tests.openai_server import FakeOpenAIChat


@pytest.fixture
def judge_server(settings, monkeypatch):
    """The judge's model answered by a local OpenAI-compatible server; chat() does not retry (a test that
    wants retries sets LLM_MAX_RETRIES)."""
    from llm import retry

    with FakeOpenAIChat(dimensions=8) as server:
        settings.LLM_PROVIDER = "openai"
        settings.OPENAI_API_KEY = "sk-test"
        settings.OPENAI_BASE_URL = server.url("/v1")
        settings.LLM_MAX_RETRIES = 0
        settings.EVAL_JUDGE_MODEL = "gpt-4.1-mini"
        monkeypatch.setattr(retry, "_sleep", lambda seconds: None)
        yield server


@pytest.fixture
def judged_set(workspace, make_version):
    """A golden set graded by the LLM judge alone, of `questions`, and a version answering them offline (so
    only the judge's calls reach judge_server)."""
    from evals.services import golden_item_add, golden_set_create
    from tests.builders import graph, node

    def make(name: str, questions=("Why did the deploy fail?",)):
        golden = golden_set_create(workspace=workspace, name=name, graders=[{"kind": "llm_judge"}])
        for question in questions:
            golden_item_add(golden_set=golden, input={"text": question}, expected_output="The migration timed out.")
        return golden, make_version(graph("a", node("a", model="offline-directive-v1", prompt="Answer.")))

    return make


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
    from tests.builders import graph, node

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
