"""The tier rules of tests/tiers.py: a module is skipped only when no test in it could be
selected, its markers are read as written, and the unimported-modules check names each side."""

from __future__ import annotations

import pytest
import tiers

FAST = "not build and not slow and not cluster and not browser"


@pytest.mark.parametrize(
    ("markexpr", "markers", "excluded"),
    [
        (FAST, {"cluster"}, True),
        (FAST, {"build", "timeout"}, True),
        (FAST, {"timeout"}, False),
        (FAST, set(), False),
        ("cluster", {"cluster"}, False),
        ("not cluster", {"cluster"}, True),
        # A test of a `cluster` module may add `build` itself: the module must be collected.
        ("build or slow", {"cluster"}, False),
        ("build and not cluster", {"cluster"}, True),
        # More than names, and, or, not: never skipped, pytest decides per test.
        ("build(kind=1)", {"cluster"}, False),
        ("not (", {"cluster"}, False),
    ],
)
def test_a_module_is_skipped_only_when_no_test_of_it_could_be_selected(markexpr, markers, excluded):
    assert tiers.excludes_every_test(markexpr, markers) is excluded


def test_module_markers_are_read_from_pytestmark_as_written(tmp_path):
    single = tmp_path / "test_single.py"
    single.write_text("import pytest\npytestmark = pytest.mark.cluster\n")
    several = tmp_path / "test_several.py"
    several.write_text(
        "import pytest\npytestmark = [pytest.mark.build, pytest.mark.skipif(True, reason='x')]\n"
    )
    none = tmp_path / "test_none.py"
    none.write_text("import pytest\n\n@pytest.mark.slow\ndef test_x():\n    pass\n")
    assert tiers.module_markers(single) == {"cluster"}
    assert tiers.module_markers(several) == {"build", "skipif"}
    assert tiers.module_markers(none) == set()


def test_the_unimported_modules_check_names_the_unlisted_and_the_stale():
    every = tiers.package_modules()
    assert "radharmony_pipeline.processing.imaging.decode" in every
    assert "radharmony_pipeline" in every and "radharmony_pipeline.processing" in every
    runner = "radharmony_pipeline.operations.runner"
    agreed, lines = tiers.unimported_modules_report(every - {runner}, {runner})
    assert agreed and runner in lines[0]
    agreed, lines = tiers.unimported_modules_report(every - {runner}, set())
    assert not agreed and runner in lines[1] and "not listed" in lines[1]
    agreed, lines = tiers.unimported_modules_report(every, {runner})
    assert not agreed and runner in lines[1] and "but imported" in lines[1]
