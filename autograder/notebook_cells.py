"""What a notebook cell is to the grader: its nbgrader metadata (grade id, test, manual, read-only,
points) and the hidden-test blocks of its source."""
from __future__ import annotations


def _nbg(cell) -> dict:
    return cell.get("metadata", {}).get("nbgrader", {}) or {}


def grade_id(cell) -> str | None:
    return _nbg(cell).get("grade_id")


def is_test_cell(cell) -> bool:
    """An autograded test cell: graded, not an answer."""
    m = _nbg(cell)
    return bool(m.get("grade")) and not m.get("solution") and cell.get("cell_type") == "code"


def is_manual_cell(cell) -> bool:
    m = _nbg(cell)
    return bool(m.get("grade")) and (bool(m.get("solution")) or cell.get("cell_type") != "code")


def is_protected(cell) -> bool:
    """Restored from the source: tests and read-only cells."""
    m = _nbg(cell)
    return bool(m.get("locked")) or is_test_cell(cell)


def points(cell) -> float:
    try:
        return float(_nbg(cell).get("points", 0) or 0)
    except (TypeError, ValueError):
        return 0.0


HIDDEN_BEGIN, HIDDEN_END = "### BEGIN HIDDEN TESTS", "### END HIDDEN TESTS"


def hidden_line_ranges(source: str) -> list[tuple[int, int]]:
    """(first, last) 1-based line numbers of each hidden-tests block, markers included; an
    unterminated block runs to the end. One pass over the lines: linear in the cell's size."""
    ranges, start = [], None
    lines = source.split("\n")
    for number, line in enumerate(lines, 1):
        stripped = line.strip()
        if start is None and stripped.startswith(HIDDEN_BEGIN):
            start = number
        elif start is not None and stripped.startswith(HIDDEN_END):
            ranges.append((start, number))
            start = None
    if start is not None:
        ranges.append((start, len(lines)))
    return ranges


def without_hidden(source: str) -> str:
    """The cell as the release shows it (hidden-tests blocks removed)."""
    ranges = hidden_line_ranges(source)
    if not ranges:
        return source
    lines = source.split("\n")
    hidden = set()
    for first, last in ranges:
        hidden.update(range(first, last + 1))
    return "\n".join(line for number, line in enumerate(lines, 1) if number not in hidden)


def hidden_lines(source: str) -> list[str]:
    lines = source.split("\n")
    out = []
    for first, last in hidden_line_ranges(source):
        out += [lines[i - 1].strip() for i in range(first + 1, last) if len(lines[i - 1].strip()) >= 8]
    return out


def normalised(source: str) -> str:
    """A cell's source with its whitespace normalised (trailing spaces and blank lines dropped)."""
    return "\n".join(line.rstrip() for line in source.strip().splitlines() if line.strip())


def _visible(source: str) -> str:
    """A test cell as the release shows it: hidden tests removed, whitespace normalised."""
    return normalised(without_hidden(source))
