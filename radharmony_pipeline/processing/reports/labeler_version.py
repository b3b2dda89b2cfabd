"""The report labeler's version, derived from what decides its labels, apart from the labeler so
that the definitions name it without importing spaCy."""

from __future__ import annotations

import hashlib
from importlib import metadata
from pathlib import Path

# The modules whose text decides the labels: the phrase lists, the rules, the section rules.
RULE_MODULES: tuple[str, ...] = ("phrases.py", "labeler.py", "sections.py")
# The libraries whose behaviour decides them too (negspacy ships the NegEx termset).
RULE_LIBRARIES: tuple[str, ...] = ("spacy", "negspacy")


def labeler_version(rule_texts: dict[str, str], library_versions: dict[str, str]) -> str:
    """`report-rules-<digest>`: the SHA-256 of the rule modules' texts and the libraries'
    versions, so that any change to a phrase, a rule or a library gives a new version."""
    digest = hashlib.sha256()
    for name, text in sorted({**rule_texts, **library_versions}.items()):
        digest.update(f"{name}\0{text}\0".encode())
    return f"report-rules-{digest.hexdigest()[:16]}"


def installed_labeler_version() -> str:
    """The version of the labeler as installed: its modules' texts and its libraries."""
    here = Path(__file__).parent
    texts = {name: (here / name).read_text(encoding="utf-8") for name in RULE_MODULES}
    return labeler_version(texts, {name: metadata.version(name) for name in RULE_LIBRARIES})


# It keys the stored report labels and is part of the report_labels asset's code version.
LABELER_VERSION = installed_labeler_version()
