"""The offline model's directive vocabulary: the phrases of a system prompt that ``offline-directive-v1`` obeys
(llm/offline_chat.py's docstring says what each one does), each with its regex and its canonical phrasing.

The offline model finds them with ``find_directives``; evolution/operators.py and evals/rewriter.py write
them (``DIRECTIVES[key].text(...)``) and find them to steer it, so the three share this one vocabulary.
A phrase preceded in its own clause by a negation (``NEGATION``) is not a directive.
"""

from __future__ import annotations

import re
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

NEGATION = re.compile(r"\b(?:not|never|no|don't|doesn't|isn't|can't|cannot|avoid|without)\b|n't\b", re.I)


@dataclass(frozen=True)
class Directive:
    """One phrase the offline model obeys: `pattern` finds it in a system prompt, `parse` reads its
    arguments from a match, `text(**arguments)` writes its canonical phrasing (which `pattern` finds)."""

    key: str
    pattern: re.Pattern[str]
    text: Callable[..., str]
    parse: Callable[[re.Match[str]], dict]
    summary: str
    # the matches of `pattern` in a prompt, as `pattern.finditer` gives them; set when finditer itself
    # could take more than linear time on some prompts
    finder: Callable[[str], Iterator[re.Match[str]]] | None = None

    def finditer(self, prompt: str) -> Iterator[re.Match[str]]:
        return self.finder(prompt) if self.finder is not None else self.pattern.finditer(prompt)


@dataclass(frozen=True)
class FoundDirective:
    key: str
    arguments: dict
    start: int
    end: int


def _no_arguments(match: re.Match[str]) -> dict:
    return {}


_FIELD = r"[`\"'“]?[A-Za-z_][\w-]*[`\"'”]?"
_FIELD_SEPARATOR = r"(?:\s*,\s*(?:and\s+)?|\s+and\s+)"


def _fields_text(fields: Sequence[str]) -> str:
    names = [str(name) for name in fields]
    if not names or any(not re.fullmatch(r"[A-Za-z_][\w-]*", name) for name in names):
        raise ValueError(f"field names must be identifiers, got {names!r}")
    if len(names) == 1:
        return f"Answer in JSON with the field {names[0]}."
    return f"Answer in JSON with the fields {', '.join(names[:-1])} and {names[-1]}."


def _fields_parse(match: re.Match[str]) -> dict:
    parts = re.split(_FIELD_SEPARATOR, match["fields"].strip())
    return {"fields": [part.strip("`\"'“” ") for part in parts if part.strip("`\"'“” ")]}


MAX_WORD_LIMIT = 100_000  # a larger word limit is no limit (no answer comes near it): it counts as this


def _word_limit(digits: str) -> int:
    """The number `digits` writes, at most MAX_WORD_LIMIT + 1 (never converting thousands of digits)."""
    digits = digits.lstrip("0") or "0"
    return int(digits) if len(digits) <= len(str(MAX_WORD_LIMIT)) else MAX_WORD_LIMIT + 1


def _max_words_parse(match: re.Match[str]) -> dict:
    if match["n"] is not None:
        number = _word_limit(match["n"])
        if re.match(r"under|fewer|less", match["op"], re.I):
            number -= 1
    else:
        number = _word_limit(match["n2"])
    return {"n": min(MAX_WORD_LIMIT, max(1, number))}


def _max_words_text(n: int) -> str:
    if int(n) < 1:
        raise ValueError("a word limit is at least 1")
    return f"Answer in at most {int(n)} words."


def _quoted_text(template: str, value: str) -> str:
    if not value or any(c in value for c in "\"“”\n"):
        raise ValueError(f"{value!r} cannot be written in double quotes")
    return template.format(value)


def _unknown_text(phrase: str = "I don't know.") -> str:
    text = _quoted_text('If the sources do not contain the answer, say "{}"', phrase)
    return text if phrase[-1] in ".!?" else text + "."


def _scope_text(topic: str) -> str:
    if not topic.strip() or re.search(r"[.\n;!?]", topic):
        raise ValueError(f"a scope is a phrase without sentence punctuation, got {topic!r}")
    return f"Only answer questions about {topic.strip()}."


def _tool_text(tool: str) -> str:
    if not re.fullmatch(r"[A-Za-z_][\w-]*(?:\.[\w-]+)*", tool):
        raise ValueError(f"{tool!r} is not a tool name")
    return f"Call {tool} before answering."


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern, re.I)


