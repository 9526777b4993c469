"""A small built-in workflow that shows the engine at work in the demo (steps, a fan, a sleep)."""

import hashlib

from durable import Context, Step, workflow


def checksum(text: str) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def word_count(text: str) -> int:
    return len(text.split())


@workflow("durable.demo.digest", api=True)
def digest(ctx: Context, input):
    """Checksum and count words of a few texts in parallel, pause, then summarise. Every input key is
    optional, and so is the input itself (`durable start durable.demo.digest` sends none)."""
    input = input or {}
    if not isinstance(input, dict):
        raise TypeError("input must be a JSON object, e.g. {\"texts\": [\"...\"], \"pause_seconds\": 1}")
    texts = input.get("texts") or ["durable runs survive crashes", "every step is checkpointed"]
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise TypeError("input.texts must be a list of strings")
    sums = ctx.all([Step(f"checksum:{i}", checksum, (text,)) for i, text in enumerate(texts)])
    words = ctx.step("count words", word_count, " ".join(texts))
    pause = input.get("pause_seconds", 2)
    if isinstance(pause, bool) or not isinstance(pause, int | float) or not 0 <= pause <= 3600:
        raise ValueError("input.pause_seconds must be a number of seconds between 0 and 3600")
    ctx.sleep(float(pause))
    ctx.set_attributes({"texts": len(texts), "words": words})
    return {"checksums": sums, "words": words, "finished_at": ctx.now().isoformat()}
