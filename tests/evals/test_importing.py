"""The golden-item importer shared by the admin's import page and the API's import action (evals/importing.py)
and the service that writes what it reads (services.golden_items_import): what a file may hold, how each bad
line is named, and that the good items land after the set's last item in one transaction."""

import json

import pytest
from django.core.files.uploadedfile import SimpleUploadedFile
from django.db import connection
from django.test.utils import CaptureQueriesContext

from evals import importing
from evals.importing import ImportLine, TooLarge, Unreadable
from evals.models import GoldenItem, item_content_hash
from evals.services import golden_item_add, golden_items_import, golden_set_create


def jsonl(*lines) -> bytes:
    return "\n".join(line if isinstance(line, str) else json.dumps(line) for line in lines).encode()


def by_line(lines: list[ImportLine]) -> dict[int, dict]:
    return {line.line: line.errors for line in lines if line.errors}


# ------------------------------------------------------------------------------------------ the file

@pytest.mark.parametrize(("name", "content_type", "kind"), [
    ("items.CSV", "", "csv"),
    ("items.jsonl", "text/csv", "jsonl"),  # the name wins over the content type
    ("items.ndjson", "", "jsonl"),
    ("items.json", "", "jsonl"),
    ("items", "text/csv", "csv"),
    ("items", "application/x-ndjson", "jsonl"),
    ("items.txt", "text/plain", ""),
])
def test_the_kind_of_a_file_comes_from_its_name_then_its_content_type(name, content_type, kind):
    assert importing.file_kind(name, content_type) == kind


def test_a_file_of_unknown_kind_is_read_by_its_first_character():
    assert importing.read_file(b'  {"input": "q"}\n')[0].values["input"] == "q"
    assert importing.read_file(b"input\nq\n")[0].values["input"] == "q"


@pytest.mark.parametrize(("content", "message"), [
    ("input\nR\xe9sum\xe9\n".encode("latin-1"), "The file is not UTF-8 text: byte 0xe9 on line 2 cannot be read; "
                                                 "save it as UTF-8."),
    ("input\nq\n".encode("utf-16"), "The file is UTF-16 text; save it as UTF-8."),
    (b"\n\n", "The file has no items."),
    (b"input\n", "The file has no items."),
    (b"question,answer\nq,a\n", "Unknown CSV column(s) 'question', 'answer'; the header names columns among input, "
                                "expected_output, scoring_criteria, rubric, tags, metadata, split."),
    (b"input,INPUT\na,b\n", "The CSV header repeats input."),
    (b"expected_output\na\n", "The CSV header has no `input` column."),
])
def test_a_file_that_cannot_be_read_as_a_whole_is_unreadable_with_a_message(content, message):
    with pytest.raises(Unreadable) as caught:
        importing.read_file(content)
    assert str(caught.value).startswith(message)


def test_a_byte_order_mark_is_dropped():
    lines = importing.read_file("\ufeffInput,tags\nq,a\n".encode())
    assert lines[0].values == {"input": "q", "tags": ["a"], "expected_output": ""}


def test_the_limits_are_too_large_with_the_numbers():
    with pytest.raises(TooLarge, match="over the 5,242,880-byte limit"):
        importing.read_file(b"input\n" + b"x" * importing.MAX_BYTES)
    with pytest.raises(TooLarge, match=r"The file has more than 5,000 items; split it\."):
        importing.read_file(jsonl(*({"input": f"q{n}"} for n in range(importing.MAX_ITEMS + 1))))
    assert len(importing.read_file(jsonl(*({"input": f"q{n}"} for n in range(importing.MAX_ITEMS))))) == 5000
    with pytest.raises(TooLarge, match=r"The file is 5,242,881 bytes, over the 5,242,880-byte limit\."):
        importing.read_upload(SimpleUploadedFile("big.csv", b"x" * (importing.MAX_BYTES + 1)))
    assert importing.read_upload(SimpleUploadedFile("small.csv", b"input\nq\n")) == b"input\nq\n"


# ---------------------------------------------------------------------------------------- JSON Lines

