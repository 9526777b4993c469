"""``offline-directive-v1``: the deterministic offline chat model (no key, no network).

It answers from what a real model would see, and nothing else: the system prompt, the messages, the
tool results, the tools offered and the response format. The same request always gets the same
answer (only `latency_ms` varies); the temperature is ignored. It is not a language model: it picks
sentences out of its inputs and shapes them as the system prompt's directives ask, so a prompt or
tool change moves its answers for reasons a reader can trace.

Directives
----------
Recognised in the system (and developer) messages, case-insensitively; ``DIRECTIVES`` (llm/offline_directives.py,
shared with the code that writes them: evolution/operators.py, evals/rewriter.py) holds each
one's key, regex and canonical phrasing (``DIRECTIVES[key].text(...)``, always recognised by its own
regex). Text the model does not recognise changes nothing. A phrase preceded, in its own clause
(text since the last ``. ! ? ; : ,`` or line break), by a negation (not, never, no, don't, avoid,
without) is not a directive: "Do not cite sources." asks for nothing. A quoted phrase (unknown_answer,
prefix) is one line holding no double quote of any kind. Finding the directives takes time linear in
the prompt's length, whatever the prompt (a directive whose regex alone could backtrack super-linearly
has its own scan: ``Directive.finder``).

=============== ================================================== ======================================
key             canonical phrasing (other forms recognised)        effect
=============== ================================================== ======================================
tool_first      ``Call knowledge_search before answering.``        see Tools below
                ("Always use the X tool first.", "Run X first.")
scope           ``Only answer questions about X.``                 a last user message sharing no
                ("Only respond to questions on X", "Only help       content word with X gets exactly
                with X")                                           ``I can only help with X.``
unknown_answer  ``If the sources do not contain the answer,         when no evidence sentence shares a
                say "I don't know."`` (any "If ... not/no ...,      content word with the question (or
                say/answer "<phrase>"")                            there is no evidence): exactly <phrase>
json_fields     ``Answer in JSON with the fields a, b and c.``      a JSON object with exactly those keys
                ("Respond in JSON with the keys a, b, c",           (see JSON below)
                "Return a JSON object with the field a")
one_sentence    ``Answer in one sentence.`` ("in a single           one answer sentence
                sentence", "one-sentence answer")
bullet_list     ``Answer as a bullet list.`` (any "bullet list",    up to 3 answer sentences, one
                "bulleted list", "bullet points", "bullets")        ``- `` line each
max_words       ``Answer in at most N words.`` ("no more than N     at most N words in the whole answer,
                words", "up to N words", "N words or fewer";        counted by whitespace: answer sentences
                "under/fewer than/less than N words" mean N-1;      are dropped from the end, then the
                an N above 100,000 counts as 100,000: no limit)     last one is cut (ending with ".")
quote_passage   ``Quote the retrieved passage.`` ("quote the        the best-scoring sentence of a tool
                source", "quote from the relevant passages")       result (else the best sentence),
                                                                   verbatim in double quotes, first
cite_sources    ``Cite your sources.`` ("cite the sources",         a marker ``[n]`` after each answer
                "include citations")                               sentence taken from a knowledge_search
                                                                   hit, and a last line
                                                                   ``Sources: [1] Title; [2] Title``
prefix          ``Start your answer with "Answer:".`` ("Begin       the answer starts with the text
                your response with "..."")                         (followed by a space, or a line break
                                                                   before a bullet list)
=============== ================================================== ======================================

Evidence and the question
-------------------------
The question is the last user message. Evidence, in message order: the text of earlier user and
assistant messages (previous nodes' outputs arrive as user messages), tool results, and, when the
last user message has two sentences or more, its sentences other than the question in it (those
ending in "?", else its last sentence), so "<text>. Who founded Acme?" is answered from <text>.
A user message's first line of the form ``Output of <node id>:`` (at most 200 characters before the
colon, nothing after it on the line) is left out: it is the header the workflow runner gives a
predecessor's output, framing rather than evidence (a node whose predecessor had nothing to say would
otherwise answer with the header itself, and the next one with ``Output of b: Output of a:``).
A tool result that is a JSON object with a ``hits`` list (knowledge_search) contributes each hit's
``content``, remembering the hit (its ``title``, ``source_id``) for citations; another JSON result
contributes its string values (and ``key: value`` for other scalars); any other result its text.
Evidence is split into sentences (at ``. ! ?`` followed by a space, and at line breaks; markdown
heading lines left out, list markers stripped); identical sentences count once.

Words are compared as content words: lower-cased runs of letters and digits, stop words (articles,
pronouns, auxiliaries, question words) and single letters dropped, a plural "s"/"ies" reduced
("workflows" = "workflow"). A sentence's score is the number of distinct content words of the question
it contains (of the question sentences when the last user message has several); ties go to the earlier
sentence. The answer is the best 2 sentences (1 with one_sentence,
3 with bullet_list) among those scoring above zero, best first. When none scores above zero the model
still answers with the first sentences of its evidence (unless unknown_answer says otherwise), and with
no evidence at all it answers ``I don't have enough information to answer.`` (which, coming from
another node, is not evidence: it never repeats the question, so it cannot crowd out what is retrieved).

Tools
-----
A tool is asked for by a tool_first directive naming it, or by any sentence of the system prompt that
names it (not negated). When an offered tool is asked for and the messages hold no result of it yet
(a tool message answering a call to it), the model answers with one call to the first such tool, in
the order the prompt names them, and no text. Its arguments come from the tool's parameter schema: a
string parameter named like a query (query, q, question, search, search_query, prompt, text, input,
keywords, topic, term) and every other required string parameter get the last user message; other
required parameters get their schema ``default``, else their first ``enum`` option, else a number's
``minimum`` or 1, false, [] or {}; optional parameters are left out. A schema, ``properties`` or
property schema that is not a JSON object counts as {}, and a ``required`` that is not a list as [] (an
MCP server's malformed schema gets a call with the arguments that can be derived, {} at worst). A
directive naming a tool that is not offered is ignored, and a tool that is offered but never asked for
is never called. An out-of-scope question is refused before any tool is called.

JSON
----
A ``json_schema`` response format gives an object with the schema's properties; otherwise a
``json_fields`` directive gives one with its fields; otherwise a ``json_object`` response format gives
``{"answer": <answer>}``. A value is chosen by its schema type (for json_fields fields, by the field's
name: answer-like names are strings; source-like names ending in "s" and plural-looking names (last
word ending in "s", not "ss"/"us"/"is") are lists of strings; names with the word count, number, total,
amount, price, cost, year, age or quantity (or starting with n_/num_) are numbers; everything else is
a string):

- a name with the word answer, response, reply, result, summary, text, content, output, message or
  explanation: the answer text (the answer sentences, one_sentence and max_words obeyed);
- a name with the word source, citation or reference: the titles (with "id": the source_ids) of the
  knowledge_search hits the answer used, joined by "; " for a string;
- a string: the evidence sentence sharing most content words with the field's name, ties broken by
  the words it shares with the question, then by order; an array of strings: the best 3 such sentences;
- a number/integer: the first number in the best sentence that has one (0 when none does);
- a boolean: true when the best sentence shares a word with the field's name and has no negation;
- an enum: the option whose description has the most content words in common with the question and
  the evidence, where the system prompt describes options as lines ``- <option>: <description>``
  (an option without such a line is described by its own name); ties go to the first option listed
  in the prompt, then in the enum. This is how a workflow routes: ``{"next": {"enum": [...]}}``;
- an object: its properties, by the same rules; ``null``: null.

A ``json_schema`` without properties gives ``{"answer": <answer>}`` too. A refused (out-of-scope)
question in JSON: the refusal is the answer text and the only evidence. In JSON the prose directives
bullet_list, quote_passage, cite_sources and prefix do not apply.
``max_tokens`` cuts the text at about 4 characters a token, with finish_reason "length".
"""

