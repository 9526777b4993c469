"""Splitting text into chunks: paragraphs packed up to a size, with overlap.

Paragraphs (blocks separated by a blank line) are packed together while they fit in `size`
characters. A paragraph longer than `size` is split at line ends, then sentence ends, then
spaces, and only as a last resort inside a word. Each chunk after the first starts with up to
`overlap` characters from the end of the previous one (cut at a word boundary), so a sentence
that straddles two chunks is found from either side. No chunk is empty or longer than `size`.
"""

from __future__ import annotations

import re

_PARAGRAPHS = re.compile(r"\n\s*\n")
_SENTENCE_END = re.compile(r"(?<=[.!?;:])\s+")


def chunk_text(text: str, *, size: int = 1400, overlap: int = 200) -> list[str]:
    if size < 20:
        raise ValueError("size must be at least 20 characters")
    overlap = max(0, min(overlap, size // 2))
    units: list[str] = []
    for paragraph in _PARAGRAPHS.split(text):
        paragraph = paragraph.strip()
        if paragraph:
            units.extend(_split_long(paragraph, size))

    chunks: list[str] = []
    current: list[str] = []
    length = 0
    for unit in units:
        added = len(unit) + (2 if current else 0)
        if current and length + added > size:
            chunks.append("\n\n".join(current))
            tail = _tail(chunks[-1], overlap, size - len(unit) - 2)
            current, length = ([tail], len(tail)) if tail else ([], 0)
            added = len(unit) + (2 if current else 0)
        current.append(unit)
        length += added
    if current:
        chunks.append("\n\n".join(current))
    return chunks


def _split_long(paragraph: str, size: int) -> list[str]:
    if len(paragraph) <= size:
        return [paragraph]
    for pattern in ("\n", _SENTENCE_END, " "):
        parts = paragraph.split(pattern) if isinstance(pattern, str) else pattern.split(paragraph)
        parts = [p.strip() for p in parts if p.strip()]
        if len(parts) > 1:
            joiner = "\n" if pattern == "\n" else " "
            return _pack(parts, size, joiner)
    # one enormous word
    return [paragraph[i : i + size] for i in range(0, len(paragraph), size)]


def _pack(parts: list[str], size: int, joiner: str) -> list[str]:
    out: list[str] = []
    current = ""
    for part in parts:
        if len(part) > size:
            if current:
                out.append(current)
                current = ""
            out.extend(_split_long(part, size))
            continue
        candidate = f"{current}{joiner}{part}" if current else part
        if len(candidate) > size:
            out.append(current)
            current = part
        else:
            current = candidate
    if current:
        out.append(current)
    return out


def _tail(chunk: str, overlap: int, room: int) -> str:
    """The last `overlap` characters of `chunk` (no more than `room`), starting at a word."""
    limit = min(overlap, room)
    if limit <= 0:
        return ""
    tail = chunk[-limit:]
    if len(chunk) > limit and not chunk[-limit - 1].isspace():
        space = tail.find(" ")
        newline = tail.find("\n")
        cut = min(i for i in (space, newline, len(tail)) if i >= 0)
        tail = tail[cut:]
    return tail.strip()