def test_each_bad_json_line_is_refused_on_its_own_with_every_problem_by_key():
    lines = importing.read_file(jsonl(
        {"input": "fine", "expected_output": {"severity": "P1"}, "tags": "billing, urgent"},
        "{not json",
        "",
        ["a", "list"],
        '{"input": "q", "expected_output": NaN}',
        '{"input": {"n": 1e999}}',
        "[" * 5000 + "]" * 5000,
        {"input": {"deep": json.loads("[" * 100 + "]" * 100)}},
        {"input": "q\u0000", "metadata": {"k\u0000": 1}},
        {"input": "q", "colour": "red", "rubric": "be nice", "tags": [1]},
        {"input": "q", "expected_output": "x" * (importing.MAX_EXPECTED_OUTPUT + 1),
         "scoring_criteria": "y" * (importing.MAX_CRITERIA + 1)},
        {"expected_output": "no input"},
    ), kind="jsonl")
    assert [line.line for line in lines] == [1, 2, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    assert lines[0].values == {"input": "fine", "expected_output": '{"severity": "P1"}', "tags": ["billing", "urgent"]}
    errors = by_line(lines)
    assert 1 not in errors and 3 not in errors
    assert errors[2]["line"][0].startswith("is not valid JSON")
    assert errors[4] == {"line": ["must be a JSON object with an `input` key"]}
    assert errors[5] == {"line": ["is not valid JSON: NaN is not a JSON number"]}
    assert errors[6] == {"line": ["is not valid JSON: the number 1e999 is out of range"]}
    assert errors[7] == {"line": ["is not valid JSON: nested too deeply (more than 100 levels)"]}
    assert errors[8] == {"input": ["nested too deeply (more than 100 levels)"]}
    assert errors[9] == {"input": ["Null characters are not allowed."],
                         "metadata": ["Null characters are not allowed."]}
    assert errors[10]["colour"] == ["unknown key; known: input, expected_output, scoring_criteria, rubric, tags, "
                                    "metadata, split"]
    assert set(errors[10]) == {"colour", "rubric", "tags"}
    assert errors[11] == {"expected_output": ["at most 200,000 characters"],
                          "scoring_criteria": ["at most 20,000 characters"]}
    assert errors[12] == {"input": ["is required"]}


def test_items_sent_already_parsed_are_checked_like_json_lines():
    lines = importing.read_objects([{"input": "one", "tags": ["a"]}, "not an object", {"input": {}}])
    assert lines[0].values == {"input": "one", "tags": ["a"], "expected_output": ""} and not lines[0].errors
    assert by_line(lines) == {2: {"line": ["must be a JSON object"]}, 3: {"input": ["is required"]}}
    with pytest.raises(Unreadable, match=r"The file has no items\."):
        importing.read_objects([])


# ----------------------------------------------------------------------------------------------- CSV

def test_csv_cells_are_text_or_json_by_column_and_bad_rows_are_named_by_the_line_they_start_on():
    content = ("input,expected_output,rubric,tags,metadata\n"
               '"{""text"": ""an object""}",ok,"[{""criterion"": ""cites"", ""max_points"": 1}]","[""a""]",'
               '"{""k"": 1}"\n'
               "[URGENT] my order,  kept as is  ,,\"critical, refunds\",\n"
               "\"two\nlines\",ok,not json,,\n"
               "{broken,ok,,,\n"
               "   ,blank input,,,\n"
               "a,b\n"
               "q,ok,[1e999],,\"{\"\"n\"\": NaN}\"\n"
               "\"{\"\"n\"\": 1}\",,,[1],[1]\n")
    lines = importing.read_file(content.encode(), kind="csv")
    first, second = lines[0], lines[1]
    assert first.values == {"input": {"text": "an object"}, "expected_output": "ok",
                            "rubric": [{"criterion": "cites", "max_points": 1}], "tags": ["a"], "metadata": {"k": 1}}
    assert second.values["input"] == "[URGENT] my order" and second.values["expected_output"] == "  kept as is  "
    assert second.values["tags"] == ["critical", "refunds"]
    errors = by_line(lines)
    assert sorted(errors) == [4, 6, 7, 8, 9, 10]
    assert errors[4] == {"rubric": ["is not valid JSON: Expecting value: line 1 column 1 (char 0)"]}
    # the stricter rule: an input cell starting with { must be a JSON object, never garbled text
    assert list(errors[6]) == ["input"] and errors[6]["input"][0].startswith("is not valid JSON")
    assert errors[7] == {"input": ["is required"]}
    assert errors[8] == {"row": ["has 2 cells; the header has 5 columns"]}
    assert errors[9] == {"rubric": ["is not valid JSON: the number 1e999 is out of range"],
                         "metadata": ["is not valid JSON: NaN is not a JSON number"]}
    assert set(errors[10]) == {"tags", "metadata"}


def test_a_long_expected_output_reads_from_csv_as_from_jsonl():
    """Up to MAX_EXPECTED_OUTPUT characters, past the csv module's default field limit of 131,072."""
    long = "word " * (importing.MAX_EXPECTED_OUTPUT // 5)
    rows = importing.read_file(f'input,expected_output\nq,"{long}"\n'.encode(), kind="csv")
    assert rows[0].errors == {} and rows[0].values["expected_output"] == long
    assert importing.read_file(jsonl({"input": "q", "expected_output": long}), kind="jsonl")[0].values == \
        rows[0].values
    too_long = importing.read_file(f'input,expected_output\nq,"{long}xx"\n'.encode(), kind="csv")
    assert "at most 200,000 characters" in too_long[0].errors["expected_output"][0]


def test_a_line_names_all_its_problems_in_one_sentence():
    assert importing.line_text({"line": 3, "fields": {"input": ["is required"], "tags": ["a", "b"]}}) == \
        "line 3: input: is required; tags: a; tags: b"


def test_a_json_value_with_what_the_database_cannot_store_is_named():
    assert importing.value_problem({"a": ["b", 1.5, {"c": None}]}) is None
    assert importing.value_problem({"a": float("nan")}) == "numbers must be finite"
    assert importing.value_problem({"k\u0000": 1}) == "Null characters are not allowed."
    assert importing.value_problem(json.loads("[" * 101 + "]" * 101)) == "nested too deeply (more than 100 levels)"


# ----------------------------------------------------------------------------------- the service


@pytest.fixture
def golden_set(workspace):
    golden = golden_set_create(workspace=workspace, name="imported", graders=[{"kind": "exact"}])
    golden_item_add(golden_set=golden, input="first", position=7)
    return golden


@pytest.mark.django_db
def test_good_items_are_written_after_the_last_item_in_line_order_with_their_content_hash(golden_set):
    lines = importing.read_file(jsonl(
        {"input": {"text": "refunds?"}, "expected_output": "Five days.", "scoring_criteria": "Brief.",
         "rubric": [{"criterion": "x", "max_points": 1}], "tags": ["critical"], "metadata": {"source": "faq"}},
        {"input": "shipping?"},
    ))
    created, errors = golden_items_import(golden_set=golden_set, items=lines)
    assert errors == [] and [item.position for item in created] == [8, 9]
    stored = list(GoldenItem.objects.filter(pk__in=[item.pk for item in created]).order_by("position"))
    assert [item.input for item in stored] == [{"text": "refunds?"}, "shipping?"]
    assert (stored[0].tags, stored[0].metadata, stored[0].scoring_criteria) == (["critical"], {"source": "faq"},
                                                                                "Brief.")
    assert (stored[1].expected_output, stored[1].rubric, stored[1].tags, stored[1].metadata) == ("", [], [], {})
    for item in stored:
        assert item.content_hash == item_content_hash(item.input, item.expected_output, item.scoring_criteria,
                                                      item.rubric)
        assert item.created_at is not None and item.updated_at is not None
    # what save() would compute, so a later eval run reuses results exactly as for an item added one by one
    same = golden_item_add(golden_set=golden_set, input="shipping?")
    assert same.content_hash == stored[1].content_hash


@pytest.mark.django_db
def test_a_bad_line_writes_nothing_unless_partial_and_no_good_line_writes_nothing_at_all(golden_set):
    lines = importing.read_file(jsonl({"input": "one"}, {"input": ""}, {"input": "three"}))
    created, errors = golden_items_import(golden_set=golden_set, items=lines)
    assert created == [] and errors == [{"line": 2, "fields": {"input": ["is required"]}}]
    assert golden_set.items.count() == 1
    created, errors = golden_items_import(golden_set=golden_set, items=lines, partial=True)
    assert [item.input for item in created] == ["one", "three"] and [item.position for item in created] == [8, 9]
    assert errors == [{"line": 2, "fields": {"input": ["is required"]}}]
    created, errors = golden_items_import(golden_set=golden_set, items=importing.read_file(jsonl({"input": ""})),
                                          partial=True)
    assert created == [] and errors[0]["line"] == 1
    assert golden_set.items.count() == 3


@pytest.mark.django_db
def test_an_import_costs_the_same_queries_for_one_item_as_for_two_hundred(golden_set):
    def queries(count: int) -> int:
        lines = importing.read_file(jsonl(*({"input": f"q{n}"} for n in range(count))))
        with CaptureQueriesContext(connection) as captured:
            created, _ = golden_items_import(golden_set=golden_set, items=lines)
        assert len(created) == count
        return len(captured)

    assert queries(1) == queries(200)
    assert golden_set.items.count() == 202


@pytest.mark.django_db
def test_a_split_column_is_kept_and_an_item_without_one_is_dealt(golden_set):
    csv_file = "input,tags,split\nq1,durable, Test \nq2,durable,\nq3,durable,VALIDATION\nq4,durable,holdout\n"
    lines = importing.read_file(csv_file.encode(), kind="csv")
    assert [line.values.get("split") for line in lines] == ["test", "", "validation", "holdout"]
    assert by_line(lines) == {5: {"split": ["must be one of train, validation, test (or empty: dealt by the item's "
                                            "first tag)"]}}
    created, errors = golden_items_import(golden_set=golden_set, items=lines, partial=True)
    assert [entry["line"] for entry in errors] == [5]
    assert [item.split for item in created] == ["test", "train", "validation"]
    assert [item.split for item in GoldenItem.objects.filter(pk__in=[i.pk for i in created]).order_by("position")] \
        == ["test", "train", "validation"]
    lines = importing.read_file(jsonl({"input": "q5", "split": "train"}, {"input": "q6", "split": 3}, {"input": "q7"}))
    assert by_line(lines) == {2: {"split": ["must be one of train, validation, test (or empty: dealt by the item's "
                                            "first tag)"]}}
    created, _ = golden_items_import(golden_set=golden_set, items=lines, partial=True)
    assert created[0].split == "train"
    assert created[1].split in ("validation", "test")  # half the set is in train already: it goes to another