from __future__ import annotations

import hashlib
import json
import re
import time
from collections.abc import Sequence
from dataclasses import dataclass, field

from llm.embeddings import STOP_WORDS as _EMBEDDING_STOP_WORDS
from llm.names import OFFLINE_MODEL, ResolvedModel
from llm.offline_directives import NEGATION, Negations, find_directives
from llm.providers import OFFLINE_PROVIDER
from llm.types import ChatProvider, ChatRequest, ChatResponse, ToolCall
from llm.usage import Usage, estimate_tokens

MODEL = OFFLINE_MODEL

# -------------------------------------------------------------------------------------------- words

STOP_WORDS = _EMBEDDING_STOP_WORDS | frozenset((
    "about", "after", "again", "all", "also", "am", "any", "been", "before", "being", "can", "could", "describe",
    "did", "do", "does", "doing", "done", "each", "explain", "give", "had", "having", "him", "how", "just", "me",
    "more", "most", "much", "my", "no", "not", "only", "other", "please", "should", "some", "such", "tell", "than",
    "those", "too", "us", "very", "where", "whom", "whose", "why", "would", "yes", "yours", "ours", "hers",
    "s", "t", "don", "doesn", "isn", "aren", "won", "shall", "may", "might", "must", "let", "via",
))
_WORD = re.compile(r"\w+")


