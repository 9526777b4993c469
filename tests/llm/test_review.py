"""Review findings for the chat layer's offline model: prompt text and tool schemas a workflow can
carry must never crash it or stall the worker answering it."""

from llm.offline_chat import respond
from llm.offline_directives import find_directives
from llm.types import ChatRequest, ToolSpec


def ask(system: str, question: str = "What is it?", **kwargs):
    return respond(ChatRequest(model="offline-directive-v1", messages=[
        {"role": "system", "content": system}, {"role": "user", "content": question}], **kwargs))


def test_a_word_limit_with_thousands_of_digits_does_not_crash_the_offline_model():
    """`Answer in at most <N> words.` with an absurd N (a prompt mutation, a paste) is at most "no
    limit": the model answers instead of raising ValueError out of int()."""
    response = ask("Answer in at most " + "9" * 5000 + " words.", "Durable runs survive crashes. Why?")
    assert response.content


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
    assert ask(prompt).content == "I don't know."


def test_a_tool_schema_with_non_object_properties_does_not_crash_the_offline_model():
    """MCP servers describe their tools' parameters; a server that sends `properties` as a list (or
    a schema that is not an object at all) must not crash the model: the call is made with the
    arguments it can derive ({} at worst)."""
    for parameters in ({"type": "object", "properties": ["term"], "required": ["term"]}, ["term"]):
        response = ask("Call lookup before answering.", tools=(ToolSpec("lookup", "Look a term up.", parameters),))
        assert [call.name for call in response.tool_calls] == ["lookup"]
