"""Train / validation / test splits of a golden set's items: the rule that deals them, and the plan that says
whether a set's splits can carry a held-out claim.

Plain data in, plain data out (no ORM): `services` deals the splits of new items, `selectors.split_plan` reads a
set's plan, and the migration that introduced splits dealt the existing items with the same `SplitDealer`.

The rule:

- An item's stratum is its first tag ("" when it has none): the tags an evaluator puts first (the topic, or
  "critical") are spread over the three splits in proportion, not left to chance.
- Proportions: EVAL_SPLIT_PROPORTIONS (train, validation, test; default 50/25/25).
- Items are dealt one at a time, in the set's order (position, then id). Each goes to the split with the largest
  shortfall against the proportions, counted in its stratum and in the whole set together:
  ``p[s] * (stratum size) - stratum count[s] + p[s] * (set size) - set count[s]``, sizes counting the item.
  Ties go to the split that ranks first by a hash of the set's seed (its name), the item's key (its
  `metadata["key"]`, else its content hash) and the split's name.
- Minimum: a set of EVAL_MIN_SPLIT_ITEMS (12) items or more has at least MIN_PER_SPLIT (3) items in each split.
  Once the items still to come before the set reaches that size are no more than the splits' shortfall, an item
  goes to a split that is short.
- An item's split never changes once it is dealt (an operator may change it by hand): a new item is dealt after
  the items there, whatever their splits are now, so adding items never reshuffles the existing ones, and a
  set built item by item holds the splits a dealing of the whole set gives.
"""

from __future__ import annotations

import hashlib
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

TRAIN, VALIDATION, TEST = "train", "validation", "test"
SPLITS = (TRAIN, VALIDATION, TEST)
MIN_PER_SPLIT = 3  # a split of fewer items is no evidence of anything


def stratum_of(tags) -> str:
    """An item's stratum: its first tag ("" without tags)."""
    if isinstance(tags, list | tuple) and tags and isinstance(tags[0], str):
        return tags[0]
    return ""


def item_key(metadata, content_hash: str) -> str:
    """What ties between splits are broken on: the item's seeded key, else its contents."""
    if isinstance(metadata, dict) and isinstance(metadata.get("key"), str) and metadata["key"]:
        return metadata["key"]
    return content_hash


def _rank(seed: str, key: str, split: str) -> bytes:
    return hashlib.sha256(f"{seed}\x00{key}\x00{split}".encode()).digest()


@dataclass
class SplitDealer:
    """Deals splits to a set's new items, after the items it was told of (`seen`)."""

    seed: str
    proportions: Sequence[float]  # train, validation, test; positive, summing to 1
    min_items: int
    totals: Counter = field(default_factory=Counter)
    strata: dict[str, Counter] = field(default_factory=dict)

    def seen(self, stratum: str, split: str) -> None:
        """Count an item that already has its split."""
        self.totals[split] += 1
        self.strata.setdefault(stratum, Counter())[split] += 1

    def deal(self, stratum: str, key: str) -> str:
        """The split of the next item, counted in."""
        counts = self.strata.setdefault(stratum, Counter())
        size, total = sum(counts.values()) + 1, sum(self.totals.values()) + 1
        short = [s for s in SPLITS if self.totals[s] < MIN_PER_SPLIT]
        shortfall = sum(MIN_PER_SPLIT - self.totals[s] for s in short)
        # this item and those still to come before the set reaches min_items: no more than the shortfall
        candidates = short if short and self.min_items - total + 1 <= shortfall else SPLITS

        def priority(split: str):
            share = dict(zip(SPLITS, self.proportions, strict=True))[split]
            gap = share * size - counts[split] + share * total - self.totals[split]
            return round(gap, 9), _rank(self.seed, key, split)

        split = max(candidates, key=priority)
        self.seen(stratum, split)
        return split


def dealer(*, seed: str, proportions: Sequence[float], min_items: int,
           existing: Iterable[tuple[str, str]] = ()) -> SplitDealer:
    """A dealer for a set whose items so far are `existing` ((stratum, split) pairs)."""
    deal = SplitDealer(seed=seed, proportions=tuple(proportions), min_items=min_items)
    for stratum, split in existing:
        deal.seen(stratum, split)
    return deal


# ------------------------------------------------------------------------------------------------ plan

@dataclass(frozen=True)
class SplitPlan:
    """A set's items per split, and whether they can carry a held-out claim (`held_out`; `reason` says why not)."""

    counts: dict[str, int]
    total: int
    held_out: bool
    reason: str
    min_items: int
    min_per_split: int
    proportions: dict[str, float]
    strata: dict[str, dict[str, int]] = field(default_factory=dict)  # first tag -> counts (when read)

    def as_dict(self) -> dict:
        return {"held_out": self.held_out, "reason": self.reason, "total": self.total, "counts": self.counts,
                "min_items": self.min_items, "min_per_split": self.min_per_split, "proportions": self.proportions,
                "strata": self.strata}


def plan(counts: Mapping[str, int], *, proportions: Sequence[float], min_items: int,
         strata: Mapping[str, Mapping[str, int]] | None = None) -> SplitPlan:
    """The plan of a set holding `counts` items per split."""
    counts = {split: int(counts.get(split) or 0) for split in SPLITS}
    total = sum(counts.values())
    reason = ""
    if total < min_items:
        reason = (f"The set has {total} item{'s' if total != 1 else ''}: a held-out split needs at least "
                  f"{min_items} (EVAL_MIN_SPLIT_ITEMS). Add items, or score the whole set without a held-out claim.")
    else:
        few = [split for split in SPLITS if counts[split] < MIN_PER_SPLIT]
        if few:
            reason = ("; ".join(f"the {split} split has {counts[split]} item{'s' if counts[split] != 1 else ''}"
                                for split in few)
                      + f": each split needs at least {MIN_PER_SPLIT}. Move items to it, or add items.")
    return SplitPlan(counts=counts, total=total, held_out=not reason, reason=reason, min_items=min_items,
                     min_per_split=MIN_PER_SPLIT, proportions=dict(zip(SPLITS, proportions, strict=True)),
                     strata={name: {split: int(row.get(split) or 0) for split in SPLITS}
                             for name, row in sorted((strata or {}).items())})
