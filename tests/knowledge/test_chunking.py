import itertools
import re

from hypothesis import given, settings
from hypothesis import strategies as st

from knowledge.chunking import chunk_text

words = st.text(alphabet="abcdefghijklmnopqrstuvwxyz", min_size=1, max_size=25)
paragraph = st.lists(words, min_size=1, max_size=120).map(" ".join)
document = st.lists(paragraph, min_size=1, max_size=25).map("\n\n".join)


@settings(max_examples=150, deadline=None)
@given(document, st.integers(min_value=40, max_value=600), st.integers(min_value=0, max_value=200))
def test_chunks_fit_are_never_empty_and_keep_every_word_in_order(text, size, overlap):
    chunks = chunk_text(text, size=size, overlap=overlap)
    assert chunks
    assert all(0 < len(chunk) <= size for chunk in chunks)
    # every word of the text appears, in order, when the overlaps are removed: walk the text's
    # words and find each in the chunks from the position reached so far
    stream = " ".join(chunks)
    position = 0
    for word in re.findall(r"\w+", text):
        found = re.search(rf"\b{word}\b", stream[position:])
        assert found, f"{word!r} lost"
        position += found.start()


def test_paragraphs_are_packed_and_not_split_when_they_fit():
    text = "First paragraph.\n\nSecond paragraph.\n\nThird paragraph."
    assert chunk_text(text, size=100, overlap=0) == [text]
    assert chunk_text(text, size=40, overlap=0) == ["First paragraph.\n\nSecond paragraph.", "Third paragraph."]


def test_overlap_repeats_the_end_of_the_previous_chunk_from_a_word_start():
    text = "\n\n".join(f"Sentence number {i} of the document." for i in range(10))
    chunks = chunk_text(text, size=80, overlap=30)
    for previous, chunk in itertools.pairwise(chunks):
        head = chunk.split("\n\n")[0]
        assert previous.endswith(head)
        assert not head[0].isspace()


def test_a_long_paragraph_is_cut_at_sentences_then_words():
    sentence = "This sentence is about durable workflows and their checkpoints. "
    chunks = chunk_text(sentence * 40, size=200, overlap=0)
    assert all(len(c) <= 200 for c in chunks)
    assert all(c.endswith(".") for c in chunks[:-1])
    assert chunk_text("x" * 450, size=200, overlap=0) == ["x" * 200, "x" * 200, "x" * 50]
