"""The offline model offline-directive-v1: it answers from its inputs and obeys the documented
directives of its system prompt, and nothing else changes its answers."""

import json
from decimal import Decimal

import pytest

from llm.offline_chat import MODEL, respond
from llm.offline_directives import DIRECTIVES, FoundDirective, find_directives
from llm.types import ChatRequest, ToolSpec

QUESTION = "How does the durable engine recover a workflow after a crash?"
BEST = "The durable engine replays a workflow from its checkpoints after a crash."
SECOND = "A crash never loses a step: each step result is stored once."
HITS = [
    {"title": "Durable engine", "source_id": 1, "chunk_id": 10, "score": 0.9,
     "content": f"# Durable engine\n{BEST} Workers poll the queue for due runs."},  # a heading is not an answer
    {"title": "Steps", "source_id": 3, "chunk_id": 30, "score": 0.7, "content": SECOND},
    {"title": "Costs", "source_id": 2, "chunk_id": 20, "score": 0.4,
     "content": "Every chat call records its tokens and its cost in USD.\n"
                "Prices come from a table covering 12 models."},
]
SEARCH = ToolSpec("knowledge_search", "Search the knowledge base.", {
    "type": "object", "required": ["query"],
    "properties": {"query": {"type": "string"}, "limit": {"type": "integer", "default": 5}},
})
ROUTE = {"type": "json_schema", "json_schema": {"name": "route", "schema": {
    "type": "object", "properties": {"next": {"type": "string", "enum": ["end", "billing", "research"]}},
    "required": ["next"]}}}
ROUTER_PROMPT = ("Choose who handles the request.\n"
                 "- research: explains how the durable engine recovers crashed workflows\n"
                 "- billing: answers questions about prices, tokens and cost\n"
                 "- end: the request is finished")


def _request(system="You are a helpful assistant.", question=QUESTION, hits=HITS, tools=(), response_format=None,
             max_tokens=None, before=()):
    messages = [{"role": "system", "content": system}, *before, {"role": "user", "content": question}]
    if hits is not None:
        messages += [
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "knowledge_search", "arguments": json.dumps({"query": question})}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": json.dumps({"hits": hits})},
        ]
    return ChatRequest(model="gpt-4.1-mini", messages=messages, tools=tools, response_format=response_format,
                       max_tokens=max_tokens)


def ask(*args, **kwargs):
    return respond(_request(*args, **kwargs))


def ask_bare(system: str, question: str = "What is it?", **kwargs):
    """The offline model asked by name with a system prompt and one question: no evidence, no history."""
    return respond(ChatRequest(model="offline-directive-v1", messages=[
        {"role": "system", "content": system}, {"role": "user", "content": question}], **kwargs))


# ------------------------------------------------------------------------------------ answering


def test_answers_from_the_knowledge_search_hits_best_sentences_first():
    response = ask()
    assert response.content == f"{BEST} {SECOND}"
    assert response.tool_calls == () and response.finish_reason == "stop"
    usage = response.usage
    assert (usage.provider, usage.model, usage.calls) == ("offline", MODEL, 1)
    assert usage.input_tokens > 50 and usage.output_tokens == (len(response.content) + 3) // 4
    assert usage.usd_cost == Decimal(0)


def test_same_input_same_output():
    first, again = ask(), respond(_request())
    assert (first.content, first.tool_calls, first.usage) == (again.content, again.tool_calls, again.usage)
    call, call_again = ask("Call knowledge_search before answering.", hits=None, tools=(SEARCH,)), \
        ask("Call knowledge_search before answering.", hits=None, tools=(SEARCH,))
    assert call.tool_calls == call_again.tool_calls


def test_without_evidence_a_fixed_fallback_built_from_the_question():
    assert ask(hits=None).content == "I don't have enough information to answer."


