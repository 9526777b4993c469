"""Reading golden-set items from a file: JSON Lines or CSV, for the admin's import page and the API's import
action alike (`services.golden_items_import` writes what this reads).

`read_file` turns the bytes of a file into `ImportLine`s, one for each non-blank line (a CSV record: the line
it starts on), each with the item's fields and what is wrong with them by key. `read_objects` does the same
for items already parsed from a JSON body. A problem with the file as a whole is `Unreadable` (`TooLarge`
past a limit), its message written for the person who sent it.

The file:
- UTF-8 only; a byte-order mark is dropped. Any other encoding is refused naming the line of the first byte
  that cannot be read; UTF-16 (its byte-order mark) is refused by name.
- Blank lines, and CSV rows whose cells are all blank (spreadsheets export them), are skipped.
- At most MAX_BYTES bytes and MAX_ITEMS items (`TooLarge`); no items at all is `Unreadable`.
- The kind comes from the file name or content type (`file_kind`), or from the content: JSON Lines when it
  starts with `{`, CSV otherwise.
- CSV: a header naming columns among ITEM_KEYS (any case) with `input` among them, none twice; an unknown
  column, like an unreadable record, refuses the file (it would be wrong on every line).

Each line, refused on its own (all of a line's problems at once, by key):
- JSON (a JSON Lines line; a CSV `rubric`, `metadata`, a `tags` cell starting with `[`, an `input` cell
  starting with `{`) with NaN or Infinity, a number out of range, or nesting deeper than MAX_JSON_DEPTH.
- A NUL character or half a surrogate pair (a JSON "\\ud800") anywhere, in a value or a key (Postgres cannot
  store either).
- A JSON Lines line that is not an object; an unknown key; a CSV row with more or fewer cells than the header.
- The item's fields as `services.item_errors` checks them (one rule for the import, the admin's item form, the
  API and the services), and the API's length caps: the expected output at most MAX_EXPECTED_OUTPUT
  characters, the scoring criteria at most MAX_CRITERIA.
- Forms: `tags` may be a list or comma-separated names; a non-text expected output in JSON Lines is kept as
  its JSON text; a CSV `input` cell is its text, or the JSON object when it starts with `{`.
- `split` is train, validation or test (any case, blanks around it dropped); a line without one (or with an
  empty one) gets the split evals/splits.py deals it when it is written.

Where the admin's and the API's importers differed, the stricter rule was kept:
- A CSV `input` cell starting with `{` that is not a valid JSON object is an error (the admin's rule; the API
  read it as text, so a broken object was imported as garbled text without a word). Text that starts with
  `{` is imported from JSON Lines. A cell starting with `[` is text (the admin read it as JSON, which refused
  inputs such as "[URGENT] ..."). A CSV `input` cell of only blanks is missing (the admin's rule).
- The API's length caps, unknown keys and columns as errors, NaN, out-of-range numbers and depth refused as
  the line is read, rows with too few cells refused, UTF-8 errors naming the line, UTF-16 named.
- Comma-separated `tags` in JSON Lines stay accepted: the API documents them (the admin refused them).
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass, field

from evals.graders import MAX_TEXT_CHARS
from evals.services import item_errors
from workspaces.api.parsers import MAX_JSON_DEPTH, NUL, text_problem

ITEM_KEYS = ("input", "expected_output", "scoring_criteria", "rubric", "tags", "metadata", "split")
MAX_BYTES = 5 * 1024 * 1024
MAX_ITEMS = 5000
MAX_EXPECTED_OUTPUT = MAX_TEXT_CHARS  # the graders would cut a longer one
MAX_CRITERIA = 20_000
# the csv module refuses a field past 131,072 characters by default (one limit for the whole process): a cell
# as long as the file may be is read here, and its length checked as a JSON Lines line's is
csv.field_size_limit(max(csv.field_size_limit(), MAX_BYTES))


class Unreadable(ValueError):
    """The file as a whole cannot be read (its encoding, its CSV header, no items): nothing of it is imported."""


class TooLarge(Unreadable):
    """The file is over MAX_BYTES or has more than MAX_ITEMS items."""


@dataclass
class ImportLine:
    """One item of a file: its line (1-based; a CSV record's first line; a JSON body's index), its fields
    (keys among ITEM_KEYS) and what is wrong with them by key ("line" or "row" for the line as a whole)."""

    line: int
    values: dict = field(default_factory=dict)
    errors: dict[str, list[str]] = field(default_factory=dict)

    def error_entry(self) -> dict:
        return {"line": self.line, "fields": self.errors}


def line_text(entry: dict) -> str:
    """A bad line's problems in one sentence: "line 3: input: is required; tags: must be a list of short names"."""
    return f"line {entry['line']}: " + "; ".join(f"{name}: {message}" for name, messages in entry["fields"].items()
                                                 for message in messages)