def _stem(word: str) -> str:
    if len(word) > 4 and word.endswith("ies"):
        return word[:-3] + "y"
    if len(word) > 3 and word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def content_words(text: str) -> list[str]:
    """The distinct content words of `text`, in order of first appearance (see the module docstring)."""
    seen: dict[str, None] = {}
    for word in _WORD.findall(text.casefold()):
        if word in STOP_WORDS or (len(word) == 1 and not word.isdigit()) or word.startswith("_"):
            continue
        seen.setdefault(_stem(word), None)
    return list(seen)


def _name_words(name: str) -> list[str]:
    """The words of an identifier: snake_case, kebab-case and camelCase split."""
    spaced = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", name).replace("_", " ").replace("-", " ")
    return [word.casefold() for word in spaced.split()]


# ----------------------------------------------------------------------------------------- evidence


@dataclass(frozen=True)
class _Sentence:
    text: str
    order: int
    words: frozenset[str]
    hit: int | None = None  # index of the knowledge_search hit it comes from
    retrieved: bool = False  # from a tool result


@dataclass
class _Inputs:
    system: str = ""
    question: str = ""
    focus: frozenset[str] = frozenset()  # content words of the question sentence(s)
    question_words: frozenset[str] = frozenset()  # content words of the whole last user message
    sentences: list[_Sentence] = field(default_factory=list)
    hits: list[dict] = field(default_factory=list)
    answered_tools: set[str] = field(default_factory=set)  # lower-cased names of tools with a result


# the line the workflow runner heads a predecessor's output with ("Output of <node id>:"): framing, not evidence
_HANDOFF_HEADER = re.compile(r"\AOutput of [^\n]{1,200}:[^\S\n]*(?:\n|\Z)")
_ABBREVIATIONS = r"(?<!\be\.g\.)(?<!\bi\.e\.)(?<!\betc\.)(?<!\bvs\.)(?<!\bMr\.)(?<!\bDr\.)(?<!\bNo\.)"
_SENTENCE_BREAK = re.compile(_ABBREVIATIONS + r"(?<=[.!?…])\s+")
_LIST_MARKER = re.compile(r"^\s*(?:[-*•+]\s+|\d{1,3}[.)]\s+|>\s*)")
_HEADING = re.compile(r"^\s*#{1,6}\s")


def split_sentences(text: str) -> list[str]:
    """`text` cut into sentences (at . ! ? followed by a space, and at line breaks); markdown headings
    are left out (a title is not an answer) and list markers stripped."""
    sentences = []
    for line in (text or "").splitlines():
        if _HEADING.match(line):
            continue
        line = _LIST_MARKER.sub("", line).strip()
        for sentence in _SENTENCE_BREAK.split(line):
            sentence = sentence.strip()
            if sentence and _WORD.search(sentence):
                sentences.append(sentence)
    return sentences