def test_evidence_sharing_no_word_with_the_question_is_still_used_in_order():
    response = ask(question="Who painted the Mona Lisa?")
    assert response.content == f"{BEST} Workers poll the queue for due runs."


def test_a_user_message_with_text_and_a_question_is_answered_from_its_text():
    question = "Acme sells garden tools. Acme was founded in 1999 by Jane Doe. Who founded Acme?"
    assert ask(question=question, hits=None, system="Answer in one sentence.").content == \
        "Acme was founded in 1999 by Jane Doe."


def test_earlier_messages_are_evidence():
    before = [{"role": "user", "content": "Lineage keeps every workflow version."},
              {"role": "assistant", "content": "Noted."}]
    response = ask(question="Which workflow version does Lineage keep?", hits=None, before=before)
    assert response.content == "Lineage keeps every workflow version."


def test_unicode_and_empty_inputs():
    assert respond(ChatRequest(model="m", messages=[])).content == "I don't have enough information to answer."
    assert ask(system="", question="", hits=None).content == "I don't have enough information to answer."
    hits = [{"title": "Zürich 🏔", "content": "Zürich liegt am Zürichsee. Bern ist die Hauptstadt.", "source_id": 9}]
    response = ask(system="Cite your sources.", question="Wo liegt Zürich?", hits=hits)
    assert response.content == "Zürich liegt am Zürichsee. [1]\nSources: [1] Zürich 🏔"
    parts = ChatRequest(model="m", messages=[
        {"role": "user", "content": [{"type": "text", "text": "Der Zürichsee ist groß. Wo liegt der Zürichsee?"}]}])
    assert respond(parts).content == "Der Zürichsee ist groß."


def test_max_tokens_cuts_the_answer():
    response = ask(max_tokens=5)
    assert response.finish_reason == "length" and response.content == f"{BEST} {SECOND}"[:20]


# ----------------------------------------------------------------------------------- directives


def test_every_canonical_phrasing_is_recognised_by_its_own_directive():
    arguments = {"tool_first": {"tool": "knowledge_search"}, "scope": {"topic": "durable workflows"},
                 "unknown_answer": {"phrase": "I don't know."}, "json_fields": {"fields": ["answer", "sources"]},
                 "max_words": {"n": 12}, "prefix": {"prefix": "Answer:"}}
    assert set(arguments) <= set(DIRECTIVES)
    for key, directive in DIRECTIVES.items():
        text = directive.text(**arguments.get(key, {}))
        assert directive.pattern.search(text), key
        found = find_directives(f"You are an agent. {text} Be kind.")
        assert [(f.key, f.arguments) for f in found] == [(key, arguments.get(key, {}))], key
        assert [f.key for f in find_directives(text.upper())] == [key]  # case-insensitive
    one_field = DIRECTIVES["json_fields"].text(fields=["summary"])
    assert find_directives(one_field)[0].arguments == {"fields": ["summary"]}


def test_other_phrasings_and_negations():
    prompt = ("Always use the knowledge_search tool first. Respond in JSON with the keys title, year, and authors. "
              "Keep it under 30 words. Do not use bullet points. Never cite sources.")
    found = {f.key: f.arguments for f in find_directives(prompt)}
    assert found == {"tool_first": {"tool": "knowledge_search"},
                     "json_fields": {"fields": ["title", "year", "authors"]}, "max_words": {"n": 29}}
    assert find_directives("Rules: do not quote the retrieved passage.") == []
    assert find_directives("If you don't know, say \"No idea.\"") == [
        FoundDirective("unknown_answer", {"phrase": "No idea."}, 0, 33)]


def test_a_directive_it_does_not_know_changes_nothing():
    plain = ask().content
    assert ask("You are a helpful assistant. Speak like a pirate. Think step by step.").content == plain
    assert ask("").content == plain


def test_one_sentence():
    assert ask("Answer in one sentence.").content == BEST


def test_bullet_list():
    assert ask("Answer as a bullet list.").content == f"- {BEST}\n- {SECOND}"


