"""`make run`'s terminal: the 1 s tick logs at INFO only when it did something (finding: three INFO
lines a second). Records are emitted the way Celery emits them, on Celery's own loggers."""

import logging

from celery.app.trace import LOG_RECEIVED, LOG_SUCCESS


def _emit(logger_name, msg, *args):
    logging.getLogger(logger_name).info(msg, *args)


def test_an_idle_tick_is_debug_and_a_busy_one_info(caplog):
    caplog.set_level(logging.INFO)
    idle = "{'recover_expired_leases': 0, 'resume_due_timers': 0, 'fire_due_schedules': 0}"
    busy = "{'recover_expired_leases': 0, 'resume_due_timers': 3, 'fire_due_schedules': 0}"
    failed = "{'resume_due_timers': 'error: OperationalError: gone'}"
    _emit("celery.beat", "Scheduler: Sending due task %s (%s)", "durable-tick", "durable.tick")
    _emit("celery.worker.strategy", LOG_RECEIVED, {"name": "durable.tick", "id": "1"})
    _emit("celery.app.trace", LOG_SUCCESS, {"name": "durable.tick", "id": "1", "runtime": 0.01,
                                            "return_value": idle})
    assert caplog.records == []
    _emit("celery.app.trace", LOG_SUCCESS, {"name": "durable.tick", "id": "2", "runtime": 0.01,
                                            "return_value": busy})
    _emit("celery.app.trace", LOG_SUCCESS, {"name": "durable.tick", "id": "3", "runtime": 0.01,
                                            "return_value": failed})
    assert [r.getMessage().split(" succeeded")[0] for r in caplog.records] == \
        ["Task durable.tick[2]", "Task durable.tick[3]"]


def test_other_tasks_still_log_at_info_and_debug_shows_the_tick(caplog):
    caplog.set_level(logging.DEBUG)
    _emit("celery.worker.strategy", LOG_RECEIVED, {"name": "durable.run_turn", "id": "9"})
    _emit("celery.worker.strategy", LOG_RECEIVED, {"name": "durable.tick", "id": "1"})
    assert [(r.levelname, r.getMessage()) for r in caplog.records] == [
        ("INFO", "Task durable.run_turn[9] received"), ("DEBUG", "Task durable.tick[1] received")]