# "If <...> not/no <...> say "<phrase>"": no line break, no opening double quote between "if" and the
# phrase's quote, no full stop before the negation. A quoted phrase holds no double quote of any kind.
_UNKNOWN_ANSWER = _compile(r"\bif\s+[^\n.\"“]*?(?:\b(?:not|no|cannot|unsure)\b|n't\b)[^\n\"“]*?"
                           r"\b(?:say|answer|reply|respond)\s+(?:with\s+)?(?:exactly\s+)?[\"“](?P<phrase>[^\"“”\n]+)[\"”]")
_UNKNOWN_IF = _compile(r"\bif\s+")
_UNKNOWN_NEGATION = _compile(r"\b(?:not|no|cannot|unsure)\b|n't\b")
# a say-word and the opening quote of the phrase that follows it (a lookahead: every one is found)
_UNKNOWN_SAY = _compile(r"\b(?=(?:say|answer|reply|respond)\s+(?:with\s+)?(?:exactly\s+)?(?P<quote>[\"“]))")


def _positions(pattern: str, text: str) -> list[int]:
    return [match.start() for match in re.finditer(pattern, text)]


def _find_unknown_answer(prompt: str) -> Iterator[re.Match[str]]:
    """`_UNKNOWN_ANSWER.finditer(prompt)`, in linear time.

    The regex alone backtracks with cubic cost on a long line of "if ... not ..." clauses with no
    say-word and quote to end them (every "if" times every negation times the rest of the line). Its
    match from an "if" is decided by the first opening quote after it, Q: the text between cannot
    hold one. There is a match iff a say-word leads to Q (``say|answer|reply|respond``, then
    whitespace, ``with``, ``exactly``), a phrase follows Q up to a closing quote, no line break comes
    between the "if" and the say-word, and the first negation after the "if" starts before the first
    full stop after it and ends by the say-word. Those facts are looked up (bisect) in lists made in
    one pass each, and the regex is run only where they say it matches, from that "if" to the closing
    quote (linear in that span); matches do not overlap, so the whole scan is linear."""
    quotes = _positions(r"[\"“]", prompt)
    if not quotes:
        return
    says = {match.start("quote"): match.start() for match in _UNKNOWN_SAY.finditer(prompt)}
    if not says:
        return
    phrase_ends = _positions(r"[\"“”\n]", prompt)
    line_breaks = _positions(r"\n", prompt)
    stops = _positions(r"\.", prompt)
    negations = [(match.start(), match.end()) for match in _UNKNOWN_NEGATION.finditer(prompt)]
    negation_starts = [start for start, _end in negations]

    def after(positions: list[int], position: int) -> int:
        index = bisect_left(positions, position)
        return positions[index] if index < len(positions) else len(prompt)

    done = 0
    for candidate in _UNKNOWN_IF.finditer(prompt):
        if candidate.start() < done:
            continue
        body = candidate.end()
        quote = after(quotes, body)
        say = says.get(quote)
        if say is None or say < body or after(line_breaks, body) < say:
            continue
        closing = after(phrase_ends, quote + 1)
        if closing == quote + 1 or closing == len(prompt) or prompt[closing] not in "\"”":
            continue
        index = bisect_left(negation_starts, body)
        if index == len(negations) or negations[index][0] >= after(stops, body) or negations[index][1] > say:
            continue
        match = _UNKNOWN_ANSWER.match(prompt, candidate.start(), closing + 1)
        if match is not None:
            done = match.end()
            yield match