def test_at_most_n_words():
    content = ask("Answer in at most 6 words.").content
    assert content == "The durable engine replays a workflow."
    assert len(content.split()) <= 6


def test_cite_sources():
    assert ask("Cite your sources.").content == f"{BEST} [1] {SECOND} [2]\nSources: [1] Durable engine; [2] Steps"


def test_quote_the_retrieved_passage_prefers_a_tool_result_over_other_evidence():
    assert ask("Quote the retrieved passage.").content == f'"{BEST}" {SECOND}'
    before = [{"role": "user", "content": "The durable engine recovers a crashed workflow by replaying it."}]
    content = ask("Quote the retrieved passage.", before=before).content
    assert content == f'"{BEST}" The durable engine recovers a crashed workflow by replaying it.'


def test_start_with_a_prefix():
    assert ask('Start your answer with "Answer:".').content == f"Answer: {BEST} {SECOND}"
    assert ask('Answer as a bullet list. Begin your response with "Findings".').content == \
        f"Findings\n- {BEST}\n- {SECOND}"


def test_directives_combine_within_the_word_limit():
    # the second sentence goes, then the first is cut; the prefix, its marker and the sources stay whole
    content = ask('Start your answer with "Answer:". Cite your sources. Answer in at most 12 words.').content
    assert content == "Answer: The durable engine replays a workflow. [1]\nSources: [1] Durable engine"
    assert len(content.split()) == 12
    content = ask("Answer as a bullet list. Answer in at most 16 words.").content
    assert content == f"- {BEST}" and len(content.split()) == 13


def test_json_with_named_fields():
    content = ask("Answer in JSON with the fields answer, sources and cost.").content
    value = json.loads(content)
    assert list(value) == ["answer", "sources", "cost"]
    assert value["answer"] == f"{BEST} {SECOND}"
    assert value["sources"] == ["Durable engine", "Steps"]  # titles of the hits the answer used
    assert value["cost"] == 12  # the first number of the best sentence that has one


def test_json_fields_are_extracted_by_their_name_words():
    # a field's name words count first, then the question's
    value = json.loads(ask("Answer in JSON with the fields prices, crash_step and summary. Answer in one sentence."
                           ).content)
    assert value == {"prices": ["Prices come from a table covering 12 models.", BEST, SECOND],
                     "crash_step": SECOND, "summary": BEST}


def test_call_a_tool_before_answering():
    response = ask("Call knowledge_search before answering.", hits=None, tools=(SEARCH,))
    assert response.content == "" and response.finish_reason == "tool_calls"
    (call,) = response.tool_calls
    assert call.name == "knowledge_search" and call.arguments == {"query": QUESTION}
    assert json.loads(call.raw) == call.arguments and call.id.startswith("call_")
    assert response.assistant_message()["tool_calls"][0]["function"]["name"] == "knowledge_search"
    # once its result is in the messages, it answers
    assert ask("Call knowledge_search before answering.", tools=(SEARCH,)).content == f"{BEST} {SECOND}"
    # a tool that is not offered is ignored
    assert ask("Call knowledge_search before answering.", hits=None).tool_calls == ()


def test_a_tool_named_in_the_prompt_counts_as_asked_for_and_arguments_follow_its_schema():
    fetch = ToolSpec("fetch_page", "Fetch a page.", {
        "type": "object", "required": ["url", "mode", "depth"],
        "properties": {"url": {"type": "string"}, "mode": {"type": "string", "enum": ["text", "html"]},
                       "depth": {"type": "integer", "minimum": 2}, "verbose": {"type": "boolean"}}})
    response = ask("Look pages up with fetch_page when needed.", hits=None, tools=(SEARCH, fetch))
    assert [(c.name, c.arguments) for c in response.tool_calls] == [
        ("fetch_page", {"url": QUESTION, "mode": "text", "depth": 2})]
    assert ask("Do not use fetch_page.", hits=None, tools=(fetch,)).tool_calls == ()
    # an offered tool the prompt never asks for is not called
    assert ask(hits=None, tools=(SEARCH, fetch)).tool_calls == ()