def _message_text(content) -> str:
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, list) and all(isinstance(part, dict) and "type" in part for part in content):  # parts
        return "\n".join(part["text"] for part in content if isinstance(part.get("text"), str))
    if isinstance(content, (dict, list)):
        return json.dumps(content, ensure_ascii=False)
    return str(content)


def _json_texts(value, key: str = "") -> list[str]:
    if isinstance(value, str):
        return [value]
    if isinstance(value, dict):
        return [text for k, v in value.items() for text in _json_texts(v, str(k))]
    if isinstance(value, list):
        return [text for item in value for text in _json_texts(item, key)]
    if value is None:
        return []
    return [f"{key}: {json.dumps(value)}" if key else json.dumps(value)]


class _EvidenceBuilder:
    def __init__(self, inputs: _Inputs):
        self.inputs = inputs
        self.seen: set[str] = set()
        self.hit_index: dict[tuple, int] = {}

    def add(self, text: str, hit: int | None = None, *, retrieved: bool = False):
        for sentence in split_sentences(text):
            if sentence in self.seen or sentence == FALLBACK_ANSWER:  # another node's "no answer" is no evidence
                continue
            self.seen.add(sentence)
            self.inputs.sentences.append(_Sentence(sentence, len(self.inputs.sentences),
                                                   frozenset(content_words(sentence)), hit, retrieved))

    def add_tool_result(self, content: str):
        try:
            value = json.loads(content)
        except ValueError:
            self.add(content, retrieved=True)
            return
        if isinstance(value, dict) and isinstance(value.get("hits"), list):
            for hit in value["hits"]:
                if not isinstance(hit, dict):
                    continue
                text = str(hit.get("content") or "")
                identity = (hit.get("source_id"), hit.get("chunk_id"), text)
                if identity not in self.hit_index:
                    number = len(self.inputs.hits)
                    self.hit_index[identity] = number
                    title = str(hit.get("title") or hit.get("source_id") or f"Source {number + 1}")
                    self.inputs.hits.append({"title": title, "source_id": hit.get("source_id")})
                self.add(text, self.hit_index[identity], retrieved=True)
            return
        for text in _json_texts(value):
            self.add(text, retrieved=True)


def _read_inputs(messages: Sequence[dict]) -> _Inputs:
    inputs = _Inputs()
    builder = _EvidenceBuilder(inputs)
    last_user = max((i for i, m in enumerate(messages) if m.get("role") == "user"), default=None)
    calls: dict[str | None, str] = {}  # tool-call id -> tool name; a tool message may carry no id
    system = []
    for index, message in enumerate(messages):
        role = message.get("role")
        text = _message_text(message.get("content"))
        if role == "user":
            text = _HANDOFF_HEADER.sub("", text, count=1)
        if role in ("system", "developer"):
            system.append(text)
        elif role == "tool":
            name = message.get("name") or calls.get(message.get("tool_call_id"), "")
            inputs.answered_tools.add(str(name).casefold())
            builder.add_tool_result(text)
        elif role == "user" and index == last_user:
            inputs.question = text.strip()
            sentences = split_sentences(text)
            focus = [s for s in sentences if s.endswith("?")] or sentences[-1:]
            if len(sentences) >= 2:
                for sentence in sentences:
                    if sentence not in focus:
                        builder.add(sentence)
            inputs.question_words = frozenset(content_words(text))
            inputs.focus = frozenset(content_words(" ".join(focus))) or inputs.question_words
        else:  # earlier user messages, assistant messages
            for call in message.get("tool_calls") or ():
                function = call.get("function") or {}
                calls[call.get("id", "")] = str(function.get("name", ""))
            builder.add(text)
    inputs.system = "\n".join(system)
    return inputs


# ---------------------------------------------------------------------------------------- answering

ANSWER_WORDS = frozenset(("answer", "response", "reply", "result", "summary", "text", "content", "output", "message",
                          "explanation"))
SOURCE_WORDS = frozenset(("source", "sources", "citation", "citations", "reference", "references"))
NUMBER_WORDS = frozenset(("count", "number", "total", "amount", "price", "cost", "year", "age", "quantity", "num"))
QUERY_PARAMETERS = frozenset(("query", "q", "question", "search", "search_query", "prompt", "text", "input",
                              "keywords", "topic", "term"))
