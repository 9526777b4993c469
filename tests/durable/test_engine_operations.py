import threading
from datetime import timedelta

import pytest
from cryptography.fernet import Fernet
from django.utils import timezone

from durable import codec, retention, steps, store, tick, turns
from durable.codec import decode
from durable.inprocess import run_until_settled
from durable.models import DurableRun, Schedule, StepCheckpoint
from durable.schedules import run_id_for
from durable.services import run_cancel, run_retry, run_start, schedule_save
from tests.durable.concurrency import in_thread

pytestmark = pytest.mark.django_db


def test_cancel_is_final_even_for_a_turn_in_flight():
    run = run_start(workflow="tests.signal", input={})
    cursor = store.raw_cursor()
    cursor.execute(store.CLAIM_SQL, ("late-worker", 30.0, run.id))
    assert cursor.fetchone() is not None
    assert run_cancel(run_id=run.id) is True
    # the late turn finishes: its compare-and-set finds the run cancelled and changes nothing
    assert turns._finish(run.id, "late-worker", "completed", output=1, encoded_output="1").outcome == "lease_lost"
    assert turns._release(run.id, "late-worker", None).outcome == "lease_lost"
    assert DurableRun.objects.get(pk=run.id).status == "cancelled"
    assert run_cancel(run_id=run.id) is False


def test_cancel_cascades_to_children():
    run = run_start(workflow="tests.parent_of_waiting", input={})
    turns.execute_turn(run.id)  # starts the child (whose first turn waits for a signal) and suspends
    child = DurableRun.objects.get(parent=run)
    assert child.status == "suspended"
    run_cancel(run_id=run.id)
    assert DurableRun.objects.get(pk=child.pk).status == "cancelled"


def test_retry_resumes_after_the_last_completed_step(tmp_path):
    counter = tmp_path / "count"
    run = run_until_settled(run_start(workflow="tests.retrying", input={
        "counter": str(counter), "failures": 1, "retries": 0}).id)
    assert run.status == "failed"
    assert run_retry(run_id=run.id) is True
    run = run_until_settled(run.id)
    assert run.status == "completed"
    assert decode(run.output) == 2
    assert run_retry(run_id=run.id) is False  # completed runs are not retryable


def test_retry_with_new_input_starts_over():
    run = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 2}).id)
    DurableRun.objects.filter(pk=run.id).update(status="failed")
    assert run_retry(run_id=run.id, input={"steps": 4}, new_input=True)
    run = run_until_settled(run.id)
    assert decode(run.output) == {"total": 6}
    assert StepCheckpoint.objects.filter(run=run).count() == 4


@pytest.mark.django_db
def test_a_plain_retry_of_a_fan_with_a_failed_item_reruns_the_failed_item(tmp_path):
    """Retry deletes the failed item's checkpoint and keeps the completed one; the replay re-runs only
    the failed item. Earlier: the replay found a fan with 1 checkpoint for 2 items and failed with a
    non-determinism error, every time."""
    run = run_until_settled(run_start(workflow="tests.fan_flaky", input={"counter": str(tmp_path / "n")}).id)
    assert run.status == "failed"
    assert run_retry(run_id=run.id)
    run = run_until_settled(run.id)
    assert run.status == "completed", decode(run.error)["message"]
    assert decode(run.output) == [1, 1]


@pytest.mark.django_db
def test_a_plain_retry_of_a_fail_fast_fan_whose_child_now_succeeds_completes(tmp_path):
    """The failed child is re-run and now succeeds: the retried run completes. Earlier: the fail_fast
    record (a completed 'value' checkpoint) survived the retry and the replay refused it as
    non-deterministic."""
    run = run_until_settled(run_start(workflow="tests.fail_fast_one_child",
                                      input={"counter": str(tmp_path / "n")}).id)
    assert run.status == "failed"
    assert run_retry(run_id=run.id)
    run = run_until_settled(run.id)
    assert run.status == "completed", decode(run.error)["message"]
    assert decode(run.output) == [1]


@pytest.mark.django_db
def test_a_plain_retry_replays_a_handled_failure_that_now_succeeds(tmp_path):
    """A step whose failure was handled (a fallback branch) succeeds on the retry: the code takes the
    other branch and the run completes. Earlier: retry kept the completed fallback recorded *after*
    the dropped failed step, the new branch met the fallback's checkpoint, a non-determinism error,
    and every further retry failed the same way."""
    run = run_until_settled(run_start(workflow="tests.fallback_then_fail",
                                      input={"counter": str(tmp_path / "a"), "counter2": str(tmp_path / "b")}).id)
    assert run.status == "failed"
    assert run_retry(run_id=run.id)
    run = run_until_settled(run.id)
    assert run.status == "completed", decode(run.error)["message"]


