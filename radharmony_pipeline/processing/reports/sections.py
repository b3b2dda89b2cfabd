"""Which parts of a report text decide labels: the findings and impression sections, split into
the sentence-sized pieces the labeler reads one at a time."""

from __future__ import annotations

import re

# Section names whose text states what the radiologist saw.
READ_SECTIONS: tuple[str, ...] = (
    "findings and impressions",
    "findings and impression",
    "impression and findings",
    "findings/impressions",
    "findings/impression",
    "findings & impression",
    "findings",
    "finding",
    "impressions",
    "impression",
    "conclusions",
    "conclusion",
    "opinion",
)
# Section names whose text is a question, a history or a method, never a finding.
SKIPPED_SECTIONS: tuple[str, ...] = (
    "clinical indications",
    "clinical indication",
    "clinical information",
    "clinical history",
    "clinical data",
    "clinical details",
    "clinical question",
    "reason for examination",
    "reason for exam",
    "reason for study",
    "reason for request",
    "indications",
    "indication",
    "history",
    "comparisons",
    "comparison",
    "technique",
    "examination",
    "exam",
    "procedure",
    "type of study",
    "study",
    "recommendations",
    "recommendation",
    "notification",
    "addendum",
)


def _names_pattern(names: tuple[str, ...]) -> str:
    # Longest names first so "findings and impression" wins over "findings"; any run of spaces.
    ordered = sorted(names, key=len, reverse=True)
    return "|".join(re.escape(name).replace(r"\ ", r"\s+") for name in ordered)


_ALL_NAMES = _names_pattern(READ_SECTIONS + SKIPPED_SECTIONS)
# A header opens a line (with or without a colon) or follows a sentence's end (with a colon):
# "FINDINGS:\n...", "Findings\n...", "... history. IMPRESSION: ...".
_HEADER = re.compile(
    rf"(?im)(?:^[ \t]*(?P<line>{_ALL_NAMES})[ \t]*(?::|$)"
    rf"|(?<=[.!?])[ \t]+(?P<inline>{_ALL_NAMES})[ \t]*:)"
)
_READ = frozenset(READ_SECTIONS)

# Pieces: after a sentence's end (a question mark ends one when it follows a word: "? pneumonia"
# asks about what follows it), at a blank line, or at a line that starts a list item or a
# capitalised sentence. A wrapped line (next line in lower case) stays in its sentence.
_PIECE_BREAK = re.compile(
    r"(?<=[.!])\s+|(?<=\w\?)\s+|\n[ \t]*\n\s*|\n(?=[ \t]*(?:[-*•]|\d{1,2}[.)]\s|[A-Z]))"
)


def read_text(report: str) -> str | None:
    """The text that decides labels: the whole text when it has no section headers; the
    findings and impression sections (joined) when it has; None when it has headers but
    neither findings nor impression."""
    headers = list(_HEADER.finditer(report))
    if not headers:
        return report
    read = []
    for header, following in zip(headers, [*headers[1:], None], strict=True):
        name = re.sub(r"\s+", " ", (header["line"] or header["inline"]).lower())
        if name in _READ:
            end = following.start() if following is not None else len(report)
            read.append(report[header.end() : end])
    return "\n\n".join(read) if read else None


def sentence_pieces(text: str) -> list[str]:
    """`text` cut where a sentence certainly ends (the sentencizer may cut a piece further)."""
    return [piece for part in _PIECE_BREAK.split(text) if (piece := part.strip())]