# ------------------------------------------------------------------------------------------ the file

def file_kind(name: str = "", content_type: str = "") -> str:
    """"csv" or "jsonl" from a file's name, else its content type; "" when neither tells (`read_file` then
    looks at the content)."""
    name, content_type = (name or "").lower(), (content_type or "").lower()
    if name.endswith(".csv"):
        return "csv"
    if name.endswith((".jsonl", ".ndjson", ".json")):
        return "jsonl"
    if content_type == "text/csv":
        return "csv"
    if content_type in ("application/jsonl", "application/x-ndjson"):
        return "jsonl"
    return ""


def read_upload(file) -> bytes:
    """An uploaded file's bytes, refused (TooLarge) by its size before it is read."""
    if file.size > MAX_BYTES:
        raise TooLarge(f"The file is {file.size:,} bytes, over the {MAX_BYTES:,}-byte limit.")
    return file.read(MAX_BYTES + 1)


def decode(content: bytes) -> str:
    """UTF-8 text (a byte-order mark is dropped); anything else is Unreadable with the line of the first bad byte."""
    if content.startswith((b"\xff\xfe", b"\xfe\xff")):
        raise Unreadable("The file is UTF-16 text; save it as UTF-8.")
    try:
        return content.decode("utf-8-sig")
    except UnicodeDecodeError as exc:
        line = content.count(b"\n", 0, exc.start) + 1
        raise Unreadable(f"The file is not UTF-8 text: byte 0x{content[exc.start]:02x} on line {line} cannot be "
                         "read; save it as UTF-8.") from None


def read_file(content: bytes, *, kind: str = "") -> list[ImportLine]:
    """The items of a JSON Lines ("jsonl") or CSV ("csv") file, each with its problems; `kind` "" decides from
    the content. Unreadable (TooLarge past a limit) when the file as a whole cannot be read."""
    if len(content) > MAX_BYTES:
        raise TooLarge(f"The file is over the {MAX_BYTES:,}-byte limit.")
    text = decode(content)
    if kind not in ("jsonl", "csv"):
        kind = "jsonl" if text.lstrip().startswith("{") else "csv"
    if kind == "jsonl":
        return _checked(_jsonl_rows(text), from_csv=False)
    return _checked(_csv_rows(text), from_csv=True)


def read_objects(objects: list) -> list[ImportLine]:
    """Items sent already parsed (the API's JSON body), each checked like a JSON Lines line; `line` is the
    1-based index."""
    return _checked(((number, item, {}) if isinstance(item, dict) else (number, None, {"line": ["must be a JSON "
                                                                                                 "object"]})
                     for number, item in enumerate(objects, start=1)), from_csv=False)


def _checked(rows, *, from_csv: bool) -> list[ImportLine]:
    lines: list[ImportLine] = []
    for number, raw, errors in rows:  # read lazily: the item limit stops a long file early
        if len(lines) >= MAX_ITEMS:
            raise TooLarge(f"The file has more than {MAX_ITEMS:,} items; split it.")
        values: dict = {}
        if raw is not None:
            values, more = _clean(raw, from_csv=from_csv)
            errors = {**errors, **more}
        lines.append(ImportLine(number, values, errors))
    if not lines:
        raise Unreadable("The file has no items.")
    return lines


def _jsonl_rows(text: str):
    """(line, raw object or None, errors) for each non-blank line."""
    for number, line in enumerate(text.split("\n"), start=1):
        line = line.strip()
        if not line:
            continue
        try:
            value = _loads(line)
        except ValueError as exc:
            yield number, None, {"line": [f"is not valid JSON: {str(exc)[:200]}"]}
            continue
        if not isinstance(value, dict):
            yield number, None, {"line": ["must be a JSON object with an `input` key"]}
            continue
        yield number, value, {}


def _csv_rows(text: str):
    """(line, raw row as {column: cell} or None, errors) for each non-blank record after the header."""
    reader = csv.reader(io.StringIO(text, newline=""))
    try:
        header = next(reader, None)
    except csv.Error as exc:
        raise Unreadable(f"The CSV header cannot be read: {exc}.") from None
    if not header or not any(cell.strip() for cell in header):
        return
    columns = [cell.strip().lower() for cell in header]
    unknown = [_name(column) for column in columns if column not in ITEM_KEYS]
    if unknown or NUL in "".join(columns):
        raise Unreadable(f"Unknown CSV column(s) {', '.join(repr(c) for c in unknown)}; the header names columns "
                         f"among {', '.join(ITEM_KEYS)}.")
    duplicates = sorted({column for column in columns if columns.count(column) > 1})
    if duplicates:
        raise Unreadable(f"The CSV header repeats {', '.join(duplicates)}.")
    if "input" not in columns:
        raise Unreadable("The CSV header has no `input` column.")
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as exc:
            raise Unreadable(f"Line {start} cannot be read as CSV: {exc}.") from None
        if not row or not any(cell.strip() for cell in row):
            continue
        if len(row) != len(columns):
            yield start, None, {"row": [f"has {len(row)} cells; the header has {len(columns)} columns"]}
            continue
        yield start, dict(zip(columns, row, strict=True)), {}