def test_expired_leases_are_recovered_then_declared_dead(settings):
    settings.DURABLE_MAX_RECOVERY_ATTEMPTS = 1
    run = run_start(workflow="tests.signal", input={})
    for expected in ("suspended", "dead"):
        cursor = store.raw_cursor()
        cursor.execute(store.CLAIM_SQL, ("crashed-worker", 30.0, run.id))
        DurableRun.objects.filter(pk=run.id).update(locked_until=timezone.now() - timedelta(seconds=1))
        assert tick.recover_expired_leases() == 1
        run = DurableRun.objects.get(pk=run.id)
        assert run.status == expected
    assert run.recovery_attempts == 2
    assert decode(run.error)["type"] == "RecoveryExhausted"


def test_silent_step_times_out_and_goes_back_to_pending():
    run = run_start(workflow="tests.heartbeat", input={"seconds": 0.1, "timeout": 5})
    turns.execute_turn(run.id)
    store.steps_claim(run.id, [0], 5.0)  # a worker claimed the step, then went silent
    StepCheckpoint.objects.filter(run=run, seq=0).update(timeout_at=timezone.now() - timedelta(seconds=1))
    assert tick.time_out_silent_steps() == 1
    step = StepCheckpoint.objects.get(run=run, seq=0)
    assert step.status == "pending" and step.options["timeouts"] == 1
    assert run_until_settled(run.id).status == "completed"


def test_heartbeats_are_persisted_with_progress():
    run = run_until_settled(run_start(workflow="tests.heartbeat", input={"seconds": 0.5, "timeout": 0.6}).id)
    assert run.status == "completed"
    step = StepCheckpoint.objects.get(run=run, seq=0)
    assert step.last_heartbeat_at is not None and decode(step.heartbeat_progress)["left"] >= 0


def test_a_step_that_waits_alive_heartbeats_through_its_wait(settings):
    settings.DURABLE_HEARTBEAT_PERSIST_SECONDS = 0.2
    run = run_until_settled(run_start(workflow="tests.wait_alive", input={"seconds": 1.0, "timeout": 0.6}).id)
    assert run.status == "completed"
    step = StepCheckpoint.objects.get(run=run, seq=0)
    # the wait outlasted the step's allowed silence: its heartbeats went on through it (the last one after
    # at least half the wait, which a single heartbeat at its start would not be)
    assert step.attempt == 1 and step.last_heartbeat_at - step.started_at >= timedelta(seconds=0.5)


def test_schedule_fires_each_window_once():
    schedule = schedule_save(key="nightly", workflow="tests.sequence", input={"steps": 1}, every_seconds=60,
                             catchup_limit=3)
    Schedule.objects.filter(pk=schedule.pk).update(created_at=timezone.now() - timedelta(minutes=10),
                                                   next_fire_at=timezone.now() - timedelta(minutes=9))
    assert tick.fire_due_schedules() == 3  # bounded catch-up: the 3 newest missed windows
    assert tick.fire_due_schedules() == 0
    ids = sorted(DurableRun.objects.filter(workflow="tests.sequence").values_list("id", flat=True))
    assert len(ids) == 3 and all(run_id.startswith("sched:default:nightly:") for run_id in ids)
    schedule.refresh_from_db()
    assert schedule.next_fire_at > timezone.now()


def test_paused_schedule_and_overlap_skip():
    schedule = schedule_save(key="hourly", workflow="tests.signal", every_seconds=3600, overlap="skip")
    Schedule.objects.filter(pk=schedule.pk).update(created_at=timezone.now() - timedelta(hours=3),
                                                   next_fire_at=timezone.now() - timedelta(hours=2), paused=True)
    assert tick.fire_due_schedules() == 0
    Schedule.objects.filter(pk=schedule.pk).update(paused=False, catchup_limit=2)
    # the first window's run is still waiting for its signal: the second window is skipped
    assert tick.fire_due_schedules() == 1


def test_cron_schedule_in_a_time_zone():
    from durable.schedules import next_window

    schedule = schedule_save(key="morning", workflow="tests.sequence", cron="0 8 * * *", timezone_name="Europe/Paris")
    window = next_window(schedule, after=timezone.now())
    assert window.astimezone(__import__("zoneinfo").ZoneInfo("Europe/Paris")).hour == 8