def test_only_answer_questions_in_scope():
    system = "Only answer questions about durable workflows. Call knowledge_search before answering."
    refused = ask(system, question="What is the best pizza topping?", hits=None, tools=(SEARCH,))
    assert refused.content == "I can only help with durable workflows." and refused.tool_calls == ()
    assert ask(system, tools=(SEARCH,)).content == f"{BEST} {SECOND}"


def test_say_the_given_phrase_when_the_evidence_does_not_answer():
    system = 'If the sources do not contain the answer, say "I don\'t know."'
    assert ask(system, question="Who painted the Mona Lisa?").content == "I don't know."
    assert ask(system, hits=None).content == "I don't know."
    assert ask(system).content == f"{BEST} {SECOND}"


# ------------------------------------------------------------------------------ response formats


def test_routing_chooses_the_option_whose_description_matches():
    assert json.loads(ask(ROUTER_PROMPT, response_format=ROUTE, hits=None).content) == {"next": "research"}
    billing = ask(ROUTER_PROMPT, question="What does a call cost in tokens?", hits=None, response_format=ROUTE)
    assert json.loads(billing.content) == {"next": "billing"}
    # no description matches: the first option listed in the prompt, not the first of the enum
    other = ask(ROUTER_PROMPT, question="Bonjour!", hits=None, response_format=ROUTE)
    assert json.loads(other.content) == {"next": "research"}
    # without descriptions, option names are matched, ties go to the enum's order
    bare = ask("Route it.", question="Is this about billing?", hits=None, response_format=ROUTE)
    assert json.loads(bare.content) == {"next": "billing"}
    assert json.loads(ask("Route it.", hits=None, response_format=ROUTE).content) == {"next": "end"}


def test_json_schema_values_follow_their_types():
    schema = {"type": "json_schema", "json_schema": {"name": "facts", "schema": {"type": "object", "properties": {
        "answer": {"type": "string"},
        "checkpoints": {"type": "array", "items": {"type": "string"}},
        "model_count": {"type": "integer"},
        "crash_safe": {"type": "boolean"},
        "missing": {"type": "boolean"},
        "source_ids": {"type": "array", "items": {"type": "string"}},
        "detail": {"type": "object", "properties": {"queue": {"type": "string"}, "note": {"type": ["string", "null"]}}},
    }}}}
    value = json.loads(ask("Answer in one sentence.", response_format=schema).content)
    assert value == {
        "answer": BEST,
        "checkpoints": [BEST, SECOND, "Workers poll the queue for due runs."],
        "model_count": 12,
        "crash_safe": True,
        "missing": False,
        "source_ids": ["1"],
        "detail": {"queue": "Workers poll the queue for due runs.", "note": BEST},
    }


def test_json_object_gives_an_answer_field():
    response = ask("Answer in at most 5 words.", response_format={"type": "json_object"})
    assert json.loads(response.content) == {"answer": "The durable engine replays a."}


def test_json_named_fields_win_over_json_object_and_a_schema_wins_over_both():
    system = "Answer in JSON with the field steps."
    assert list(json.loads(ask(system, response_format={"type": "json_object"}).content)) == ["steps"]
    assert list(json.loads(ask(system, response_format=ROUTE).content)) == ["next"]


# ------------------------------------------------------------------- prompts and tools matter


@pytest.mark.parametrize("directive", [
    "Answer in one sentence.", "Answer as a bullet list.", "Answer in at most 5 words.", "Cite your sources.",
    "Quote the retrieved passage.", 'Start your answer with "Short answer:".',
    "Answer in JSON with the fields answer and sources.", "Only answer questions about billing.",
])
def test_adding_a_directive_changes_the_answer(directive):
    assert ask(f"You are a helpful assistant. {directive}").content != ask("You are a helpful assistant.").content


