"""The run-settings resource: run config first, each RADHARMONY_* variable as its default,
validated once; the executor chosen there; nothing below defs/ reads the environment."""

from __future__ import annotations

import os
import re
from pathlib import Path

import dagster as dg
import pytest
from pool_work import sleep_for

import radharmony_pipeline
from radharmony_pipeline import settings
from radharmony_pipeline.defs.resources import pipeline_resources
from radharmony_pipeline.defs.run_settings import RunSettingsResource, validate_environment
from radharmony_pipeline.processing.execution.cluster import DaskCluster, LocalPool
from radharmony_pipeline.processing.execution.parallel import map_with_time_limit
from radharmony_pipeline.processing.execution.supervised import TimeLimit

VARIABLES = (
    settings.WORKERS_VARIABLE,
    settings.TIMEOUT_VARIABLE,
    settings.SCHEDULER_VARIABLE,
    settings.UNREADABLE_LIMIT_VARIABLE,
    settings.STRICT_VARIABLE,
    settings.PARENT_LEAKS_VARIABLE,
)
RUN_SETTINGS_PAGE = Path(radharmony_pipeline.__file__).parents[1] / "docs" / "run-settings.md"


@pytest.fixture
def clean(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for variable in VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    return monkeypatch


def test_unset_variables_give_the_documented_defaults(clean) -> None:
    run = RunSettingsResource()
    assert run.workers == settings.worker_count({})
    assert run.job_timeout_seconds == settings.DEFAULT_TIMEOUT_SECONDS
    assert run.dask_scheduler is None
    assert run.unreadable_limit == settings.DEFAULT_UNREADABLE_LIMIT
    assert run.parent_leaks == "warn" and not run.parent_leaks_block()
    assert run.strict is False
    assert run.executor() == LocalPool(run.workers)


def test_every_variable_is_the_default_and_run_config_wins(clean) -> None:
    clean.setenv(settings.WORKERS_VARIABLE, "3")
    clean.setenv(settings.TIMEOUT_VARIABLE, "7.5")
    clean.setenv(settings.SCHEDULER_VARIABLE, " tcp://10.0.0.5:8786 ")
    clean.setenv(settings.UNREADABLE_LIMIT_VARIABLE, "0.25")
    clean.setenv(settings.PARENT_LEAKS_VARIABLE, "BLOCK")
    clean.setenv(settings.STRICT_VARIABLE, "true")
    run = RunSettingsResource()
    assert (run.workers, run.job_timeout_seconds, run.unreadable_limit) == (3, 7.5, 0.25)
    assert run.strict is True
    assert run.parent_leaks_block()
    assert run.executor() == DaskCluster("tcp://10.0.0.5:8786")
    given = RunSettingsResource(
        workers=2,
        job_timeout_seconds=9,
        dask_scheduler="",
        unreadable_limit=1,
        parent_leaks="warn",
        strict=False,
    )
    assert given.executor() == LocalPool(2)
    assert given.time_limit(str).seconds == 9
    assert given.unreadable_limit == 1 and not given.parent_leaks_block() and not given.strict


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        (settings.WORKERS_VARIABLE, "two"),
        (settings.TIMEOUT_VARIABLE, "-1"),
        (settings.UNREADABLE_LIMIT_VARIABLE, "1.5"),
        (settings.PARENT_LEAKS_VARIABLE, "sometimes"),
        (settings.STRICT_VARIABLE, "maybe"),
    ],
)
def test_a_bad_variable_stops_the_resource_naming_it(clean, variable, value) -> None:
    clean.setenv(variable, value)
    with pytest.raises(settings.ConfigurationError, match=variable):
        RunSettingsResource()
    with pytest.raises(settings.ConfigurationError, match=variable):
        settings.validate_settings({variable: value})


@pytest.mark.parametrize(
    "config",
    [
        {"workers": 0},
        {"job_timeout_seconds": 0},
        {"job_timeout_seconds": float("inf")},
        {"unreadable_limit": 1.01},
        {"parent_leaks": "sometimes"},
    ],
)
def test_bad_run_config_is_refused(clean, config) -> None:
    with pytest.raises(Exception, match=next(iter(config))):
        RunSettingsResource(**config)


