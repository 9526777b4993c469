import json
from datetime import timedelta
from io import StringIO

import pytest
from django.core.management import CommandError, call_command
from django.db import connection
from django.utils import timezone

from durable.codec import decode
from durable.inprocess import run_until_settled
from durable.models import DurableRun, StepCheckpoint
from durable.services import run_start

pytestmark = pytest.mark.django_db


def durable(*args) -> str:
    out = StringIO()
    call_command("durable", *args, stdout=out)
    return out.getvalue()


def test_list_prints_an_aligned_table_and_filters():
    done = run_until_settled(run_start(workflow="tests.values", input={"customer": "acme", "amount": 5},
                                       namespace="ns-a", tags=["vip"]).id)
    failed = run_until_settled(run_start(workflow="tests.maybe_fail", input={"fail": True}).id)
    output = durable("list")
    lines = output.splitlines()
    assert lines[0].split() == ["ID", "WORKFLOW", "NAMESPACE", "STATUS", "CREATED", "ENDED", "TURNS"]
    assert set(lines[1]) <= {"-", " "}
    assert lines[0].index("WORKFLOW") == lines[2].index("tests.")  # columns line up
    assert done.id in output and failed.id in output
    assert failed.id not in durable("list", "--status", "completed")
    assert done.id not in durable("list", "--status", "failed,dead")
    assert failed.id not in durable("list", "--workflow", "tests.values")
    assert failed.id not in durable("list", "--namespace", "ns-a")
    assert failed.id not in durable("list", "--tag", "vip")
    assert done.id in durable("list", "--attr", "amount:gte:5")
    assert durable("list", "--attr", "amount:gt:5").strip() == "No runs match."
    assert len(durable("list", "--limit", "1").splitlines()) == 3


@pytest.mark.parametrize("args", [
    ["list", "--status", "sleeping"],
    ["list", "--attr", "amount:gt:many"],
    ["list", "--limit", "0"],
    ["show", "missing"],
    ["start", "no.such.workflow"],
    ["start", "tests.sequence", "--input", "{not json"],
    ["signal", "missing", "approve"],
    ["cancel", "missing"],
    ["retry", "missing"],
    ["purge", "--status", "running"],
])
def test_bad_input_is_a_clear_command_error(args):
    with pytest.raises(CommandError) as excinfo:
        durable(*args)
    assert str(excinfo.value)


def test_show_prints_payloads_attributes_and_the_timeline():
    run = run_until_settled(run_start(workflow="tests.values", input={"customer": "acme", "amount": 5}).id)
    output = durable("show", run.id)
    assert f"id                 {run.id}" in output
    assert '"customer": "acme"' in output
    assert "attributes:" in output and "amount" in output
    assert "SEQ" in output and "set_attributes" in output and "OUTPUT" not in output
    with_payloads = durable("show", run.id, "--payloads")
    assert "OUTPUT" in with_payloads and '["amount", "customer"]' in with_payloads


def test_show_survives_an_undecodable_payload():
    run = run_until_settled(run_start(workflow="tests.sequence", input={}).id)
    with connection.cursor() as cursor:
        cursor.execute("UPDATE durable_durablerun SET output = 'garbage{' WHERE id = %s", [run.id])
    assert "output:\n(undecodable)" in durable("show", run.id, "--payloads")


def test_start_signal_cancel_and_retry():
    output = durable("start", "tests.signal", "--input", "{}", "--namespace", "ns-x", "--id", "cli-1")
    assert output.split() == ["cli-1", "tests.signal", "pending"]
    assert DurableRun.objects.get(pk="cli-1").namespace == "ns-x"
    assert "buffered" in durable("signal", "cli-1", "approve", "--payload", json.dumps({"ok": 1}))
    assert run_until_settled("cli-1").status == "completed"
    with pytest.raises(CommandError, match="signals reach active runs only"):
        durable("signal", "cli-1", "approve")
    with pytest.raises(CommandError, match="completed; only pending, running or suspended"):
        durable("cancel", "cli-1")
    with pytest.raises(CommandError, match="completed; only failed, cancelled or dead"):
        durable("retry", "cli-1")

    durable("start", "tests.signal", "--id", "cli-2", "--input", "{}")
    assert run_until_settled("cli-2").status == "suspended"
    assert "delivered" in durable("signal", "cli-2", "approve")
    durable("start", "tests.signal", "--id", "cli-3", "--input", "{}")
    assert durable("cancel", "cli-3").strip() == "cancelled cli-3"
    assert DurableRun.objects.get(pk="cli-3").status == "cancelled"
    assert "with new input" in durable("retry", "cli-3", "--input", '{"timeout": 1}')
    assert DurableRun.objects.get(pk="cli-3").status == "pending"


def test_purge_is_a_dry_run_without_yes_and_leaves_active_runs():
    old = timezone.now() - timedelta(days=10)
    for run_id, status in [("old-done", "completed"), ("old-failed", "failed"), ("old-active", "suspended"),
                           ("new-done", "completed")]:
        DurableRun.objects.create(id=run_id, workflow="tests.sequence", status=status)
        StepCheckpoint.objects.create(run_id=run_id, seq=0, name="s")
    DurableRun.objects.filter(id__startswith="old").update(ended_at=old)
    DurableRun.objects.filter(pk="new-done").update(ended_at=timezone.now())

    dry = durable("purge", "--older-than-days", "7")
    assert "2 runs would be deleted" in dry
    assert DurableRun.objects.count() == 4
    assert durable("purge", "--older-than-days", "7", "--status", "completed", "--yes").strip() == "deleted 1 runs"
    assert not DurableRun.objects.filter(pk="old-done").exists()
    assert not StepCheckpoint.objects.filter(run_id="old-done").exists()
    assert durable("purge", "--yes").strip() == "deleted 2 runs"
    assert list(DurableRun.objects.values_list("id", flat=True)) == ["old-active"]


def test_the_demo_digest_starts_without_input_and_completes():
    """The README's first example: `durable start durable.demo.digest`, no --input (a null input)."""
    run_id = durable("start", "durable.demo.digest").split()[0]
    run = run_until_settled(run_id, max_wait=10)
    assert run.status == "completed", run.error
    assert decode(run.output)["words"] == 8  # the two default texts


def test_the_demo_digest_names_the_input_field_it_refuses():
    run = run_until_settled(durable("start", "durable.demo.digest", "--input", '{"texts": "one text"}').split()[0])
    assert run.status == "failed" and "texts" in json.dumps(decode(run.error))
