"""is_in answers as pandas' isin does, on the string columns it replaces it for."""

from __future__ import annotations

import random

import pandas as pd
import pytest

from radharmony_pipeline.processing.tables.membership import is_in


@pytest.mark.parametrize("dtype", ["string", "str", object])
def test_is_in_equals_pandas_isin_with_nulls_and_empty_columns(dtype):
    generator = random.Random(7)
    words = ["rexgradient__a", "rexgradient__b", "", "é", None]
    for _ in range(200):
        values = pd.Series(generator.choices(words, k=generator.randrange(0, 30)), dtype=dtype)
        among = pd.Series(generator.choices(words, k=generator.randrange(0, 6)), dtype=dtype)
        assert is_in(values, among).tolist() == values.isin(among).tolist()
