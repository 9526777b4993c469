"""Plain text out of the formats a source may hold: txt, md, csv, html, pdf and docx.

``extract(data, filename=..., content_type=...)`` detects the format (by content first, then
the file name and the declared type) and returns an ``Extracted`` with the text, paragraphs
separated by blank lines so the chunker can pack them, and a title when the document has one.
A file that cannot be read raises ``ExtractionError`` with a message meant for the user.
"""

from __future__ import annotations

import csv
import io
import re
import zipfile
from dataclasses import dataclass
from pathlib import PurePosixPath

TEXT = "text/plain"
MARKDOWN = "text/markdown"
HTML = "text/html"
CSV = "text/csv"
PDF = "application/pdf"
DOCX = "application/vnd.openxmlformats-officedocument.wordprocessingml.document"

EXTENSIONS = {
    ".txt": TEXT, ".text": TEXT, ".md": MARKDOWN, ".markdown": MARKDOWN, ".html": HTML, ".htm": HTML,
    ".csv": CSV, ".pdf": PDF, ".docx": DOCX,
}
SUPPORTED_EXTENSIONS = tuple(sorted(EXTENSIONS))


class ExtractionError(ValueError):
    pass


@dataclass(frozen=True)
class Extracted:
    text: str
    content_type: str
    title: str = ""


def detect_format(data: bytes, *, filename: str = "", content_type: str = "") -> str:
    """The format of `data`: its magic bytes win over the name, the name over the declared type."""
    head = data[:1024].lstrip()
    if head.startswith(b"%PDF-"):
        return PDF
    if data.startswith(b"PK\x03\x04"):
        if _is_docx(data):
            return DOCX
        raise ExtractionError("the file is a zip archive but not a .docx document")
    suffix = PurePosixPath(filename.lower()).suffix if filename else ""
    if suffix in EXTENSIONS:
        return EXTENSIONS[suffix]
    if suffix:
        raise ExtractionError(f"unsupported format {suffix!r}: supported are {', '.join(SUPPORTED_EXTENSIONS)}")
    declared = content_type.split(";")[0].strip().lower()
    if declared in (TEXT, MARKDOWN, HTML, CSV, PDF, DOCX):
        return declared
    if declared in ("application/xhtml+xml",):
        return HTML
    lowered = head[:200].lower()
    if lowered.startswith((b"<!doctype html", b"<html")):
        return HTML
    if declared and not declared.startswith("text/"):
        raise ExtractionError(f"unsupported format {declared!r}: supported are {', '.join(SUPPORTED_EXTENSIONS)}")
    return TEXT


def _is_docx(data: bytes) -> bool:
    try:
        with zipfile.ZipFile(io.BytesIO(data)) as archive:
            return "word/document.xml" in archive.namelist()
    except zipfile.BadZipFile:
        return False


def extract(data: bytes, *, filename: str = "", content_type: str = "") -> Extracted:
    fmt = detect_format(data, filename=filename, content_type=content_type)
    try:
        if fmt == PDF:
            result = _pdf(data)
        elif fmt == DOCX:
            result = _docx(data)
        elif fmt == HTML:
            result = extract_html(decode_text(data, content_type))
        elif fmt == CSV:
            result = Extracted(_csv(decode_text(data, content_type)), CSV)
        else:
            result = Extracted(normalize_text(decode_text(data, content_type)), fmt)
    except ExtractionError:
        raise
    except Exception as exc:  # a damaged file: pypdf / python-docx raise many kinds of errors
        raise ExtractionError(f"could not read the {fmt.split('/')[-1].split('.')[-1]} file: {exc}") from exc
    if not result.text.strip():
        hint = " (a scanned PDF has images, not text)" if fmt == PDF else ""
        raise ExtractionError(f"no text could be extracted{hint}")
    return result


def decode_text(data: bytes, content_type: str = "") -> str:
    """Bytes to text: the declared charset, else a BOM, else UTF-8, else Windows-1252."""
    match = re.search(r"charset=([\w.-]+)", content_type or "", re.IGNORECASE)
    candidates = [match.group(1)] if match else []
    if data.startswith((b"\xff\xfe", b"\xfe\xff")):
        candidates.append("utf-16")
    candidates += ["utf-8-sig", "cp1252"]
    for encoding in candidates:
        try:
            return data.decode(encoding)
        except (UnicodeDecodeError, LookupError):
            continue
    return data.decode("latin-1")


_SPACES = re.compile(r"[ \t\f\v\u00a0]{2,}|[\t\f\v\u00a0]")  # single spaces are left alone: faster
_BLANKS = re.compile(r"\n{3,}")
_EDGES = re.compile(r" ?\n ?")  # spaces around line ends (runs of spaces are single by then)
_ODD_SPACES = ("\t", "\f", "\v", "\u00a0")


def normalize_text(text: str) -> str:
    """Unix newlines, no NUL (Postgres text cannot hold it), no trailing spaces, at most one blank line."""
    text = text.replace("\r\n", "\n").replace("\r", "\n").replace("\x00", "")
    # each pattern runs only when a substring test (C speed) says it can match: the regexes cost
    # about 30 us per 1,000 characters even when they change nothing, more than chunking the text
    if "  " in text or any(space in text for space in _ODD_SPACES):
        text = _SPACES.sub(" ", text)
    if " \n" in text or "\n " in text:
        text = _EDGES.sub("\n", text)
    if "\n\n\n" in text:
        text = _BLANKS.sub("\n\n", text)
    return text.strip()


# ----------------------------------------------------------------------------------------------- html

