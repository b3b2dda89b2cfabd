"""The profile's report-length panel counts words as Python's str.split() does."""

from __future__ import annotations

import random

import pandas as pd

from radharmony_pipeline.processing.corpus.profile_plots import words_per_report

# Python's own whitespace (Unicode spaces, separators, control characters) and a few
# characters that look like it but are not.
_WHITESPACE = [" ", "\t", "\n", "\r", "\x0b", "\x0c", "\x1c", "\x1f", "\x85", "\u00a0",
               "\u2003", "\u2028", "\u3000"]  # fmt: skip
_NOT_WHITESPACE = ["a", "é", "肺", "\u200b", "-", ".", "0"]


def test_words_per_report_counts_as_str_split_on_unicode_text():
    generator = random.Random(30)
    reports = ["", "   ", "one", " lead and trail ", "x\u00a0y\u2003z", "a\x1cb\x85c"]
    for _ in range(2000):
        length = generator.randrange(0, 12)
        reports.append(
            "".join(generator.choice(_WHITESPACE + _NOT_WHITESPACE) for _ in range(length))
        )
    expected = [len(report.split()) for report in reports]
    assert words_per_report(pd.Series(reports)).tolist() == expected
    # Images without a report are left out.
    with_gaps = pd.Series([None, *reports, None], dtype="string")
    assert words_per_report(with_gaps).tolist() == expected