_NUMBER = re.compile(r"(?<![\w.])[-+]?\d{1,3}(?:,\d{3})+(?:\.\d+)?(?!\w)|(?<![\w.])[-+]?\d+(?:\.\d+)?(?!\w)")
# "- writer: drafts the final answer" (also "*", "•"; ":" or a dash after the option)
_OPTION_LINE = re.compile(r"^[^\S\n]*[-*•]\s*[`\"']?(?P<name>[^\s:`\"']+)[`\"']?\s*(?::|\u2014|\u2013|\s-)\s*"
                          r"(?P<description>.+)$", re.M)


FALLBACK_ANSWER = "I don't have enough information to answer."


def fallback_answer(question: str) -> str:
    """What the model says with no evidence at all (and no unknown_answer directive). It does not
    repeat the question: an answer that did would be the best-matching "evidence" for every node
    downstream that reads it, and crowd out what they retrieve."""
    return FALLBACK_ANSWER


class _Answerer:
    def __init__(self, request: ChatRequest):
        self.request = request
        self.inputs = _read_inputs(request.messages)
        self.found = find_directives(self.inputs.system)
        self.directives: dict[str, dict] = {}
        for item in self.found:
            self.directives.setdefault(item.key, item.arguments)
        self.refusal = self._refusal()
        # the answer: refusal, sentences, the unknown phrase, or the fallback
        self.answer_sentences: list[_Sentence] = []
        self.answer_text_override: str | None = None
        self._choose_answer()

    # ---- directives and tools

    def _refusal(self) -> str | None:
        scope = self.directives.get("scope")
        if scope is None:
            return None
        if set(content_words(scope["topic"])) & self.inputs.question_words:
            return None
        return f"I can only help with {scope['topic']}."

    def tool_call(self) -> ToolCall | None:
        """The call to make before answering, if a tool is asked for, offered and not yet answered."""
        if self.refusal is not None or not self.request.tools:
            return None
        offered = {tool.name.casefold(): tool for tool in self.request.tools}
        system = self.inputs.system
        negations = Negations(system)
        asked: list[tuple[int, str]] = [(item.start, item.arguments["tool"].casefold())
                                        for item in self.found if item.key == "tool_first"]
        for name, tool in offered.items():
            for match in re.finditer(rf"(?<![\w.-]){re.escape(tool.name)}(?![\w-])", system, re.I):
                if not negations.before(match.start()):
                    asked.append((match.start(), name))
                    break
        for _position, name in sorted(asked):
            if name in offered and name not in self.inputs.answered_tools:
                tool = offered[name]
                arguments = self._tool_arguments(tool.parameters)
                raw = json.dumps(arguments, ensure_ascii=False, sort_keys=True)
                digest = hashlib.sha256(f"{tool.name}\n{raw}\n{len(self.request.messages)}".encode()).hexdigest()
                return ToolCall(id=f"call_{digest[:24]}", name=tool.name, arguments=arguments, raw=raw)
        return None

    def _tool_arguments(self, parameters) -> dict:
        """The arguments of a call, from the tool's parameter schema as the tool (an MCP server) sent
        it: a schema, `properties` or property schema that is not an object counts as {}, a `required`
        that is not a list as [] (a malformed schema gets the arguments it can, {} at worst)."""
        parameters = parameters if isinstance(parameters, dict) else {}
        properties = parameters.get("properties")
        properties = properties if isinstance(properties, dict) else {}
        required = parameters.get("required")
        required = {name for name in required if isinstance(name, str)} if isinstance(required, list) else set()
        arguments = {}
        for name, schema in properties.items():
            name = str(name)
            schema = schema if isinstance(schema, dict) else {}
            kind = _schema_type(schema)
            if kind == "string" and "enum" not in schema and (name.casefold() in QUERY_PARAMETERS or name in required):
                arguments[name] = self.inputs.question
            elif name in required:
                arguments[name] = _default_value(schema, kind)
        return arguments

    # ---- the answer sentences

    def _sentence_count(self) -> int:
        if "one_sentence" in self.directives:
            return 1
        return 3 if "bullet_list" in self.directives else 2

    def _choose_answer(self):
        if self.refusal is not None:
            self.answer_text_override = self.refusal
            return
        sentences = self.inputs.sentences
        count = self._sentence_count()
        ranked = [s for s in self.rank(self.inputs.focus) if s.words & self.inputs.focus]
        unknown = self.directives.get("unknown_answer")
        if ranked:
            self.answer_sentences = ranked[:count]
            if "quote_passage" in self.directives:
                # the quote is the best sentence of a tool result (a retrieved passage), put first
                quote = next((s for s in ranked if s.retrieved), ranked[0])
                self.answer_sentences = [quote, *(s for s in ranked if s is not quote)][:count]
        elif unknown is not None:
            self.answer_text_override = unknown["phrase"]
        elif sentences:
            self.answer_sentences = sentences[:count]
        else:
            self.answer_text_override = fallback_answer(self.inputs.question)

    def rank(self, words: frozenset[str], name_words: frozenset[str] = frozenset()) -> list[_Sentence]:
        """Evidence sentences, best first: most `name_words` shared, then most `words`, then the earliest."""
        return sorted(self.inputs.sentences,
                      key=lambda s: (-len(s.words & name_words), -len(s.words & words), s.order))

    def plain_answer(self) -> str:
        """The answer sentences joined, within the word limit: the value of answer-like JSON fields."""
        if self.answer_text_override is not None:
            return self.answer_text_override
        texts = [s.text for s in self.answer_sentences]
        limit = self.directives.get("max_words")
        if not limit:
            return " ".join(texts)
        while len(texts) > 1 and len(" ".join(texts).split()) > limit["n"]:
            texts = texts[:-1]
        return _truncate_words(" ".join(texts), limit["n"])

    # ---- prose

    def prose(self) -> str:
        if self.refusal is not None:
            return self.refusal
        limit = self.directives.get("max_words")
        sentences = self.answer_sentences
        if limit:  # whole sentences go from the end while the answer is too long; then the last one is cut
            while len(sentences) > 1 and len(self._compose(sentences).split()) > limit["n"]:
                sentences = sentences[:-1]
        return self._compose(sentences, limit["n"] if limit else None)

    def _compose(self, sentences: list[_Sentence], limit: int | None = None) -> str:
        d = self.directives
        override = self.answer_text_override
        used = [] if override is not None else _hits_of(sentences)
        if override is not None:
            texts, markers = [override], [""]
        else:
            texts = [sentence.text for sentence in sentences]
            markers = [f" [{used.index(s.hit) + 1}]" if "cite_sources" in d and s.hit is not None else ""
                       for s in sentences]
        bullets = "bullet_list" in d
        prefix = d["prefix"]["prefix"] if "prefix" in d else ""
        sources = ""
        if "cite_sources" in d and used:
            sources = "Sources: " + "; ".join(f"[{n}] {self.inputs.hits[hit]['title']}"
                                              for n, hit in enumerate(used, 1))
        if limit and len(texts) == 1:  # cut the one sentence left, keeping the prefix, marker and sources whole
            budget = limit - len(prefix.split()) - len(sources.split()) - len(markers[0].split()) - bullets
            if budget >= 1:
                texts[0] = _truncate_words(texts[0], budget)
        parts = []
        for position, (text, marker) in enumerate(zip(texts, markers, strict=True)):
            quoted = position == 0 and "quote_passage" in d and override is None
            parts.append((f'"{text}"' if quoted else text) + marker)
        body = "\n".join(f"- {part}" for part in parts) if bullets else " ".join(parts)
        text = _join_prefix(prefix, body, bullets)
        if sources:
            text = f"{text}\n{sources}"
        if limit and len(text.split()) > limit:
            text = _truncate_words(text, limit)
        return text

    # ---- JSON

    def json_value(self) -> dict | None:
        """The JSON object to answer with, or None for a prose answer."""
        response_format = self.request.response_format or {}
        kind = response_format.get("type")
        if kind == "json_schema":
            wrapper = response_format.get("json_schema")
            schema = wrapper.get("schema") if isinstance(wrapper, dict) else None
            if isinstance(schema, dict) and isinstance(schema.get("properties"), dict) and schema["properties"]:
                return self._object(schema)
            return {"answer": self.plain_answer()}
        fields = self.directives.get("json_fields")
        if fields:
            return {name: self._value(name, _schema_for_name(name)) for name in fields["fields"]}
        if kind == "json_object":
            return {"answer": self.plain_answer()}
        return None

    def _object(self, schema: dict) -> dict:
        return {name: self._value(name, sub if isinstance(sub, dict) else {})
                for name, sub in (schema.get("properties") or {}).items()}

    def _value(self, name: str, schema: dict):
        schema = _first_alternative(schema)
        kind = _schema_type(schema)
        words = set(_name_words(name))
        if isinstance(schema.get("enum"), (list, tuple)) and schema["enum"]:
            return self._choose(list(schema["enum"]))
        if kind == "object":
            return self._object(schema) if isinstance(schema.get("properties"), dict) and schema["properties"] else {}
        if kind == "array":
            items = schema.get("items")
            items = _first_alternative(items if isinstance(items, dict) else {})
            item_kind = _schema_type(items)
            if item_kind == "string" and "enum" not in items:
                if words & SOURCE_WORDS:
                    return self._sources(words)
                return [s.text for s in self._best(name)[:3]]
            return [self._value(name, items)]
        if kind in ("number", "integer"):
            return self._number(name, integer=kind == "integer")
        if kind == "boolean":
            best = self._best(name)
            name_words = frozenset(content_words(" ".join(_name_words(name))))
            return bool(best and best[0].words & name_words and not NEGATION.search(best[0].text))
        if kind == "null":
            return None
        if words & ANSWER_WORDS:
            return self.plain_answer()
        if words & SOURCE_WORDS:
            return "; ".join(self._sources(words))
        best = self._best(name)
        return best[0].text if best else self.plain_answer()

    def _best(self, name: str) -> list[_Sentence]:
        if self.refusal is not None:
            return [_Sentence(self.refusal, 0, frozenset())]
        name_words = frozenset(content_words(" ".join(_name_words(name))))
        return self.rank(self.inputs.focus, name_words)

    def _sources(self, words: set[str]) -> list[str]:
        key = "source_id" if words & {"id", "ids"} else "title"
        return [str(self.inputs.hits[hit][key]) for hit in _hits_of(self.answer_sentences)]

    def _number(self, name: str, *, integer: bool):
        for sentence in self._best(name):
            match = _NUMBER.search(sentence.text)
            if match:
                value = float(match.group().replace(",", ""))
                return int(value) if integer or value.is_integer() else value
        return 0

    def _choose(self, options: list):
        """The enum option whose description shares most words with the question and the evidence."""
        descriptions: dict[str, str] = {}
        listed: list[str] = []
        by_name = {str(option).casefold(): option for option in options}
        for match in _OPTION_LINE.finditer(self.inputs.system):
            key = match["name"].casefold()
            if key in by_name and key not in descriptions:
                descriptions[key] = match["description"]
                listed.append(key)
        order = listed + [key for key in by_name if key not in descriptions]
        pool = set(self.inputs.question_words)
        for sentence in self.inputs.sentences:
            pool |= sentence.words
        best, best_score = order[0], -1
        for key in order:
            score = len(set(content_words(descriptions.get(key, key))) & pool)
            if score > best_score:
                best, best_score = key, score
        return by_name[best]

    # ---- the response

    def respond(self) -> tuple[str, tuple[ToolCall, ...], str]:
        call = self.tool_call()
        if call is not None:
            return "", (call,), "tool_calls"
        value = self.json_value()
        content = self.prose() if value is None else json.dumps(value, ensure_ascii=False)
        if self.request.max_tokens is not None and estimate_tokens(content) > self.request.max_tokens:
            return content[: max(0, self.request.max_tokens) * 4], (), "length"
        return content, (), "stop"


