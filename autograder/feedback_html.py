"""The HTML feedback page of one graded notebook: every piece of student text is inert.

Everything on the page except the grader's own words came from a sandbox or from the submission
(cell sources, outputs, file names, check messages that quote the student's values), so:

- every text is escaped with `html.escape(quote=True)` and shown in element content, never in an
  attribute; the only attribute values that vary are the `data:` URIs of images;
- an image is shown only if its base64 decodes strictly and the bytes start with PNG's or JPEG's
  signature; the page embeds the grader's own re-encoding of those bytes, never the student's text;
- HTML, SVG, JavaScript, Markdown and any other rich output is not rendered: its `text/plain`
  (escaped) is shown instead, or a note saying what was left out;
- a strict Content-Security-Policy (no script, no network, only `data:` images and the page's own
  stylesheet, pinned by its hash) makes the page inert even if an escape were ever missed;
- what the sandbox caps (outputs per cell, characters, image size) is capped again here: the
  sandbox's files are writable by the student's code.
"""
from __future__ import annotations

import base64
import binascii
import hashlib
import html
import re
from pathlib import Path

_CSS = """body{font-family:system-ui,sans-serif;max-width:60em;margin:2em auto;color:#222}
pre{background:#f6f8fa;padding:.6em;overflow-x:auto;white-space:pre-wrap}
.cell{border-left:4px solid #ddd;margin:1em 0;padding-left:.8em}
.pass{border-color:#2da44e}.fail{border-color:#cf222e}.md{color:#444}
.score{font-weight:bold}.out{background:#fff;border:1px solid #eee}.err{background:#ffebe9}
table{border-collapse:collapse}td,th{border:1px solid #ccc;padding:.3em .6em;text-align:left}
.pair{display:grid;grid-template-columns:1fr 1fr;gap:.6em}.pair pre{margin:0}"""

# The only style the page may use is the one above: CSP pins it by its hash (no 'unsafe-inline').
_CSS_HASH = base64.b64encode(hashlib.sha256(_CSS.encode("utf-8")).digest()).decode("ascii")
CSP = (f"default-src 'none'; img-src data:; style-src 'sha256-{_CSS_HASH}'; base-uri 'none'; "
       "form-action 'none'")

MAX_OUTPUTS_SHOWN = 50  # per cell
MAX_TEXT_CHARS = 100_000  # per output (head and tail kept)
MAX_IMAGE_CHARS = 3_000_000  # base64 of one image (the sandbox's 2 MB cap, with line breaks)
MAX_COPY_CHARS = 20_000  # each side of a copy's evidence
MAX_MIME_NAME = 60

# Decoded bytes must start with one of these to be shown as that image type.
_IMAGE_SIGNATURES = {"image/png": (b"\x89PNG\r\n\x1a\n",), "image/jpeg": (b"\xff\xd8\xff",)}
_BASE64_SPACE = re.compile(r"\s+")


def _ansi_free(text: str) -> str:
    return re.sub(r"\x1b\[[0-9;]*m", "", text)


def _text(value) -> str:
    """An nbformat text field (a string or a list of strings); anything else is not text: ''."""
    if isinstance(value, str):
        return value
    if isinstance(value, list) and all(isinstance(x, str) for x in value):
        return "".join(value)
    return ""


def _capped(text: str, limit: int = MAX_TEXT_CHARS) -> str:
    if len(text) <= limit:
        return text
    half = limit // 2
    return f"{text[:half]}\n[... output cut: {len(text) - limit} characters over the limit ...]\n{text[-half:]}"


def image_data_uri(mime: str, value) -> str | None:
    """`data:<mime>;base64,...` of the grader's own encoding of the decoded bytes, or None if the
    value is not strict base64 of an image of that type (e.g. `x' onerror='alert(1)`, an SVG)."""
    signatures = _IMAGE_SIGNATURES.get(mime)
    text = _text(value)
    if signatures is None or not text or len(text) > MAX_IMAGE_CHARS:
        return None
    try:
        raw = base64.b64decode(_BASE64_SPACE.sub("", text), validate=True)
    except (binascii.Error, ValueError):
        return None
    if not raw.startswith(signatures):
        return None
    return f"data:{mime};base64,{base64.b64encode(raw).decode('ascii')}"


def _rich_output(data, esc) -> str:
    """An execute_result / display_data: a checked PNG/JPEG, else its plain text, else a note."""
    if not isinstance(data, dict):
        return "<p class=md>(an output the grader could not read: not shown)</p>"
    for mime in _IMAGE_SIGNATURES:
        if mime in data:
            uri = image_data_uri(mime, data[mime])
            if uri is not None:
                return f'<img alt="" src="{html.escape(uri, quote=True)}">'
    text = _text(data.get("text/plain"))
    left_out = [str(m)[:MAX_MIME_NAME] for m in data if m != "text/plain"][:10]
    note = ""
    if left_out:
        note = ("<p class=md>(not rendered: " + esc(", ".join(left_out)) +
                "; the page shows text and checked PNG/JPEG images only)</p>")
    if text:
        return f"<pre class=out>{esc(_capped(text))}</pre>" + note
    return note


