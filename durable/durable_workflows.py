"""A small built-in workflow that shows the engine at work in the demo (steps, a fan, a sleep)."""

import hashlib

from durable.engine import Step
from durable.registry import workflow


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def word_count(text: str) -> int:
    return len(text.split())


@workflow("durable.demo.digest", api=True)
def digest(ctx, input):
    """Checksum and count words of a few texts in parallel, pause, then summarise."""
    texts = input.get("texts") or ["durable runs survive crashes", "every step is checkpointed"]
    sums = ctx.all([Step(f"checksum:{i}", checksum, (text,)) for i, text in enumerate(texts)])
    words = ctx.step("count words", word_count, " ".join(texts))
    ctx.sleep(float(input.get("pause_seconds", 2)))
    ctx.set_attributes({"texts": len(texts), "words": words})
    return {"checksums": sums, "words": words, "finished_at": ctx.now().isoformat()}
