"""The URL registry: host AND path matching, overrides, and clear errors."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml  # type: ignore[import-untyped]
from hypothesis import given
from hypothesis import strategies as st

from llmtap.errors import ConfigError
from llmtap.hooks.registry import REGISTRY_ENV, load_registry, registry_from_data, vendored_registry_path


@pytest.fixture(scope="module")
def registry():  # type: ignore[no-untyped-def]
    return load_registry(vendored_registry_path())


@pytest.mark.parametrize(
    ("host", "port", "path", "provider", "operation"),
    [
        ("api.openai.com", 443, "/v1/chat/completions", "openai", "chat"),
        ("api.openai.com", 443, "/v1/responses", "openai", "chat"),
        ("api.openai.com", 443, "/v1/embeddings", "openai", "embeddings"),
        ("api.anthropic.com", 443, "/v1/messages", "anthropic", "chat"),
        ("myres.openai.azure.com", 443, "/openai/deployments/gpt4o/chat/completions", "azure.ai.openai", "chat"),
        ("generativelanguage.googleapis.com", 443, "/v1beta/models/gemini-2.0-flash:generateContent", "gcp.gemini", "generate_content"),
        ("bedrock-runtime.us-east-1.amazonaws.com", 443, "/model/anthropic.claude-3-haiku/converse", "aws.bedrock", "chat"),
        ("api.mistral.ai", 443, "/v1/chat/completions", "mistral_ai", "chat"),
        ("api.cohere.com", 443, "/v2/chat", "cohere", "chat"),
        ("api.together.xyz", 443, "/v1/chat/completions", "together", "chat"),
        ("api.groq.com", 443, "/openai/v1/chat/completions", "groq", "chat"),
        ("openrouter.ai", 443, "/api/v1/chat/completions", "openrouter", "chat"),
        ("api.deepseek.com", 443, "/chat/completions", "deepseek", "chat"),
        ("localhost", 11434, "/api/chat", "ollama", "chat"),
        ("127.0.0.1", 8080, "/v1/chat/completions", "local", "chat"),
        ("127.0.0.1", 8080, "/ng-rollout/3-1/v1/responses", "local", "chat"),
        ("::1", 9000, "/v1/messages", "local", "chat"),
    ],
)
def test_known_providers_match_on_host_and_path(registry, host, port, path, provider, operation) -> None:  # type: ignore[no-untyped-def]
    match = registry.match(host, port, path)
    assert match is not None
    assert (match.provider, match.operation) == (provider, operation)


@pytest.mark.parametrize(
    ("host", "port", "path"),
    [
        ("api.openai.com", 443, "/v1/files"),  # not a model call
        ("example.com", 443, "/v1/chat/completions"),  # right path, wrong host
        ("api.openai.com.evil.example", 443, "/v1/chat/completions"),  # host is not a suffix match
        ("evil.example", 443, "/api.openai.com/v1/chat/completions"),  # the host only appears in the path
        ("bedrock.us-east-1.amazonaws.com", 443, "/model/x/converse"),  # control plane, not runtime
        ("localhost", 8080, "/health"),
        ("openai.azure.com", 443, "/openai/deployments/x/chat/completions"),  # "*" needs a label
    ],
)
def test_other_calls_do_not_match(registry, host, port, path) -> None:  # type: ignore[no-untyped-def]
    assert registry.match(host, port, path) is None


@given(prefix=st.text(alphabet="abcdefghijklmnopqrstuvwxyz.-", min_size=1, max_size=20), query=st.text(max_size=30))
def test_a_known_host_inside_another_url_never_matches(prefix: str, query: str) -> None:
    registry = load_registry(vendored_registry_path())
    host = f"{prefix}.invalid"
    path = f"/proxy/api.openai.com/v1/chat/completions{query}".replace("?", "%3F")
    assert registry.match(host, 443, path) is None


def test_ollama_host_from_environment_is_read_at_call_time(registry, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    assert registry.match("gpu-box.internal", 11434, "/api/chat") is None
    monkeypatch.setenv("OLLAMA_HOST", "http://gpu-box.internal:11434")
    match = registry.match("gpu-box.internal", 11434, "/api/chat")
    assert match is not None and match.provider == "ollama"


def test_openai_base_url_from_environment_names_a_gateway(registry, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    monkeypatch.setenv("OPENAI_BASE_URL", "https://llm-gateway.corp.example/openai/v1")
    match = registry.match("llm-gateway.corp.example", 443, "/openai/v1/chat/completions")
    assert match is not None and match.provider == "openai"


def _write(path: Path, data: object) -> Path:
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


def test_an_override_replaces_the_vendored_registry(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    override = _write(
        tmp_path / "mine.yaml",
        {"schema_version": 1, "providers": [{"provider": "corp", "hosts": ["llm.corp"], "endpoints": [{"path": "/generate", "operation": "chat"}]}]},
    )
    monkeypatch.setenv(REGISTRY_ENV, str(override))
    registry = load_registry()
    assert registry.providers == ("corp",)
    assert registry.match("llm.corp", 443, "/generate") is not None
    assert registry.match("api.openai.com", 443, "/v1/chat/completions") is None


def test_the_home_override_is_used_when_no_variable_is_set(isolated_llmtap_home: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv(REGISTRY_ENV, raising=False)
    _write(
        isolated_llmtap_home / "url_registry.yaml",
        {"schema_version": 1, "providers": [{"provider": "home", "hosts": ["h.example"], "endpoints": [{"path": "/x", "operation": "chat"}]}]},
    )
    assert load_registry().providers == ("home",)


@pytest.mark.parametrize(
    ("data", "fragment"),
    [
        ({"schema_version": 2, "providers": []}, "schema_version"),
        ({"schema_version": 1, "providers": {}}, "'providers' must be a list"),
        ({"schema_version": 1, "providers": [{"provider": "x", "endpoints": [{"path": "/a", "operation": "chat"}]}]}, "needs 'hosts'"),
        ({"schema_version": 1, "providers": [{"provider": "x", "hosts": ["h"], "endpoints": [{"path": "a", "operation": "chat"}]}]}, "must start with"),
        ({"schema_version": 1, "providers": [{"provider": "x", "hosts": ["h:port"], "endpoints": [{"path": "/a", "operation": "chat"}]}]}, "port"),
        ({"schema_version": 1, "providers": [{"provider": "x", "hosts": ["h"], "endpoints": [{"path": "/a"}]}]}, "operation"),
        ({"schema_version": 1, "providers": [{"provider": "x", "hosts": ["h"], "bogus": 1, "endpoints": [{"path": "/a", "operation": "c"}]}]}, "unknown keys"),
    ],
)
def test_a_malformed_registry_is_a_config_error_naming_the_problem(data: object, fragment: str) -> None:
    with pytest.raises(ConfigError, match="is invalid") as raised:
        registry_from_data(data, source="override.yaml")  # type: ignore[arg-type]
    assert fragment in str(raised.value)
    assert "override.yaml" in str(raised.value)


def test_an_unreadable_or_invalid_yaml_override_is_a_config_error(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(REGISTRY_ENV, str(tmp_path / "missing.yaml"))
    with pytest.raises(ConfigError, match="Cannot read the URL registry"):
        load_registry()
    broken = tmp_path / "broken.yaml"
    broken.write_text("providers: [unclosed", encoding="utf-8")
    monkeypatch.setenv(REGISTRY_ENV, str(broken))
    with pytest.raises(ConfigError, match="not valid YAML"):
        load_registry()