def test_different_tool_sets_give_different_answers():
    system = "Use knowledge_search to look facts up."
    with_tool = ask(system, hits=None, tools=(SEARCH,))
    without = ask(system, hits=None, tools=())
    assert with_tool.tool_calls and not without.tool_calls
    assert (with_tool.content, with_tool.finish_reason) != (without.content, without.finish_reason)


def test_another_nodes_no_answer_is_not_evidence():
    from llm.offline_chat import FALLBACK_ANSWER

    request = ChatRequest(model="m", messages=[
        {"role": "user", "content": f"Output of planner:\n{FALLBACK_ANSWER}"},
        {"role": "user", "content": "Refunds take five business days. How much information do refunds need?"},
    ])
    assert respond(request).content == "Refunds take five business days."


def test_a_hand_off_header_is_not_evidence():
    """The runner heads a predecessor's output with `Output of <node id>:`; the line is framing. A node
    whose predecessor said nothing answers as with no evidence, never with the header."""
    from llm.offline_chat import FALLBACK_ANSWER

    def answer(*user_messages):
        return respond(ChatRequest(model="m", messages=[{"role": "user", "content": text}
                                                        for text in user_messages])).content

    assert answer("Output of a:\n", "Will it rain tomorrow?") == FALLBACK_ANSWER
    assert answer("Output of a:", "Will it rain tomorrow?") == FALLBACK_ANSWER
    assert answer("Output of b:\nOutput of a:", "Will it rain tomorrow?") == "Output of a:"  # only the first line
    # no sentence shares a word with the question: the first two sentences of the evidence answer
    assert answer("Output of node 2: draft:\nRain is likely tomorrow.\nSun on Sunday.", "What is it?") == (
        "Rain is likely tomorrow. Sun on Sunday.")
    # a first line that only starts like a header is evidence
    assert answer("Output of the plant rose: 3% in May.", "What rose?") == "Output of the plant rose: 3% in May."
    assert answer("Output of the plant rose by 3%.", "What rose?") == "Output of the plant rose by 3%."
    assert answer("Some text.\nOutput of a:", "Will it rain?") == "Some text. Output of a:"  # not a first line


def test_a_word_limit_above_the_cap_is_no_limit():
    from llm.offline_directives import MAX_WORD_LIMIT

    def limit(prompt):
        return [f.arguments for f in find_directives(prompt) if f.key == "max_words"]

    assert limit("Answer in at most 100000 words.") == [{"n": MAX_WORD_LIMIT}]
    assert limit("Answer in at most 0000012 words.") == [{"n": 12}]
    assert limit("Answer in at most 100001 words.") == [{"n": MAX_WORD_LIMIT}]
    assert limit("Answer in under 100001 words.") == [{"n": MAX_WORD_LIMIT}]
    assert limit("Keep it under " + "7" * 10_000 + " words.") == [{"n": MAX_WORD_LIMIT}]
    assert limit("Use " + "3" * 10_000 + " words or fewer.") == [{"n": MAX_WORD_LIMIT}]
    assert limit("Answer in fewer than 1 words.") == [{"n": 1}]
    assert ask("Answer in at most " + "9" * 5_000 + " words.").content == ask().content


def test_a_word_limit_with_thousands_of_digits_does_not_crash_the_offline_model():
    """`Answer in at most <N> words.` with an absurd N (a prompt mutation, a paste) is at most "no
    limit": the model answers instead of raising ValueError out of int()."""
    response = ask_bare("Answer in at most " + "9" * 5000 + " words.", "Durable runs survive crashes. Why?")
    assert response.content