def test_schedule_validation_names_the_field():
    from django.core.exceptions import ValidationError

    with pytest.raises(ValidationError) as error:
        schedule_save(key="bad", workflow="tests.sequence", cron="every day")
    assert "cron" in error.value.message_dict


def test_retention_deletes_old_terminal_runs_and_never_active_ones(settings):
    old = timezone.now() - timedelta(days=40)
    done = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 2}).id)
    waiting = run_until_settled(run_start(workflow="tests.signal", input={}).id)
    DurableRun.objects.filter(pk__in=[done.pk, waiting.pk]).update(ended_at=old, created_at=old)
    deleted = retention.apply_policy({"statuses": ["completed"], "max_age_days": 30})
    assert deleted == 1
    assert not DurableRun.objects.filter(pk=done.pk).exists()
    assert not StepCheckpoint.objects.filter(run_id=done.pk).exists()
    assert DurableRun.objects.get(pk=waiting.pk).status == "suspended"
    assert retention.delete_runs([waiting.pk]) == 0


def test_retention_max_count_keeps_the_newest():
    ids = [run_until_settled(run_start(workflow="tests.sequence", input={"steps": 1}).id).pk for _ in range(4)]
    assert retention.apply_policy({"statuses": ["completed"], "max_count": 2}) == 2
    assert set(DurableRun.objects.values_list("id", flat=True)) == set(ids[2:])


def test_payloads_encrypted_at_rest(settings):
    settings.DURABLE_PAYLOAD_KEYS = [Fernet.generate_key().decode()]
    run = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 2, "secret": "s3cr3t"}).id)
    stored = DurableRun.objects.get(pk=run.id)
    assert stored.input.startswith("enc1:") and "s3cr3t" not in stored.input
    assert decode(stored.output) == {"total": 1}
    assert all(cp.output.startswith("enc1:") for cp in StepCheckpoint.objects.filter(run=run))


def test_undecodable_payload_reads_as_missing_and_is_reported_once():
    reports = []
    previous = codec.on_corrupt_payload(reports.append)
    try:
        assert decode("{not json", column="run.output", row="r1") is None
        assert decode("{not json", column="run.output", row="r1") is None
        assert decode("enc1:garbage", column="run.input", row="r2") is None
    finally:
        codec.on_corrupt_payload(previous)
    assert [(r.column, r.row) for r in reports] == [("run.output", "r1"), ("run.input", "r2")]


def test_a_corrupt_checkpoint_does_not_break_other_runs():
    broken = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 2}).id)
    StepCheckpoint.objects.filter(run=broken, seq=0).update(output="{corrupt")
    healthy = run_until_settled(run_start(workflow="tests.sequence", input={"steps": 2}).id)
    assert healthy.status == "completed"


@pytest.mark.django_db(transaction=True)
def test_two_workers_racing_never_double_settle():
    run = run_start(workflow="tests.fan", input={"n": 60})
    turns.execute_turn(run.id)
    workers = [in_thread(steps.execute_steps, run.id, list(range(60))) for _ in range(3)]
    for thread, _ in workers:
        thread.join(30)
    assert not any(thread.is_alive() for thread, _ in workers)
    assert [outcome.get("error") for _, outcome in workers] == [None] * 3
    results = [outcome["value"] for _, outcome in workers]
    assert sum(result["claimed"] for result in results) == 60
    assert sum(result["settled"] for result in results) == 60
    assert StepCheckpoint.objects.filter(run=run, status="completed").count() == 60
    assert run_until_settled(run.id).status == "completed"


@pytest.mark.django_db(transaction=True)
def test_racing_ticks_start_each_schedule_window_once():
    schedule = schedule_save(key="race", workflow="tests.sequence", input={"steps": 1}, every_seconds=30,
                             catchup_limit=5)
    Schedule.objects.filter(pk=schedule.pk).update(created_at=timezone.now() - timedelta(minutes=2),
                                                   next_fire_at=timezone.now() - timedelta(minutes=2))
    from durable.schedules import due_windows

    expected = len(due_windows(Schedule.objects.get(pk=schedule.pk), now=timezone.now()))
    barrier = threading.Barrier(4)

    def racing_tick():
        barrier.wait(10)
        return tick.fire_due_schedules()

    ticks = [in_thread(racing_tick) for _ in range(4)]
    for thread, _ in ticks:
        thread.join(30)
    assert not any(thread.is_alive() for thread, _ in ticks)
    assert [outcome.get("error") for _, outcome in ticks] == [None] * 4
    ids = list(DurableRun.objects.filter(id__startswith="sched:default:race:").values_list("id", flat=True))
    assert len(ids) == len(set(ids)) == expected >= 4
    assert sum(outcome["value"] for _, outcome in ticks) == expected  # each window counted by one tick


