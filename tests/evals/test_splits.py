"""Train / validation / test splits of golden items (evals/splits.py): dealt when an item is written,
deterministic, stratified by the first tag, stable when items are added, at least three items a split once
a set is big enough; the plan that says whether a set can carry a held-out claim; the migration that dealt
the items that existed before splits."""

import importlib
import threading
from collections import Counter

import pytest
from django.apps import apps
from django.db import connection, transaction

from evals.importing import read_objects
from evals.models import GoldenItem
from evals.selectors import split_items, split_plan
from evals.services import EvalError, golden_item_add, golden_items_deal_splits, golden_items_import, golden_set_create
from tests.durable.concurrency import in_thread, wait_until
from tests.factories import WorkspaceFactory

pytestmark = pytest.mark.django_db


def make_set(workspace, name="splits", items=(), **kwargs):
    golden = golden_set_create(workspace=workspace, name=name, graders=[{"kind": "contains"}], **kwargs)
    for index, tags in enumerate(items):
        golden_item_add(golden_set=golden, input={"text": f"question {index}"}, expected_output=f"answer {index}",
                        tags=list(tags), metadata={"key": f"item-{index}"})
    return golden


def splits_of(golden) -> list[str]:
    return list(golden.items.order_by("position", "pk").values_list("split", flat=True))


def counts(golden, **among) -> dict[str, int]:
    found = Counter(golden.items.filter(**among).values_list("split", flat=True))
    return {split: found[split] for split in ("train", "validation", "test")}


TOPICS = [["durable"], ["signals"], ["knowledge", "critical"], ["costs"]] * 8  # 32 items, 4 strata of 8


def test_every_item_gets_a_split_in_the_proportions_and_the_same_set_gets_the_same_splits(workspace):
    ours = make_set(workspace, items=TOPICS)
    theirs = make_set(WorkspaceFactory(), items=TOPICS)  # the same set elsewhere: seeded by its name
    assert counts(ours) == {"train": 16, "validation": 8, "test": 8}
    assert splits_of(ours) == splits_of(theirs)
    other = make_set(workspace, name="another name", items=TOPICS)
    assert counts(other) == counts(ours) and splits_of(other) != splits_of(ours)  # another seed, the same shares


def test_splits_are_stratified_by_the_first_tag(workspace):
    golden = make_set(workspace, items=[["durable"]] * 12 + [["signals", "critical"]] * 12 + [[]] * 8)
    assert counts(golden, tags__0="durable") == {"train": 6, "validation": 3, "test": 3}
    assert counts(golden, tags__0="signals") == {"train": 6, "validation": 3, "test": 3}
    untagged = counts(golden, tags=[])
    assert untagged == {"train": 4, "validation": 2, "test": 2}
    plan = split_plan(golden)
    assert plan.strata["durable"] == plan.strata["signals"] == {"train": 6, "validation": 3, "test": 3}
    assert plan.strata[""] == untagged


def test_adding_items_never_moves_the_splits_of_the_items_there(workspace):
    golden = make_set(workspace, items=TOPICS[:20])
    before = dict(golden.items.values_list("pk", "split"))
    golden_item_add(golden_set=golden, input={"text": "one more"}, expected_output="yes", tags=["durable"])
    lines = read_objects([{"input": f"imported {i}", "tags": TOPICS[i]} for i in range(11)])
    created, errors = golden_items_import(golden_set=golden, items=lines)
    assert len(created) == 11 and not errors
    after = dict(golden.items.values_list("pk", "split"))
    assert {pk: after[pk] for pk in before} == before
    assert counts(golden) == {"train": 16, "validation": 8, "test": 8}


def test_an_operators_split_is_kept_and_new_items_are_dealt_around_it(workspace):
    golden = make_set(workspace, items=[["durable"]] * 12)
    moved = golden.items.filter(split="train").order_by("position").first()
    moved.split = "test"
    moved.save(update_fields=["split", "updated_at"])
    assert counts(golden) == {"train": 5, "validation": 3, "test": 4}
    for index in range(4):
        golden_item_add(golden_set=golden, input={"text": f"new {index}"}, tags=["durable"])
    moved.refresh_from_db()
    assert moved.split == "test"
    assert counts(golden) == {"train": 8, "validation": 4, "test": 4}  # the new ones made up for the move


