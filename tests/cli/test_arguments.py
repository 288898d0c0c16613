"""Configuration and argument parsing: pure functions, no server."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
import typer

from batchctl.config import DEFAULT_BASE_URL, ConfigError, settings_resolve
from batchctl.options import metadata_parse
from batchctl.usage import time_parse

NOW = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)


def test_an_option_wins_over_batchctl_variables_which_win_over_openai_ones():
    env = {"BATCHCTL_API_KEY": "b-key", "OPENAI_API_KEY": "o-key", "OPENAI_BASE_URL": "http://o/v1/"}
    assert settings_resolve(api_key=None, base_url=None, environ=env).api_key == "b-key"
    assert settings_resolve(api_key="opt", base_url=None, environ=env).api_key == "opt"
    assert settings_resolve(api_key=None, base_url=None, environ=env).base_url == "http://o/v1"
    only_openai = settings_resolve(api_key=None, base_url=None, environ={"OPENAI_API_KEY": "o-key"})
    assert (only_openai.api_key, only_openai.base_url) == ("o-key", DEFAULT_BASE_URL)


def test_no_key_anywhere_is_a_configuration_error_naming_the_variables():
    with pytest.raises(ConfigError, match="BATCHCTL_API_KEY or OPENAI_API_KEY"):
        settings_resolve(api_key=None, base_url=None, environ={"BATCHCTL_API_KEY": "  "})


def test_the_cli_without_a_key_says_so_and_exits_1(monkeypatch, tmp_path):
    from typer.testing import CliRunner

    from batchctl.main import app

    for name in ("BATCHCTL_API_KEY", "OPENAI_API_KEY"):
        monkeypatch.delenv(name, raising=False)
    result = CliRunner().invoke(app, ["status", "batch_1"])
    assert result.exit_code == 1
    assert "No API key" in result.stderr and "Traceback" not in result.output


def test_metadata_pairs():
    assert metadata_parse(None) is None
    assert metadata_parse(["team=ml", "note=a=b", "empty="]) == {"team": "ml", "note": "a=b", "empty": ""}
    with pytest.raises(typer.BadParameter, match="KEY=VALUE"):
        metadata_parse(["novalue"])
    with pytest.raises(typer.BadParameter):
        metadata_parse(["=x"])


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("1764000000", 1764000000),
        ("7d", int(NOW.timestamp()) - 7 * 86400),
        ("12h", int(NOW.timestamp()) - 12 * 3600),
        ("30m", int(NOW.timestamp()) - 30 * 60),
        ("2026-11-01", int(datetime(2026, 11, 1, tzinfo=UTC).timestamp())),
        ("2026-11-01T09:00+02:00", int(datetime(2026, 11, 1, 7, tzinfo=UTC).timestamp())),
    ],
)
def test_usage_times(text, expected):
    assert time_parse(text, now=NOW) == expected


def test_a_time_that_is_none_of_the_forms_is_refused():
    with pytest.raises(ValueError, match="not a time"):
        time_parse("last tuesday", now=NOW)


def test_bad_choices_are_usage_errors_before_any_request(cli, fake_api, tmp_path):
    data = tmp_path / "in.jsonl"
    data.write_text("{}\n")
    assert cli("submit", str(data), "--endpoint", "/v2/infer", "--priority", "urgent").exit_code == 2
    assert cli("submit", str(data), "--endpoint", "/v2/infer", "--metadata", "oops").exit_code == 2
    assert cli("list", "--status", "running").exit_code == 2
    assert cli("submit", str(tmp_path / "missing.jsonl"), "--endpoint", "/v2/infer").exit_code == 2
    assert fake_api.seen == []