def _hits_of(sentences: Sequence[_Sentence]) -> list[int]:
    """The knowledge_search hits `sentences` come from, in order of first use."""
    used: list[int] = []
    for sentence in sentences:
        if sentence.hit is not None and sentence.hit not in used:
            used.append(sentence.hit)
    return used


def _join_prefix(prefix: str, body: str, bullets: bool) -> str:
    if not prefix:
        return body
    if prefix[-1].isspace():
        return prefix + body
    return f"{prefix}\n{body}" if bullets else f"{prefix} {body}"


def _truncate_words(text: str, limit: int) -> str:
    """The first `limit` whitespace-separated words of `text`, line breaks kept, ended with a period when cut."""
    if len(text.split()) <= limit:
        return text
    lines, left = [], limit
    for line in text.split("\n"):
        words = line.split()
        if left <= 0:
            break
        lines.append(line if len(words) <= left else " ".join(words[:left]))
        left -= min(len(words), left)
    cut = "\n".join(lines).rstrip(" ,;:-")
    return cut if cut[-1:] in ".!?\"”)]" else cut + "."


def _first_alternative(schema: dict) -> dict:
    for key in ("anyOf", "oneOf"):
        options = schema.get(key)
        if isinstance(options, list):
            for option in options:
                if isinstance(option, dict) and option.get("type") != "null":
                    return {**{k: v for k, v in schema.items() if k != key}, **option}
    return schema