# ------------------------------------------------------------------------------------------ an item

def _loads(text: str):
    """JSON of untrusted text: no NaN or Infinity, no number out of range, no nesting a stack cannot take."""

    def constant(name):
        raise ValueError(f"{name} is not a JSON number")

    def finite(text):
        value = float(text)
        if not math.isfinite(value):
            raise ValueError(f"the number {text[:20]} is out of range")
        return value

    try:
        return json.loads(text, parse_constant=constant, parse_float=finite)
    except RecursionError:
        raise ValueError(f"nested too deeply (more than {MAX_JSON_DEPTH} levels)") from None


def value_problem(value) -> str | None:
    """What the database or the graders cannot take in a parsed JSON value (None when nothing): a NUL or half a
    surrogate pair in a string or a key, a NaN or infinite number, nesting deeper than MAX_JSON_DEPTH."""
    stack = [(value, 1)]
    while stack:
        current, depth = stack.pop()
        if depth > MAX_JSON_DEPTH:
            return f"nested too deeply (more than {MAX_JSON_DEPTH} levels)"
        if isinstance(current, str) and (problem := text_problem(current)):
            return problem
        if isinstance(current, float) and not math.isfinite(current):
            return "numbers must be finite"
        if isinstance(current, dict):
            for key, item in current.items():
                if problem := text_problem(str(key)):
                    return problem
                stack.append((item, depth + 1))
        elif isinstance(current, list):
            stack.extend((item, depth + 1) for item in current)
    return None


def _name(key) -> str:
    """An unknown key as the report may name it: without the characters that cannot be stored or encoded."""
    text = "".join(char for char in str(key)[:100] if not text_problem(char))
    return text or "key"


def _clean(raw: dict, *, from_csv: bool) -> tuple[dict, dict[str, list[str]]]:
    """An item's fields from a JSON object or a CSV row, and what is wrong with them by key (empty when
    nothing is)."""
    errors: dict[str, list[str]] = {}
    values: dict = {}
    for key, value in raw.items():
        if key not in ITEM_KEYS:
            errors.setdefault(_name(key), []).append(f"unknown {'column' if from_csv else 'key'}; known: "
                                                     f"{', '.join(ITEM_KEYS)}")
            continue
        problem = value_problem(value)
        if problem:
            errors.setdefault(key, []).append(problem)
            continue
        values[key] = value
    if from_csv:
        values = _from_cells(values, errors)
    expected = values.get("expected_output")
    if expected is None:
        values["expected_output"] = ""
    elif not isinstance(expected, str):
        values["expected_output"] = json.dumps(expected, ensure_ascii=False)  # a JSON answer, as its text
    tags = values.get("tags")
    if isinstance(tags, str):
        values["tags"] = [tag.strip() for tag in tags.split(",") if tag.strip()]
    if isinstance(values.get("split"), str):
        values["split"] = values["split"].strip().lower()
    for key, limit in (("expected_output", MAX_EXPECTED_OUTPUT), ("scoring_criteria", MAX_CRITERIA)):
        if isinstance(values.get(key), str) and len(values[key]) > limit:
            errors.setdefault(key, []).append(f"at most {limit:,} characters")
    shape = item_errors(**{key: values.get(key) for key in ITEM_KEYS})
    for key, messages in shape.items():
        if key not in errors:
            errors[key] = messages
    return values, errors


def _from_cells(cells: dict, errors: dict) -> dict:
    """A CSV row's cells as item fields: JSON where the column holds JSON, text otherwise."""
    values: dict = {}
    for key, cell in cells.items():
        text = cell.strip() if key != "expected_output" else cell
        json_cell = (key in ("rubric", "metadata") or (key == "tags" and text.startswith("["))
                     or (key == "input" and text.startswith("{")))
        if not json_cell:
            values[key] = cell if text or key != "input" else ""
        elif text:
            try:
                values[key] = _loads(text)
            except ValueError as exc:
                errors.setdefault(key, []).append(f"is not valid JSON: {str(exc)[:200]}")
                continue
            problem = value_problem(values[key])
            if problem:
                errors.setdefault(key, []).append(problem)
    return values
