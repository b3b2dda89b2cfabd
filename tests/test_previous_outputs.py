"""The stages' one re-use path: what a build writes must be declared beside its asset."""

import pandas as pd
import pytest

from radharmony_pipeline.defs.previous_outputs import StageOutput, tables_reused_or_built


def test_a_build_writing_undeclared_metadata_fails_naming_the_entry(tmp_path):
    output = StageOutput("bboxes", ("boxes",))

    def build():
        return {"bboxes": (pd.DataFrame({"x": [1]}), {"boxes": 1, "sheet": "x.png"})}

    # No fingerprint: nothing to re-use, the stage builds.
    with pytest.raises(ValueError, match=r"\['sheet'\].*bboxes|bboxes.*\['sheet'\]"):
        tables_reused_or_built(None, [output], None, tmp_path, build)


def test_a_build_gets_the_reuse_marks_on_every_output(tmp_path):
    outputs = [StageOutput("raw_index", ("status",)), StageOutput("labels", ("counts",))]
    built = tables_reused_or_built(
        None,
        outputs,
        None,
        tmp_path,
        lambda: {
            "raw_index": (pd.DataFrame({"a": [1]}), {"status": 1}),
            "labels": (pd.DataFrame({"b": [2]}), {"counts": 2}),
        },
    )
    assert built["raw_index"][1] == {"status": 1, "input_fingerprint": None, "reused": False}
    assert built["labels"][1] == {"counts": 2, "input_fingerprint": None, "reused": False}
