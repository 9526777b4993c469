"""Review findings for the chat layer's offline model: prompt text and tool schemas a workflow can
carry must never crash it or stall the worker answering it. Each test fails until its fix lands
(strict xfail)."""

import time

import pytest

from llm.chat import ChatRequest, ToolSpec
from llm.offline_chat import respond


def ask(system: str, question: str = "What is it?", **kwargs):
    return respond(ChatRequest(model="offline-directive-v1", messages=[
        {"role": "system", "content": system}, {"role": "user", "content": question}], **kwargs))


@pytest.mark.xfail(strict=True, reason="review finding: a word limit longer than 4,300 digits crashes the "
                                       "offline model (int() refuses the conversion)")
def test_a_word_limit_with_thousands_of_digits_does_not_crash_the_offline_model():
    """`Answer in at most <N> words.` with an absurd N (a prompt mutation, a paste) is at most "no
    limit": the model answers instead of raising ValueError out of int()."""
    response = ask("Answer in at most " + "9" * 5000 + " words.", "Durable runs survive crashes. Why?")
    assert response.content


@pytest.mark.xfail(strict=True, reason="review finding: the unknown_answer directive's regex backtracks "
                                       "cubically: an 8 KB prompt line stalls the offline model for seconds")
def test_a_long_prompt_line_of_conditions_does_not_stall_the_offline_model():
    """A system prompt line of 400 clauses like "if it is not there," (8 KB, no full stop, no quote:
    a skill's long paragraph does this) took about 12 s to answer, and the time grows with the cube
    of its length (20 KB: 3 minutes), all inside a durable step on a worker. The directive scan
    must stay roughly linear: well under 2 s here."""
    started = time.perf_counter()
    ask("if it is not there, " * 400)
    assert time.perf_counter() - started < 2.0


@pytest.mark.xfail(strict=True, reason="review finding: a tool whose schema's `properties` is not an object "
                                       "crashes the offline model when the prompt asks for the tool")
def test_a_tool_schema_with_non_object_properties_does_not_crash_the_offline_model():
    """MCP servers describe their tools' parameters; a server that sends `properties` as a list (or
    a schema that is not an object at all) must not crash the model: the call is made with the
    arguments it can derive ({} at worst)."""
    for parameters in ({"type": "object", "properties": ["term"], "required": ["term"]}, ["term"]):
        response = ask("Call lookup before answering.", tools=(ToolSpec("lookup", "Look a term up.", parameters),))
        assert [call.name for call in response.tool_calls] == ["lookup"]