def test_a_set_of_the_minimum_size_has_three_items_in_each_split_whatever_the_shares(workspace, settings):
    settings.EVAL_SPLIT_PROPORTIONS = (0.8, 0.1, 0.1)
    golden = make_set(workspace, items=[["durable"]] * 11)
    assert split_plan(golden).held_out is False
    golden_item_add(golden_set=golden, input={"text": "the twelfth"}, tags=["durable"])
    assert counts(golden) == {"train": 6, "validation": 3, "test": 3}
    assert split_plan(golden).held_out is True
    for index in range(8):
        golden_item_add(golden_set=golden, input={"text": f"more {index}"}, tags=["durable"])
    assert counts(golden) == {"train": 14, "validation": 3, "test": 3}  # past the minimum, the shares again


def test_a_set_too_small_to_split_says_no_held_out_claim_is_possible_and_why(workspace, settings):
    golden = make_set(workspace, items=TOPICS[:7])
    plan = split_plan(golden)
    assert plan.total == 7 and sum(plan.counts.values()) == 7
    assert plan.held_out is False
    assert plan.reason.startswith("The set has 7 items: a held-out split needs at least 12 (EVAL_MIN_SPLIT_ITEMS)")
    settings.EVAL_MIN_SPLIT_ITEMS = 20
    bigger = make_set(workspace, name="bigger", items=TOPICS[:16])
    assert "at least 20" in split_plan(bigger).reason

    settings.EVAL_MIN_SPLIT_ITEMS = 12
    assert split_plan(bigger).held_out is True and split_plan(bigger).reason == ""
    # an operator moved test items away: the test split is too small to report on
    tests = list(bigger.items.filter(split="test").order_by("position").values_list("pk", flat=True))
    GoldenItem.objects.filter(pk__in=tests[:-2]).update(split="train")
    plan = split_plan(bigger)
    assert plan.held_out is False and plan.counts["test"] == 2
    assert plan.reason == "the test split has 2 items: each split needs at least 3. Move items to it, or add items."


def test_a_split_given_is_kept_and_a_bad_one_is_refused_naming_the_field(workspace):
    golden = make_set(workspace)
    item = golden_item_add(golden_set=golden, input={"text": "held out"}, split="test")
    assert item.split == "test"
    with pytest.raises(EvalError) as refused:
        golden_item_add(golden_set=golden, input={"text": "q"}, split="holdout")
    assert refused.value.errors == {"split": ["must be one of train, validation, test (or empty: dealt by the item's "
                                              "first tag)"]}
    assert split_items(golden) == {"train": [], "validation": [], "test": [item.pk]}


def test_the_migration_deals_existing_items_as_adding_them_one_by_one_does(workspace):
    migration = importlib.import_module("evals.migrations.0003_golden_item_split")
    first = make_set(workspace, items=TOPICS)
    second = make_set(workspace, name="second", items=[["durable"]] * 5 + [["signals"]] * 9)
    dealt = {golden.pk: splits_of(golden) for golden in (first, second)}
    GoldenItem.objects.update(split="train")  # as the schema change left them
    migration.deal_splits(apps, None)
    assert {golden.pk: splits_of(golden) for golden in (first, second)} == dealt


@pytest.mark.django_db(transaction=True)
def test_two_writers_dealing_at_once_deal_one_after_the_other(workspace):
    """The admin saves its new inline items through golden_items_deal_splits in its own transaction: a second
    writer waits for the first to commit and counts its item, instead of dealing the same split twice."""
    golden = make_set(workspace, items=[["durable"]] * 2)  # train, then validation or test
    dealt, release = threading.Event(), threading.Event()

    def write(text, *, hold):
        with transaction.atomic():
            item = GoldenItem(golden_set=golden, input={"text": text}, tags=["durable"], position=10)
            golden_items_deal_splits(golden_set=golden, items=[item])
            if hold:
                dealt.set()
                release.wait(30)
            item.save()
        return item.split

    first, first_outcome = in_thread(lambda: write("first", hold=True))
    assert dealt.wait(30)
    second, second_outcome = in_thread(lambda: write("second", hold=False))
    try:
        wait_until(lambda: waiting_on_a_lock() == 1)  # the second writer waits for the set's row
    finally:
        release.set()
    first.join(30)
    second.join(30)
    assert "value" in first_outcome and "value" in second_outcome, (first_outcome, second_outcome)
    assert counts(golden) == {"train": 2, "validation": 1, "test": 1}


def waiting_on_a_lock() -> int:
    with connection.cursor() as cursor:
        cursor.execute("SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                       "AND wait_event_type = 'Lock'")
        return cursor.fetchone()[0]
