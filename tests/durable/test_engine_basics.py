import pytest

from durable.codec import decode
from durable.inprocess import run_until_settled
from durable.models import StepCheckpoint
from durable.services import run_start

pytestmark = pytest.mark.django_db


def test_inline_steps_complete_and_checkpoint_once():
    run = run_start(workflow="tests.sequence", input={"steps": 5})
    run = run_until_settled(run.id)
    assert run.status == "completed"
    assert decode(run.output) == {"total": 10}
    assert StepCheckpoint.objects.filter(run=run).count() == 5
    assert run.turns == 1


def test_queued_steps_suspend_and_resume():
    run = run_until_settled(run_start(workflow="tests.queued").id)
    assert run.status == "completed", run.error
    assert decode(run.output) == 13
    assert run.turns == 3