@pytest.mark.parametrize("parameters, arguments", [
    (None, {}),
    ("term", {}),
    (["term"], {}),
    ({"properties": ["term"], "required": ["term"]}, {}),
    ({"properties": "term"}, {}),
    ({"properties": {"term": {"type": "string"}}, "required": "term"}, {"term": QUESTION}),  # a query-like name
    ({"properties": {"word": {"type": "string"}}, "required": "word"}, {}),  # required not a list: nothing required
    ({"properties": {"word": {"type": "string"}}, "required": [{"name": "word"}, "word"]}, {"word": QUESTION}),
    ({"properties": {"word": ["string"]}, "required": ["word"]}, {"word": QUESTION}),  # a schema not an object
    ({"properties": {"mode": {"type": {"kind": "x"}}}, "required": ["mode"]}, {"mode": QUESTION}),
    ({"properties": {"mode": {"type": "string", "enum": {"a": 1}}}, "required": ["mode"]}, {"mode": ""}),
    ({"properties": {"n": {"type": "integer", "enum": "abc"}}, "required": ["n"]}, {"n": 1}),
])
def test_a_malformed_tool_schema_still_gets_its_call(parameters, arguments):
    tool = ToolSpec("lookup", "Look a term up.", parameters)
    (call,) = ask("Call lookup before answering.", hits=None, tools=(tool,)).tool_calls
    assert (call.name, call.arguments) == ("lookup", arguments)


def test_a_tool_schema_with_non_object_properties_does_not_crash_the_offline_model():
    """MCP servers describe their tools' parameters; a server that sends `properties` as a list (or
    a schema that is not an object at all) must not crash the model: the call is made with the
    arguments it can derive ({} at worst)."""
    for parameters in ({"type": "object", "properties": ["term"], "required": ["term"]}, ["term"]):
        response = ask_bare("Call lookup before answering.", tools=(ToolSpec("lookup", "Look a term up.", parameters),))
        assert [call.name for call in response.tool_calls] == ["lookup"]


def test_a_malformed_response_schema_gets_an_answer_object():
    for response_format in ({"type": "json_schema", "json_schema": "route"},
                            {"type": "json_schema", "json_schema": {"schema": ["next"]}},
                            {"type": "json_schema", "json_schema": {"schema": {"properties": ["next"]}}}):
        assert json.loads(ask(response_format=response_format).content) == {"answer": f"{BEST} {SECOND}"}
    schema = {"type": "json_schema", "json_schema": {"schema": {"properties": {
        "next": {"enum": 3}, "details": {"type": "object", "properties": ["a"]}}}}}
    value = json.loads(ask(response_format=schema).content)
    assert value == {"next": BEST, "details": {}}


def test_a_quoted_phrase_holds_no_double_quote():
    assert find_directives('Start your answer with "A “b".') == []
    assert find_directives('If you do not know, say “No “idea”.') == []
    assert [f.arguments for f in find_directives('If you do not know, say “No idea”.')] == [{"phrase": "No idea"}]


def _unknown_answer_prompts(count: int, seed: int):
    """Prompts built from the unknown_answer regex's pieces and the characters that end them, so that
    many match (some twice), many almost match, and some are negated."""
    import random

    rng = random.Random(seed)
    fillers = ["", " ", "x ", "it is ", ". ", ", ", "\n", '"', "“", "if ", "not ", "say ", "with ", "exactly ",
               "don't ", "  ", "do not ", "; "]
    for _ in range(count):
        parts = []
        for _ in range(rng.randint(1, 4)):
            parts += [rng.choice(["if ", "If\n", "IF  ", "if", "elif "]), rng.choice(fillers),
                      rng.choice(["not", "no", "don't", "cannot", "unsure", "nothing", ""]), rng.choice(fillers),
                      rng.choice(["say", "answer", "reply", "respond", "essay", "Say"]),
                      rng.choice([" ", "\n", " with ", " exactly ", " with exactly ", ""]),
                      rng.choice(['"', "“", "”", ""]), rng.choice(["I don't know.", "", "a\nb", "x “ y", "z"]),
                      rng.choice(['"', "”", "“", "", "\n"]), rng.choice(fillers)]
        yield "".join(parts)


