import pytest

from knowledge.extraction import (
    CSV,
    DOCX,
    HTML,
    MARKDOWN,
    PDF,
    TEXT,
    ExtractionError,
    detect_format,
    extract,
)
from tests.knowledge.fixtures import HTML_PAGE, make_docx, make_pdf


def test_plain_text_and_markdown():
    result = extract(b"Hello\r\nworld\x00!\n\n\n\nNext   paragraph", filename="notes.txt")
    assert result.content_type == TEXT
    assert result.text == "Hello\nworld!\n\nNext paragraph"  # NUL removed, newlines and spaces normalised
    assert extract(b"# Title\n\nBody", filename="README.md").content_type == MARKDOWN


def test_text_in_windows_1252_and_utf16_is_decoded():
    assert extract("café crème".encode("cp1252"), filename="a.txt").text == "café crème"
    assert extract("naïve".encode("utf-16"), filename="a.txt").text == "naïve"


def test_html_keeps_the_main_content_and_drops_navigation():
    result = extract(HTML_PAGE.encode(), filename="page.html")
    assert result.content_type == HTML
    assert result.title == "Durable engine handbook"
    assert "# Recovering a crashed run" in result.text
    assert "checkpointed in Postgres" in result.text
    assert "dead | recovery gave up" in result.text
    for noise in ("Navigation link", "Home", "tracking", "color: red", "Related posts", "cookies", "Copyright"):
        assert noise not in result.text
    paragraphs = result.text.split("\n\n")
    assert any(p.startswith("Every step") for p in paragraphs)


def test_csv_rows_become_readable_lines():
    data = b"name,severity,owner\nLogin down,P0,Dana\nTypo,P3,\n"
    result = extract(data, filename="bugs.csv")
    assert result.content_type == CSV
    assert result.text.splitlines() == ["name: Login down; severity: P0; owner: Dana", "name: Typo; severity: P3"]


def test_pdf_text_of_every_page():
    data = make_pdf([["Durable engine handbook", "Runs are replayed."], ["Second page about checkpoints."]],
                    title="Engine handbook")
    result = extract(data, filename="handbook.pdf")
    assert result.content_type == PDF
    assert result.title == "Engine handbook"
    assert "Runs are replayed." in result.text
    assert "Second page about checkpoints." in result.text


def test_docx_headings_paragraphs_and_tables():
    data = make_docx(["Every step is checkpointed.", "A crash loses nothing."], heading="Engine",
                     table=[["status", "meaning"], ["dead", "recovery gave up"]])
    result = extract(data, filename="engine.docx")
    assert result.content_type == DOCX
    assert result.title == "Engine"
    assert result.text.startswith("# Engine")
    assert "A crash loses nothing." in result.text
    assert "dead | recovery gave up" in result.text


def test_format_detected_from_content_before_the_name():
    assert detect_format(make_pdf([["x"]]), filename="looks-like.txt") == PDF
    assert detect_format(make_docx(["x"]), filename="upload.bin") == DOCX
    assert detect_format(b"<!DOCTYPE html><html></html>") == HTML


@pytest.mark.parametrize(("data", "name", "message"), [
    (b"\x89PNG\r\n\x1a\n....", "image.png", "unsupported format '.png'"),
    (b"PK\x03\x04not really a zip", "archive.zip", "zip archive but not a .docx"),
    (b"%PDF-1.4 garbage", "broken.pdf", "could not read the PDF"),
    (b"   \n\n  ", "empty.txt", "no text could be extracted"),
    (make_pdf([[]]), "scan.pdf", "scanned PDF"),
])
def test_unreadable_files_raise_a_message_for_the_user(data, name, message):
    with pytest.raises(ExtractionError, match=message):
        extract(data, filename=name)
