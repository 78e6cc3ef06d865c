"""`llmtap serve` configuration: YAML plus ++overrides, the spec's keys, clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest

from llmtap.errors import ConfigError
from llmtap.server.config import apply_overrides, load_serve_config
from llmtap.server.proxy import upstream_url

UPSTREAM = {"upstreams": {"u": {"base_url": "http://127.0.0.1:9/v1"}}}


def test_yaml_then_flags_then_overrides(tmp_path: Path) -> None:
    path = tmp_path / "serve.yaml"
    path.write_text("port: 9000\nupstreams:\n  u:\n    base_url: http://127.0.0.1:1/\n    api_key_env: NOPE_KEY\n")
    config = load_serve_config(
        path,
        ["++observability_enabled=true", f"++model_call_capture_dir={tmp_path}", "++upstreams.u.api_key_env=null"],
        settings={"port": 9100},
    )
    assert config.port == 9100 and config.observability_enabled
    assert config.model_call_capture_dir == str(tmp_path)
    assert config.upstreams["u"].base_url == "http://127.0.0.1:1" and config.upstreams["u"].api_key_env is None
    assert config.host == "127.0.0.1"


def test_capture_dir_is_required_when_enabled() -> None:
    with pytest.raises(ConfigError, match="model_call_capture_dir is required"):
        load_serve_config(None, ["++observability_enabled=true"], settings=UPSTREAM)


def test_capture_dir_must_be_absolute() -> None:
    with pytest.raises(ConfigError, match="must be an absolute path"):
        load_serve_config(None, ["++observability_enabled=true", "++model_call_capture_dir=relative/dir"], settings=UPSTREAM)


def test_unknown_keys_and_bad_values_are_one_readable_error() -> None:
    with pytest.raises(ConfigError, match="Invalid llmtap serve configuration: .*prot"):
        load_serve_config(None, ["++prot=1"], settings=UPSTREAM)
    with pytest.raises(ConfigError, match="must start with http"):
        load_serve_config(None, [], settings={"upstreams": {"u": {"base_url": "ftp://x"}}})


def test_an_upstream_is_required() -> None:
    with pytest.raises(ConfigError, match="at least one upstream"):
        load_serve_config(None, [])


def test_malformed_override_and_file_are_clear(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="not of the form"):
        apply_overrides({}, ["port=3"])
    bad = tmp_path / "bad.yaml"
    bad.write_text("port: [\n")
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_serve_config(bad)
    with pytest.raises(ConfigError, match="Cannot read config file"):
        load_serve_config(tmp_path / "missing.yaml")


def test_missing_key_variable_is_named_but_no_value_leaks(monkeypatch: pytest.MonkeyPatch) -> None:
    config = load_serve_config(None, [], settings={"upstreams": {"u": {"base_url": "http://x", "api_key_env": "LLMTAP_T_KEY"}}})
    monkeypatch.delenv("LLMTAP_T_KEY", raising=False)
    with pytest.raises(ConfigError, match="LLMTAP_T_KEY"):
        config.upstreams["u"].api_key()
    monkeypatch.setenv("LLMTAP_T_KEY", "sk-very-secret")
    assert config.upstreams["u"].api_key() == "sk-very-secret"
    assert "sk-very-secret" not in repr(config)


@pytest.mark.parametrize(
    ("base", "path", "expected"),
    [
        ("http://h:1", "/v1/chat/completions", "http://h:1/v1/chat/completions"),
        ("http://h:1/v1", "/v1/chat/completions", "http://h:1/v1/chat/completions"),
        ("https://api.openai.com/v1/", "/v1/responses", "https://api.openai.com/v1/responses"),
        ("http://h:1/fault/ok", "/v1/messages", "http://h:1/fault/ok/v1/messages"),
        ("http://h:1/v1", "/health", "http://h:1/v1/health"),
    ],
)
def test_upstream_url_never_doubles_v1(base: str, path: str, expected: str) -> None:
    assert upstream_url(base, path, b"") == expected


def test_upstream_url_keeps_the_query() -> None:
    assert upstream_url("http://h", "/v1/models", b"a=1") == "http://h/v1/models?a=1"


def test_a_base_url_is_percent_encoded_once_at_start() -> None:
    config = load_serve_config(settings={"upstreams": {"a": {"base_url": "http://h:8000/my path/v1/"}}})
    assert config.upstreams["a"].base_url == "http://h:8000/my%20path/v1"


def test_a_password_in_a_base_url_is_masked_wherever_the_url_is_shown() -> None:
    config = load_serve_config(settings={"upstreams": {"a": {"base_url": "http://vllm:p%40ss@h:8000/api"}}})
    upstream = config.upstreams["a"]
    assert upstream.base_url == "http://vllm:p%40ss@h:8000/api"  # sent as Basic credentials
    assert upstream.shown_base_url == "http://vllm:***@h:8000/api"
    assert load_serve_config(settings=UPSTREAM).upstreams["u"].shown_base_url == "http://127.0.0.1:9/v1"
