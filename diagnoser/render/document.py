"""A report for people as a few kinds of block (headings, paragraphs, lists, tables, a line
with a query), written out two ways: as terminal text, and as a markdown document (one
title, sections as headings, lists as lists, tables where the figures are tabular). The
text and the markdown come from the same blocks, never from each other.

Also the small words every renderer shares: `plural`, and `safe` for what the data names.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field

from gpunet.words import (
    plural,  # noqa: F401  (the renderers' one plural, shared with the analysis' notes)
    printable,
)

INDENT = "   "


def safe(text: str, markdown: bool = False) -> str:
    """A line of the report as it may be printed: control characters escaped (printable, the
    one escape the diagnoser and gpunet's commands share); in markdown,
    HTML tags neutralised (a label value `<script>` stays text in a rendered ticket)."""
    text = printable(text)
    return text.replace("&", "&amp;").replace("<", "&lt;") if markdown else text


@dataclass
class Heading:
    """A section. `lead`: the sentence that opens it; the terminal prints it on the
    heading's line ("Cost: 5.6 of 15.7 GPU-hours idle"), markdown as the section's first
    paragraph."""

    level: int  # 1: the title (one per document); 2: a section; 3: a section within one
    text: str
    lead: str = ""
    tight: bool = False  # on the terminal, right under the line above (a verdict under its window)


@dataclass
class Para:
    """A paragraph. `detail`: it belongs to the item above it (a finding's lines), indented
    on the terminal."""

    text: str
    detail: bool = False


@dataclass
class Items:
    """A list."""

    items: list[str]


@dataclass
class Table:
    header: list[str]
    rows: list[list[str]]
    right: set[int] = field(default_factory=set)  # columns of figures, aligned right


@dataclass
class Query:
    """A line that ends in something to copy (a PromQL query, a link): code in markdown."""

    label: str
    code: str
    link: bool = False  # a URL: a link in markdown


Block = Heading | Para | Items | Table | Query


def to_text(blocks: list[Block]) -> str:
    """The terminal's report: headings as plain lines, a blank line before each section."""
    lines: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            if lines and lines[-1] != "" and not b.tight:
                lines.append("")
            lines.append(f"{b.text}: {b.lead}" if b.lead else b.text)
        elif isinstance(b, Para):
            lines.append(INDENT + b.text if b.detail else b.text)
        elif isinstance(b, Items):
            lines += [f"{INDENT}- {item}" for item in b.items]
        elif isinstance(b, Table):
            lines += [INDENT + row for row in _aligned(b)]
        else:
            lines.append(f"{INDENT}{b.label}: {b.code}")
    return "\n".join(safe(line) for line in lines).rstrip() + "\n"


def _aligned(t: Table) -> list[str]:
    rows = [t.header, *t.rows]
    widths = [max(len(r[k]) for r in rows) for k in range(len(t.header))]
    return [
        "  ".join(cell.rjust(w) if k in t.right else cell.ljust(w) for k, (cell, w) in enumerate(zip(r, widths))).rstrip()
        for r in rows
    ]


def to_markdown(blocks: list[Block]) -> str:
    """A markdown document: `#` the title, `##`/`###` the sections, blank lines between
    blocks, lists and tables as markdown has them."""
    out: list[str] = []
    for b in blocks:
        if isinstance(b, Heading):
            out.append(f"{'#' * b.level} {_md(b.text)}")
            if b.lead:
                out.append(_md(b.lead))
        elif isinstance(b, Para):
            out.append(_md(b.text))
        elif isinstance(b, Items):
            out.append("\n".join(f"- {_md(item)}" for item in b.items))
        elif isinstance(b, Table):
            cells = [[_cell(c) for c in row] for row in (b.header, *b.rows)]
            rule = ["---:" if k in b.right else "---" for k in range(len(b.header))]
            out.append("\n".join("| " + " | ".join(row) + " |" for row in (cells[0], rule, *cells[1:])))
        elif b.link:
            out.append(f"{_md(b.label)}: <{safe(b.code).replace('>', '%3E')}>")
        else:
            out.append(f"{_md(b.label)}: {_code(b.code)}")
    return "\n\n".join(out).rstrip() + "\n"


def _md(text: str) -> str:
    return safe(text, markdown=True)


def _cell(text: str) -> str:
    return _md(text).replace("|", "\\|")


def _code(text: str) -> str:
    """An inline code span that holds any text: fenced by one more backtick than the longest
    run inside (a code span is text to a markdown renderer: no tag in it is markup)."""
    text = safe(text)
    fence = "`" * (max((len(run) for run in re.findall(r"`+", text)), default=0) + 1)
    pad = " " if text.startswith("`") or text.endswith("`") else ""
    return f"{fence}{pad}{text}{pad}{fence}"
