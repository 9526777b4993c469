import pytest

from tests.evals.conftest import ITEMS, evaluate, facts, support_set  # noqa: F401  (shared fixtures)
from tests.llm.conftest import openai_server  # noqa: F401  (the local OpenAI-compatible server)


@pytest.fixture
def support_base(make_version):
    """A support agent that answers without looking anything up (room to improve)."""
    from tests.builders import graph, node

    return make_version(graph("agent", node("agent", prompt="You are a helpful support agent.")), name="support")


@pytest.fixture
def evolve():
    """Start an evolution run and drive it (and its eval runs and invocations) in-process."""
    from durable.inprocess import run_until_settled
    from evolution.services import evolution_start

    def run(workflow, golden_set, **kwargs):
        evolution = evolution_start(workflow=workflow, golden_set=golden_set, **kwargs)
        run_until_settled(evolution.durable_run_id, max_wait=300)
        evolution.refresh_from_db()
        return evolution

    return run


# each fact of `facts` asked four ways: the set's splits take one phrasing each to test, one to validation, two to
# train, so that every split asks about every fact
PHRASINGS = [
    ("Refunds take five business days.", ["How long do refunds take?", "How many business days does a refund take?",
                                          "What is the refund time in business days?", "Do refunds take days?"]),
    ("A refund needs the original invoice number.", ["What does a refund need?", "Which invoice number does a "
                                                     "refund need?", "Is the original invoice needed for a refund?",
                                                     "What must a refund have?"]),
    ("Orders ship within two days of payment.", ["When do orders ship?", "How soon after payment do orders ship?",
                                                 "Do orders ship within days of payment?", "When are orders shipped?"]),
    ("Express shipping costs twelve dollars.", ["How much is express shipping?", "What does express shipping cost?",
                                                "Is express shipping twelve dollars?", "Express shipping costs what?"]),
    ("Support answers from nine to five on weekdays.", ["When does support answer?", "Which hours does support "
                                                        "answer on weekdays?", "Does support answer on weekdays?",
                                                        "When do support answers come?"]),
    ("Weekend tickets wait until Monday.", ["What happens to weekend tickets?", "How long do weekend tickets wait?",
                                            "Do weekend tickets wait until Monday?", "When are weekend tickets seen?"]),
]
SPLIT_OF_PHRASING = ("train", "validation", "test", "train")
NO_INFORMATION = "I don't have enough information to answer."  # the offline model's answer without evidence


def _graded_set(workspace, name: str):
    from evals.services import golden_set_create

    return golden_set_create(workspace=workspace, name=name, pass_threshold=0.7,
                             graders=[{"kind": "contains", "weight": 2.0}, {"kind": "token_f1", "weight": 1.0}])


@pytest.fixture
def held_out_set(workspace):
    """24 support questions on `facts` (12 train, 6 validation, 6 test, each split asking about every fact):
    a set that carries a held-out claim, where looking facts up pays on every split."""
    from evals.services import golden_item_add

    golden = _graded_set(workspace, "support held out")
    for expected, questions in PHRASINGS:
        for question, split in zip(questions, SPLIT_OF_PHRASING, strict=True):
            golden_item_add(golden_set=golden, input={"text": question}, expected_output=expected, split=split)
    return golden


@pytest.fixture
def diverging_set(workspace):
    """12 items where what pays on train does not on validation: train asks the six facts (looking them up
    pays), validation asks three questions the knowledge base cannot answer and expects the offline model's
    answer without evidence (a version that looks things up answers with what it found instead), test asks
    three facts again."""
    from evals.services import golden_item_add

    golden = _graded_set(workspace, "support diverging")
    for expected, questions in PHRASINGS:
        golden_item_add(golden_set=golden, input={"text": questions[0]}, expected_output=expected, split="train")
    for question in ("Who painted the ceiling?", "Which planet has rings?", "What is the capital city?"):
        golden_item_add(golden_set=golden, input={"text": question}, expected_output=NO_INFORMATION,
                        split="validation")
    for expected, questions in PHRASINGS[::2]:
        golden_item_add(golden_set=golden, input={"text": questions[2]}, expected_output=expected, split="test")
    return golden