def test_the_linear_unknown_answer_scan_finds_what_its_regex_finds():
    """`_find_unknown_answer` replaces `_UNKNOWN_ANSWER.finditer` (cubic on some prompts) and must
    find exactly the same matches."""
    from llm.offline_directives import _UNKNOWN_ANSWER, _find_unknown_answer

    matched = 0
    for prompt in _unknown_answer_prompts(4_000, seed=7):
        expected = [(m.start(), m.end(), m["phrase"]) for m in _UNKNOWN_ANSWER.finditer(prompt)]
        assert [(m.start(), m.end(), m["phrase"]) for m in _find_unknown_answer(prompt)] == expected, prompt
        matched += bool(expected)
    assert matched > 100  # the prompts do exercise matches


def test_the_negation_index_agrees_with_a_scan_of_the_clause():
    """`Negations.before(start)` answers, with two bisects, whether a negation precedes `start` in its
    clause, for every position a directive or tool name can start at (not inside a word)."""
    import re

    from llm.offline_directives import _CLAUSE_BREAK, NEGATION, Negations

    def scanned(text, start):
        clause_start = max((m.end() for m in _CLAUSE_BREAK.finditer(text, 0, start)), default=0)
        return bool(NEGATION.search(text, clause_start, start))

    checked = negated = 0
    for text in _unknown_answer_prompts(500, seed=11):
        index = Negations(text)
        for start in range(len(text) + 1):
            if 0 < start < len(text) and re.match(r"\w\w", text[start - 1:start + 1]):
                continue
            assert index.before(start) == scanned(text, start), (text, start)
            checked += 1
            negated += index.before(start)
    assert negated > 100 and checked - negated > 100


def test_a_tool_named_in_a_long_prompt_is_found_past_its_negated_mentions():
    lookup = ToolSpec("lookup", "Look a term up.", {"type": "object", "properties": {"term": {"type": "string"}}})
    prompt = "Never call lookup for greetings, " * 5_000 + "use lookup for names."
    assert [c.name for c in ask(prompt, hits=None, tools=(lookup,)).tool_calls] == ["lookup"]
    assert ask("Never call lookup for greetings, " * 5_000, hits=None, tools=(lookup,)).tool_calls == ()


def test_a_long_prompt_line_of_conditions_is_read_for_its_directives():
    """A system prompt line of clauses like "if it is not there," with no say-word and quote to end
    them (a skill's long paragraph does this) made the unknown_answer regex backtrack with cubic cost
    (8 KB: about 12 s, 20 KB: 3 minutes, inside a durable step on a worker), and the negation check
    re-scanned the prompt from its start for every phrase it checked (quadratic: 4 s at 100 KB).

    This 200 KB prompt has both shapes, then the directives that count. Its speed is covered by
    construction, not timed (tests never assert wall-clock times): the directive scan is linear
    (`_find_unknown_answer` and `Negations` in llm/offline_directives.py): with the cubic regex back, this
    test would run for hours rather than fail an assertion (the old scan took 100 s on 20 KB of these
    conditions). What it pins is that the long prompt is still read right."""
    conditions = "if it is not there, " * 5_000  # 100 KB, one line: every "if" has a negation and no say-word
    refusals = "Do not use bullet points, " * 4_000  # 104 KB: 4,000 negated bullet_list phrases
    prompt = (conditions + "\nIf the sources do not contain the answer, say \"I don't know.\"\n"
              + refusals + "\nAnswer in one sentence.")
    assert len(prompt) > 200_000
    found = find_directives(prompt)
    assert [(f.key, f.arguments) for f in found] == [("unknown_answer", {"phrase": "I don't know."}),
                                                     ("one_sentence", {})]
    assert found[0].start == len(conditions) + 1
    assert ask_bare(prompt).content == "I don't know."