def _output(out, esc) -> str:
    if not isinstance(out, dict):
        return ""
    kind = out.get("output_type")
    if kind == "stream":
        return f"<pre class=out>{esc(_capped(_text(out.get('text'))))}</pre>"
    if kind == "error":
        tb = "\n".join(x for x in out.get("traceback", []) if isinstance(x, str)) \
            if isinstance(out.get("traceback"), list) else ""
        tb = tb or f"{str(out.get('ename'))[:200]}: {str(out.get('evalue'))[:2000]}"
        return f"<pre class='out err'>{esc(_ansi_free(_capped(tb)))}</pre>"
    if kind in ("execute_result", "display_data"):
        return _rich_output(out.get("data"), esc)
    return ""


def _copies(entry: dict, esc) -> list[str]:
    """Each suspected copy: where, what it matches, and the two pieces of code side by side."""
    items = entry.get("copies", [])
    if not isinstance(items, list) or not items:
        return []
    parts = ["<h2>Possible copies (for review)</h2>"]
    for item in items[:50]:
        if not isinstance(item, dict):
            continue
        field = lambda key: str(item.get(key, ""))  # noqa: E731
        parts.append(f"<div class=cell><p><b>{esc(field('where')[:500])}</b> matches "
                     f"<b>{esc(field('matched')[:500])}</b></p><div class=pair>"
                     f"<pre>{esc(_capped(field('student_code'), MAX_COPY_CHARS))}</pre>"
                     f"<pre>{esc(_capped(field('matched_code'), MAX_COPY_CHARS))}</pre></div></div>")
    return parts


def render_html(entry: dict, nb) -> str:
    """A self-contained feedback page: the score table, then every cell with its outputs. Test cells
    show their visible part only and no outputs (their feedback instead); any line of a hidden test
    that turns up in an output (a student's cell printing the notebook it runs in) is blanked."""
    from .notebook_cells import grade_id, hidden_line_ranges, is_test_cell, without_hidden
    from .verdict import Redactor

    hidden = (nb.metadata.get("autograder", {}) if nb is not None else {}).get("hidden_lines", [])
    redact = Redactor(hidden if isinstance(hidden, list) else [])
    esc = lambda text: html.escape(redact(str(text)), quote=True)  # noqa: E731
    name = esc(Path(str(entry.get("path", ""))).name)
    parts = ["<!doctype html><html lang=en><head><meta charset=utf-8>",
             f'<meta http-equiv="Content-Security-Policy" content="{CSP}">',
             f"<title>Feedback: {name}</title><style>{_CSS}</style></head><body>",
             f"<h1>{name}</h1><p class=score>Score: {entry['score']:g} / {entry['max_score']:g}</p>"]
    for key, title in (("errors", "Problems"), ("integrity", "Integrity"), ("flags", "Flagged for review")):
        if entry.get(key):
            parts.append(f"<p class=err><b>{title}:</b> " + esc("; ".join(map(str, entry[key]))) + "</p>")
    parts.append("<table><tr><th>test cell</th><th>points</th><th>result</th><th>feedback</th></tr>")
    for c in entry["cells"]:
        parts.append(f"<tr><td>{esc(c['grade_id'])}</td><td>{c['score']:g} / {c['max_score']:g}</td>"
                     f"<td>{esc(c['status'])}</td><td>{esc(str(c['feedback'])[:300])}</td></tr>")
    parts.append("</table>")
    parts += _copies(entry, esc)
    results = {c["grade_id"]: c for c in entry["cells"]}
    # From the first test cell with hidden tests on, the student's code has seen the hidden inputs
    # (and IPython's input history holds the hidden code): what it printed is not shown.
    after_hidden = False
    for cell in (nb.cells if nb is not None else []):
        source = _text(cell.get("source"))
        if cell.get("cell_type") == "markdown":
            parts.append(f"<div class='cell md'><pre>{esc(source)}</pre></div>")
            continue
        if cell.get("cell_type") != "code":
            continue
        test = is_test_cell(cell)
        result = results.get(grade_id(cell)) if test else None
        klass = "" if result is None else ("pass" if result["passed"] else "fail")
        parts.append(f"<div class='cell {klass}'>")
        if result is not None:
            parts.append(f"<p class=score>{esc(result['grade_id'])}: {result['score']:g} / "
                         f"{result['max_score']:g}</p>")
        parts.append(f"<pre>{esc(without_hidden(source) if test else source)}</pre>")
        outputs = cell.get("outputs") if isinstance(cell.get("outputs"), list) else []
        if after_hidden and not test and outputs:
            parts.append("<p class=md>(outputs of cells run after a hidden test are not shown here: they could "
                         "carry the hidden test's inputs)</p>")
        if not test and not after_hidden:
            parts += [_output(out, esc) for out in outputs[:MAX_OUTPUTS_SHOWN]]
            if len(outputs) > MAX_OUTPUTS_SHOWN:
                parts.append(f"<p class=md>({len(outputs) - MAX_OUTPUTS_SHOWN} more outputs not shown)</p>")
        if result is not None and result["feedback"]:
            parts.append(f"<p class=err>{esc(result['feedback'])}</p>")
        parts.append("</div>")
        after_hidden = after_hidden or (test and bool(hidden_line_ranges(source)))
    parts.append("</body></html>")
    return "\n".join(parts)