def _schema_type(schema: dict) -> str:
    kind = schema.get("type")
    if isinstance(kind, list):
        kind = next((k for k in kind if k != "null"), "null")
    if not kind or not isinstance(kind, str):
        kind = "object" if "properties" in schema else "array" if "items" in schema else "string"
    return kind


def _default_value(schema: dict, kind: str):
    if "default" in schema:
        return schema["default"]
    if isinstance(schema.get("enum"), (list, tuple)) and schema["enum"]:
        return schema["enum"][0]
    if kind in ("integer", "number"):
        return schema.get("minimum", 1)
    return {"boolean": False, "array": [], "object": {}, "null": None}.get(kind, "")


def _schema_for_name(name: str) -> dict:
    """The type a json_fields field gets from its name (see the module docstring)."""
    words = _name_words(name)
    last = words[-1] if words else ""
    if set(words) & ANSWER_WORDS:
        return {"type": "string"}
    if set(words) & SOURCE_WORDS:
        return {"type": "array", "items": {"type": "string"}} if last.endswith("s") else {"type": "string"}
    if set(words) & NUMBER_WORDS or (words and words[0] in {"n", "num"}):
        return {"type": "number"}
    if len(last) > 3 and last.endswith("s") and not last.endswith(("ss", "us", "is")):
        return {"type": "array", "items": {"type": "string"}}
    return {"type": "string"}