def test_lost_turn_messages_are_sent_again(settings):
    settings.DURABLE_REDISPATCH_AFTER_SECONDS = 0
    run = run_start(workflow="tests.sequence", input={"steps": 1})  # its message went nowhere (dispatch is off)
    DurableRun.objects.filter(pk=run.id).update(dispatched_at=timezone.now() - timedelta(seconds=5))
    assert tick.redispatch_lost_wakes() == 1
    assert DurableRun.objects.get(pk=run.id).wake_pending is True


def test_due_step_retries_and_unclaimed_steps_are_dispatched_again():
    run = run_start(workflow="tests.queued")
    turns.execute_turn(run.id)
    StepCheckpoint.objects.filter(run=run, seq=0).update(wake_at=timezone.now() - timedelta(seconds=1))
    assert tick.dispatch_due_steps() == 1
    step = StepCheckpoint.objects.get(run=run, seq=0)
    assert step.status == "pending" and step.wake_at > timezone.now()  # re-armed for the next check


def test_the_tick_runs_every_phase_and_reports_each():
    report = tick.tick()
    assert set(report) == {phase.__name__ for phase in tick.PHASES}
    assert all(isinstance(value, int) for value in report.values()), report


def test_demo_digest_workflow(settings):
    run = run_start(workflow="durable.demo.digest", input={"texts": ["a b", "c"], "pause_seconds": 0.05})
    run = run_until_settled(run.id)
    assert run.status == "completed", run.error
    output = decode(run.output)
    assert output["words"] == 3 and len(output["checksums"]) == 2


def test_a_run_id_of_another_namespace_is_refused():
    from durable.errors import RunIdConflict

    run_start(workflow="tests.sequence", input={"steps": 1}, run_id="shared-id", namespace="ws-1")
    with pytest.raises(RunIdConflict):
        run_start(workflow="tests.sequence", input={"steps": 1}, run_id="shared-id", namespace="ws-2")


def test_schedule_keys_are_per_namespace_and_name_their_runs_apart():
    ours = schedule_save(key="nightly-a", workflow="tests.sequence", every_seconds=60, namespace="ws-1")
    theirs = schedule_save(key="nightly-a", workflow="tests.fan", every_seconds=120, namespace="ws-2")
    assert ours.pk != theirs.pk
    assert Schedule.objects.get(key="nightly-a", namespace="ws-1").workflow == "tests.sequence"
    window = timezone.now().replace(microsecond=0)
    assert run_id_for(ours, window) != run_id_for(theirs, window)


def test_cancel_with_compensation_starts_the_compensating_workflow():
    run = run_until_settled(run_start(workflow="tests.compensated", input={"order": 9}).id)
    assert run_cancel(run_id=run.id, compensate=True)
    undo = run_until_settled(f"{run.id}:compensate")
    assert undo.status == "completed"
    assert decode(undo.output) == {"undid": run.id, "original_input": {"order": 9}}


def test_a_step_waiting_alive_stops_when_its_run_is_cancelled():
    from tests.durable.workflows import WAITED_TO_THE_END

    run = run_until_settled(run_start(workflow="tests.cancelled_while_waiting", input={"seconds": 5.0}).id)
    assert run.status == "cancelled"
    # the wait ended at the heartbeat that found the step cancelled: the step's code after it never ran, and
    # nothing of it was saved over the cancelled checkpoint
    assert run.id not in WAITED_TO_THE_END
    step = StepCheckpoint.objects.get(run=run, seq=0)
    assert step.status == "cancelled" and step.output == ""


def test_a_heartbeat_of_a_step_handed_to_another_worker_stops_it(settings):
    from durable import heartbeat
    from durable.errors import StepAbandoned
    from durable.steps import _current_step, _StepScope

    run = run_start(workflow="tests.heartbeat", input={"seconds": 0.1, "timeout": 5})
    turns.execute_turn(run.id)
    step = StepCheckpoint.objects.get(run=run, seq=0)
    claimed = store.steps_claim(run.id, [0], 5.0)
    assert claimed
    # its clock ran out and the tick gave it back (pending, for another worker): this worker's attempt is over
    StepCheckpoint.objects.filter(pk=step.pk).update(status="pending")
    token = _current_step.set(_StepScope(step.pk, claimed[0][5], 5.0))
    try:
        with pytest.raises(StepAbandoned, match="no longer"):
            heartbeat({"left": 1})
    finally:
        _current_step.reset(token)
