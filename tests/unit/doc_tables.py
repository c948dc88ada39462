"""Reading a table from a section of a Markdown page (the tests that hold the docs to the code)."""

from __future__ import annotations


def section_rows(markdown: str, section: str, doc_name: str) -> list[str]:
    """The table rows (lines starting with ``|``) of `section` (a ``## `` heading line) up to the
    next ``## ``, header and separator included.

    Raises
    ------
    ValueError
        If the page has no such section.
    """
    lines = markdown.splitlines()
    try:
        start = lines.index(section)
    except ValueError as e:
        raise ValueError(f"{doc_name} has no {section!r} section") from e
    rows = []
    for line in lines[start + 1:]:
        if line.startswith("## "):
            break
        if line.startswith("|"):
            rows.append(line)
    return rows