def _input_text(request: ChatRequest) -> str:
    parts = [_message_text(m.get("content")) for m in request.messages]
    parts += [json.dumps(call, ensure_ascii=False, default=str) for m in request.messages
              for call in m.get("tool_calls") or ()]
    parts += [json.dumps(tool.as_openai(), ensure_ascii=False) for tool in request.tools]
    if request.response_format:
        parts.append(json.dumps(request.response_format, ensure_ascii=False, default=str))
    return "\n".join(parts)


def respond(request: ChatRequest) -> ChatResponse:
    """The offline model's answer to `request` (deterministic; see the module docstring)."""
    started = time.perf_counter()
    content, tool_calls, finish_reason = _Answerer(request).respond()
    output = content + "".join(call.name + call.raw for call in tool_calls)
    usage = Usage.priced(provider=OFFLINE_PROVIDER, model=MODEL, input_tokens=estimate_tokens(_input_text(request)),
                         output_tokens=estimate_tokens(output))
    return ChatResponse(content=content, tool_calls=tool_calls, usage=usage,
                        latency_ms=(time.perf_counter() - started) * 1000, finish_reason=finish_reason)


class OfflineChatProvider(ChatProvider):
    """The offline model behind the chat interface: every model name it is given answers as offline-directive-v1."""

    name = OFFLINE_PROVIDER

    def complete(self, request: ChatRequest, resolved: ResolvedModel) -> ChatResponse:
        return respond(request)