def test_the_resource_is_in_the_launchpad_with_a_description_per_field(clean) -> None:
    resource = pipeline_resources()["run_settings"]
    assert isinstance(resource, RunSettingsResource)
    fields = resource.get_resource_definition().config_schema.config_type.fields
    expected = set(RunSettingsResource.model_fields)
    assert set(fields) == expected
    for name in expected:
        assert fields[name].description, name
    # Each description names the variable its default comes from.
    described = " ".join(fields[name].description for name in expected)
    for variable in VARIABLES:
        assert variable in described


def test_the_run_settings_page_lists_every_field_with_its_variable() -> None:
    rows = re.findall(r"^\| `(\w+)` \| `(RADHARMONY_\w+)` \|$", RUN_SETTINGS_PAGE.read_text(), re.M)
    assert {field for field, _ in rows} == set(RunSettingsResource.model_fields)
    for field, variable in rows:
        assert variable in RunSettingsResource.model_fields[field].description, field


def test_the_time_limit_names_where_it_is_set_and_the_generic_pool_names_nothing(clean) -> None:
    assert RunSettingsResource(job_timeout_seconds=1).time_limit(str).exceeded() == (
        f"took longer than 1 s ({settings.TIMEOUT_VARIABLE}); stopped"
    )
    generic = TimeLimit(1.0, lambda item, reason: reason)
    assert generic.exceeded() == "took longer than 1 s; stopped"
    assert "RADHARMONY" not in map_with_time_limit(sleep_for, [5.0], 1, generic)[0]


def test_nothing_below_defs_reads_the_environment() -> None:
    package = Path(radharmony_pipeline.__file__).parent
    reads = re.compile(r"\bos\.environ\b|\bgetenv\b|\bos\.environb\b")
    found = [
        f"{path.relative_to(package)}:{number}: {line.strip()}"
        for folder in ("sources", "processing")
        for path in sorted((package / folder).rglob("*.py"))
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if reads.search(line)
    ]
    assert not found, found


def test_the_definitions_carry_the_run_settings(clean) -> None:
    from radharmony_pipeline.definitions import build_definitions

    definitions = build_definitions()
    assert isinstance(definitions, dg.Definitions)
    assert isinstance(definitions.resources["run_settings"], RunSettingsResource)


# --- settings.py's parsers: blank means the default, a bad value names its variable -----------


@pytest.mark.parametrize("variable", list(settings.PARSERS))
@pytest.mark.parametrize("blank", ["", "   ", "\t"])
def test_a_blank_variable_means_the_default(variable, blank) -> None:
    parse = settings.PARSERS[variable]
    assert parse({variable: blank}) == parse({})
    settings.validate_settings({variable: blank})


@pytest.mark.parametrize(
    ("variable", "value"),
    [
        # Numbers within bounds.
        (settings.IMAGE_SIZE_VARIABLE, "0"),
        (settings.IMAGE_SIZE_VARIABLE, str(settings.MAX_IMAGE_SIZE + 1)),
        (settings.IMAGE_SIZE_VARIABLE, "big"),
        (settings.WORKERS_VARIABLE, "0"),
        (settings.WORKERS_VARIABLE, "1.5"),
        (settings.TIMEOUT_VARIABLE, "inf"),
        (settings.TIMEOUT_VARIABLE, "nan"),
        (settings.UNREADABLE_LIMIT_VARIABLE, "-0.1"),
        (settings.UNREADABLE_LIMIT_VARIABLE, "half"),
        # Choices.
        (settings.STRICT_VARIABLE, "2"),
        (settings.PARENT_LEAKS_VARIABLE, "error"),
        # Cron schedules.
        (settings.OBSERVE_CRON_VARIABLE, "nightly"),
        (settings.OBSERVE_CRON_VARIABLE, "0 2 * *"),
        (settings.OBSERVE_CRON_VARIABLE, "0 2 * * * *"),
        (settings.OBSERVE_CRON_VARIABLE, "0 25 * * *"),
        (settings.OBSERVE_CRON_VARIABLE, "0 2 0 * *"),
        (settings.OBSERVE_CRON_VARIABLE, "*/0 2 * * *"),
        (settings.OBSERVE_CRON_VARIABLE, "0 2 * foo *"),
    ],
)
def test_a_bad_value_of_each_kind_is_refused_naming_the_variable(variable, value) -> None:
    with pytest.raises(settings.ConfigurationError, match=f"^{variable} must be "):
        settings.PARSERS[variable]({variable: value})
    with pytest.raises(settings.ConfigurationError, match=variable):
        settings.validate_settings({variable: value})