_STRIP_TAGS = ("script", "style", "noscript", "template", "svg", "canvas", "iframe", "form", "button", "nav",
               "header", "footer", "aside", "menu", "dialog")
_STRIP_ROLES = ("navigation", "banner", "contentinfo", "complementary", "search", "menu", "menubar", "dialog")
_STRIP_HINTS = re.compile(r"(^|[\s_-])(nav|navbar|menu|breadcrumbs?|sidebar|footer|header|cookie|banner|"
                          r"advert|ads|social|share|skip-link)([\s_-]|$)", re.IGNORECASE)
_BLOCKS = ("p", "div", "section", "article", "main", "li", "ul", "ol", "dl", "dt", "dd", "table", "tr",
           "blockquote", "pre", "figure", "figcaption", "h1", "h2", "h3", "h4", "h5", "h6", "hr", "address")


def extract_html(html: str) -> Extracted:
    """The main content of a page: scripts, navigation, header, footer and asides removed; the
    <main> or largest <article> when the page has one; headings kept as markdown headings."""
    from bs4 import BeautifulSoup

    soup = BeautifulSoup(html, "html.parser")
    title = ""
    meta = soup.find("meta", attrs={"property": "og:title"})
    if meta and meta.get("content"):
        title = meta["content"].strip()
    elif soup.title and soup.title.string:
        title = soup.title.string.strip()

    for tag in soup(_STRIP_TAGS):
        tag.decompose()
    for tag in soup.find_all(attrs={"role": True}):
        if not tag.decomposed and tag.get("role", "").lower() in _STRIP_ROLES:
            tag.decompose()
    for tag in soup.find_all(attrs={"aria-hidden": "true"}):
        if not tag.decomposed:
            tag.decompose()
    for tag in soup.find_all(class_=_STRIP_HINTS):
        if not tag.decomposed and tag.name not in ("body", "main", "article", "html"):
            tag.decompose()

    root = soup.find("main") or max(soup.find_all("article"), key=lambda a: len(a.get_text()), default=None) \
        or soup.body or soup
    for level in range(1, 7):
        for heading in root.find_all(f"h{level}"):
            heading.insert(0, "#" * level + " ")
    for br in root.find_all("br"):
        br.replace_with("\n")
    for cell in root.find_all(("td", "th")):
        cell.append(" | ")
    for block in root.find_all(_BLOCKS):
        block.insert_before("\n\n")
        block.insert_after("\n\n")
    text = normalize_text(root.get_text())
    text = re.sub(r"\s*\|\s*$", "", text, flags=re.MULTILINE)  # trailing cell separators
    if not title:
        h1 = soup.find("h1")
        title = h1.get_text(" ", strip=True).lstrip("# ") if h1 else ""
    return Extracted(text, HTML, title[:300])


# ------------------------------------------------------------------------------------------------ csv


def _csv(text: str) -> str:
    """One line per row, `column: value` pairs, so each chunk is readable on its own."""
    try:
        dialect = csv.Sniffer().sniff(text[:4096], delimiters=",;\t|")
    except csv.Error:
        dialect = csv.excel
    rows = list(csv.reader(io.StringIO(text), dialect))
    rows = [row for row in rows if any(cell.strip() for cell in row)]
    if not rows:
        return ""
    header = [cell.strip() for cell in rows[0]]
    lines = []
    for row in rows[1:]:
        pairs = [f"{header[i] if i < len(header) and header[i] else f'column {i + 1}'}: {cell.strip()}"
                 for i, cell in enumerate(row) if cell.strip()]
        lines.append("; ".join(pairs))
    if not lines:  # a header alone
        lines = ["; ".join(header)]
    return normalize_text("\n".join(lines))


# ------------------------------------------------------------------------------------------------ pdf


def _pdf(data: bytes) -> Extracted:
    from pypdf import PdfReader
    from pypdf.errors import PdfReadError

    try:
        reader = PdfReader(io.BytesIO(data))
        if reader.is_encrypted and not reader.decrypt(""):
            raise ExtractionError("the PDF is password-protected")
        pages = [page.extract_text() or "" for page in reader.pages]
        title = ""
        if reader.metadata is not None and reader.metadata.title:
            title = str(reader.metadata.title).strip()
    except PdfReadError as exc:
        raise ExtractionError(f"could not read the PDF: {exc}") from exc
    return Extracted(normalize_text("\n\n".join(pages)), PDF, title[:300])


# ----------------------------------------------------------------------------------------------- docx


def _docx(data: bytes) -> Extracted:
    import docx
    from docx.document import Document as DocumentType
    from docx.table import Table
    from docx.text.paragraph import Paragraph

    document: DocumentType = docx.Document(io.BytesIO(data))
    blocks: list[str] = []
    for item in document.iter_inner_content():
        if isinstance(item, Paragraph):
            text = item.text.strip()
            if not text:
                continue
            style = (item.style.name if item.style is not None else "") or ""
            match = re.match(r"Heading (\d)", style)
            if match:
                text = "#" * int(match.group(1)) + " " + text
            elif style == "Title":
                text = "# " + text
            elif style.startswith("List"):
                text = "- " + text
            blocks.append(text)
        elif isinstance(item, Table):
            rows = [" | ".join(cell.text.strip() for cell in row.cells) for row in item.rows]
            blocks.append("\n".join(row for row in rows if row.strip(" |")))
    title = (document.core_properties.title or "").strip()
    return Extracted(normalize_text("\n\n".join(blocks)), DOCX, title[:300])