DIRECTIVES: dict[str, Directive] = {d.key: d for d in (
    Directive(
        key="tool_first",
        pattern=_compile(r"\b(?:call|use|run|invoke|query)\s+(?:the\s+)?`?(?P<tool>[A-Za-z_][\w-]*(?:\.[\w-]+)*)`?"
                         r"(?:\s+tool)?\s+(?:first|before\s+(?:answering|you\s+answer|responding|replying))\b"),
        text=_tool_text, parse=lambda m: {"tool": m["tool"]},
        summary="call the named tool (when offered) before answering, once",
    ),
    Directive(
        key="scope",
        pattern=_compile(r"\bonly\s+(?:answer|respond\s+to|reply\s+to|help\s+with|handle|discuss)\s+"
                         r"(?:questions?\s+|requests?\s+)?(?:about|on|regarding|concerning|related\s+to)\s+"
                         r"(?P<topic>[^.\n;!?]*[^.\n;!?\s])"),
        text=_scope_text, parse=lambda m: {"topic": m["topic"].strip()},
        summary='refuse ("I can only help with X.") a question sharing no content word with X',
    ),
    Directive(
        key="unknown_answer",
        pattern=_UNKNOWN_ANSWER, finder=_find_unknown_answer,
        text=_unknown_text, parse=lambda m: {"phrase": m["phrase"]},
        summary="say the phrase when the evidence does not answer the question",
    ),
    Directive(
        key="json_fields",
        pattern=_compile(r"\b(?:answer|respond|reply|output|return)\s+(?:only\s+)?(?:in|as|with)\s+(?:an?\s+)?"
                         r"json(?:\s+object)?\s+with\s+(?:the\s+|these\s+)?(?:fields?|keys?|properties)\s*:?\s*"
                         rf"(?P<fields>{_FIELD}(?:{_FIELD_SEPARATOR}{_FIELD})*)"),
        text=_fields_text, parse=_fields_parse,
        summary="answer with a JSON object of exactly these fields",
    ),
    Directive(
        key="one_sentence",
        pattern=_compile(r"\b(?:in|to|with|as|use)\s+(?:exactly\s+)?(?:one|a\s+single|1)\s+sentence\b"
                         r"|\b(?:at\s+most|no\s+more\s+than)\s+(?:one|1)\s+sentence\b"
                         r"|\bone[- ]sentence\s+(?:answers?|responses?|repl(?:y|ies))\b"),
        text=lambda: "Answer in one sentence.", parse=_no_arguments,
        summary="answer with one sentence",
    ),
    Directive(
        key="bullet_list",
        pattern=_compile(r"\bbullet(?:ed|s)?(?:[- ](?:points?|list))?\b"),
        text=lambda: "Answer as a bullet list.", parse=_no_arguments,
        summary="answer with up to 3 sentences as '- ' lines",
    ),
    Directive(
        key="max_words",
        pattern=_compile(r"\b(?P<op>at\s+most|no\s+more\s+than|up\s+to|a\s+maximum\s+of|maximum\s+of|max\.?|under|"
                         r"fewer\s+than|less\s+than|within)\s+(?P<n>\d+)\s+words\b"
                         r"|\b(?P<n2>\d+)\s+words\s+or\s+(?:fewer|less)\b"),
        text=_max_words_text, parse=_max_words_parse,
        summary="answer with at most N words",
    ),
    Directive(
        key="quote_passage",
        pattern=_compile(r"\bquote\s+(?:from\s+)?(?:the\s+|a\s+|your\s+)?(?:(?:retrieved|relevant|best|source|"
                         r"supporting)\s+)?(?:passages?|sources?|text|evidence|context)\b"),
        text=lambda: "Quote the retrieved passage.", parse=_no_arguments,
        summary="put the best passage sentence, verbatim, in double quotes",
    ),
    Directive(
        key="cite_sources",
        pattern=_compile(r"\bcite\s+(?:your\s+|the\s+|all\s+|its\s+|their\s+)?(?:sources?|references?|passages?)\b"
                         r"|\b(?:include|add|give)\s+(?:source\s+)?citations?\b"),
        text=lambda: "Cite your sources.", parse=_no_arguments,
        summary="mark sentences with [n] and end with a 'Sources:' line of the hits' titles",
    ),
    Directive(
        key="prefix",
        pattern=_compile(r"\b(?:start|begin)\s+(?:your\s+|the\s+|each\s+|every\s+)?(?:answer|response|reply|output)s?"
                         r"\s+with\s+[\"“](?P<prefix>[^\"“”\n]+)[\"”]"),
        text=lambda prefix: _quoted_text('Start your answer with "{}".', prefix),
        parse=lambda m: {"prefix": m["prefix"]},
        summary="start the answer with the quoted text",
    ),
)}

_CLAUSE_BREAK = re.compile(r"[.!?;:,\n]")


class Negations:
    """Whether a negation precedes a position in its clause (text since the last clause break), for
    any number of positions in one text: the clause breaks and negations are found once, and each
    question is two bisects (re-scanning the text for each one made a long prompt quadratic)."""

    def __init__(self, text: str):
        self.breaks = [match.start() for match in _CLAUSE_BREAK.finditer(text)]
        negations = list(NEGATION.finditer(text))
        self.starts = [match.start() for match in negations]
        self.ends = [match.end() for match in negations]

    def before(self, start: int) -> bool:
        index = bisect_left(self.breaks, start)
        clause_start = self.breaks[index - 1] + 1 if index else 0
        index = bisect_right(self.ends, start)  # the last negation ending by `start`
        return bool(index) and self.starts[index - 1] >= clause_start


def find_directives(prompt: str) -> list[FoundDirective]:
    """Every directive `prompt` states (negated phrases left out), in the order they appear."""
    prompt = prompt or ""
    negations = Negations(prompt)
    found = []
    for directive in DIRECTIVES.values():
        for match in directive.finditer(prompt):
            if not negations.before(match.start()):
                found.append(FoundDirective(directive.key, directive.parse(match), match.start(), match.end()))
    return sorted(found, key=lambda item: (item.start, item.key))