@pytest.mark.parametrize(
    ("variable", "value", "message"),
    [
        (
            settings.IMAGE_SIZE_VARIABLE,
            " 0",
            "RADHARMONY_IMAGE_SIZE must be a whole number of pixels from 1 to 8192, got ' 0'",
        ),
        (
            settings.WORKERS_VARIABLE,
            "two",
            "RADHARMONY_WORKERS must be a positive integer, got 'two'",
        ),
        (
            settings.TIMEOUT_VARIABLE,
            "-1",
            "RADHARMONY_JOB_TIMEOUT must be a positive number of seconds per image, got '-1'",
        ),
        (
            settings.UNREADABLE_LIMIT_VARIABLE,
            "1.5",
            "RADHARMONY_UNREADABLE_LIMIT must be a share from 0 to 1 (e.g. 0.5), got '1.5'",
        ),
        (
            settings.STRICT_VARIABLE,
            " Maybe",
            "RADHARMONY_STRICT must be 1 or 0 (true or false), got 'maybe'",
        ),
        (
            settings.PARENT_LEAKS_VARIABLE,
            "Never ",
            "RADHARMONY_PARENT_LEAKS must be warn or block, got 'never'",
        ),
        (
            settings.OBSERVE_CRON_VARIABLE,
            "0 24 * * *",
            "RADHARMONY_OBSERVE_CRON must be a cron schedule of five fields (minute hour "
            "day-of-month month day-of-week, e.g. '0 2 * * *'), got '0 24 * * *': croniter "
            "cannot read it",
        ),
    ],
)
def test_each_message_names_the_variable_the_rule_and_the_value(variable, value, message) -> None:
    with pytest.raises(settings.ConfigurationError) as refused:
        settings.PARSERS[variable]({variable: value})
    assert str(refused.value) == message


@pytest.mark.parametrize(
    "cron",
    [
        "0 2 * * *",
        " 30 1 * * 1-5 ",
        "*/15 0-6/2 1,15 jan-mar mon-fri",
        "0 3 L * ?",
        "0 3 * * sun#1",
        "@daily",
    ],
)
def test_a_valid_cron_is_the_schedule(cron) -> None:
    variable = settings.OBSERVE_CRON_VARIABLE
    assert settings.observe_cron({variable: cron}) == cron.strip()


def test_unset_settings_are_their_defaults() -> None:
    assert settings.image_size({}) == settings.DEFAULT_IMAGE_SIZE
    assert settings.worker_count({}) == (os.cpu_count() or 1)
    assert settings.job_timeout({}) == settings.DEFAULT_TIMEOUT_SECONDS
    assert settings.dask_scheduler({}) is None
    assert settings.strict_mode({}) is False
    assert settings.unreadable_limit({}) == settings.DEFAULT_UNREADABLE_LIMIT
    assert settings.parent_leaks({}) == settings.DEFAULT_PARENT_LEAKS
    assert settings.observe_cron({}) == settings.DEFAULT_OBSERVE_CRON


def test_a_bad_cron_stops_the_definitions_before_they_load(clean) -> None:
    clean.setenv(settings.OBSERVE_CRON_VARIABLE, "every night")
    with pytest.raises(settings.ConfigurationError, match=settings.OBSERVE_CRON_VARIABLE):
        validate_environment()
