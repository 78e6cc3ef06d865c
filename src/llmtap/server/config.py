"""Configuration of `llmtap serve`: YAML plus `++key=value` overrides, validated once at start.

The spec's top-level keys `observability_enabled` and `model_call_capture_dir` keep their meaning:
when capture is enabled the directory is required and must be absolute, so every producer and the
collector resolve the same place. Upstream API keys are named by environment variable and read
at start; their values are sent upstream and never logged, stored or echoed in errors.

Example::

    observability_enabled: true
    model_call_capture_dir: /abs/model-calls
    upstreams:
      policy:
        base_url: http://127.0.0.1:8000
        api_key_env: OPENAI_API_KEY
        model_ref: {type: responses_api_models, name: policy_model}
    sampling_overrides: {temperature: 0.7}
    otlp_endpoint: http://127.0.0.1:4318     # live OpenTelemetry export (or OTEL_EXPORTER_OTLP_*ENDPOINT)
    redact: true                             # secrets in payloads are redacted before a record is written
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Literal, Mapping, Sequence

import yaml
import yarl
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from ..errors import ConfigError

__all__ = ["ServeConfig", "UpstreamConfig", "apply_overrides", "load_serve_config"]


class UpstreamConfig(BaseModel):
    """One upstream model server the proxy forwards to."""

    model_config = ConfigDict(extra="forbid")

    base_url: str
    api_key_env: str | None = None
    # How the key is sent: OpenAI-style bearer token, or Anthropic's x-api-key header.
    auth: Literal["bearer", "x-api-key"] = "bearer"
    model_ref: dict[str, Any] | None = None
    provider: str | None = None
    dialects: list[Literal["responses", "chat", "messages"]] | None = None
    models: list[str] | None = None
    timeout_s: float = Field(default=600.0, gt=0)
    connect_timeout_s: float = Field(default=10.0, gt=0)
    max_connections: int = Field(default=512, gt=0)

    @field_validator("base_url")
    @classmethod
    def _http_url(cls, value: str) -> str:
        if not value.startswith(("http://", "https://")):
            raise ValueError(f"base_url {value!r} must start with http:// or https://")
        # Percent-encoded once here: the proxy joins request paths to it exactly as clients sent them.
        url = yarl.URL(value.rstrip("/"))
        if not url.host or url.raw_query_string or url.raw_fragment or "@" in url.raw_path:
            raise ValueError(f"base_url {value!r} must name a host and hold no query, fragment or '@' in its path")
        return str(url)

    @property
    def shown_base_url(self) -> str:
        """The base URL as printed: a password in it is masked."""
        url = yarl.URL(self.base_url, encoded=True)
        return str(url.with_password("***")) if url.password is not None else self.base_url

    def api_key(self) -> str | None:
        """Return the key from its environment variable, or None when none is configured."""
        if self.api_key_env is None:
            return None
        value = os.environ.get(self.api_key_env)
        if not value:
            raise ConfigError(
                f"Upstream API key variable {self.api_key_env!r} is not set; export it or remove api_key_env."
            )
        return value


class ServeConfig(BaseModel):
    """The whole `llmtap serve` configuration."""

    model_config = ConfigDict(extra="forbid")

    observability_enabled: bool = False
    model_call_capture_dir: str | None = None
    host: str = "127.0.0.1"
    port: int = Field(default=8787, ge=0, le=65535)
    upstreams: dict[str, UpstreamConfig] = Field(default_factory=dict)
    default_upstream: str | None = None
    sampling_overrides: dict[str, Any] | None = None
    # True for a server a training framework lists in `required_model_servers`: prefixed
    # generation calls without an /ng-sampling/ segment (or x-ng-sampling header) get a 400.
    require_model_sampling: bool = False
    log_level: str = "warning"
    # Server processes sharing the port (and the capture directory): one event loop is one core.
    workers: int = Field(default=1, ge=1, le=256)
    # Bounds on what clients and upstreams send (see README "Limits and health"): a larger request
    # body gets a 413 (recorded as rejected); a compressed response is decoded for its record up
    # to `max_decoded_body_bytes`, past which the record keeps the raw bytes; a request head must
    # arrive whole within `header_read_timeout_s` and `max_request_head_bytes` (else 408 / 431).
    max_request_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    max_decoded_body_bytes: int = Field(default=64 * 1024 * 1024, gt=0)
    header_read_timeout_s: float = Field(default=30.0, gt=0)
    max_request_head_bytes: int = Field(default=64 * 1024, ge=1024)
    # Where each durable record is also sent as an OTLP span (a base URL gets /v1/traces). Unset,
    # the standard OTEL_EXPORTER_OTLP_TRACES_ENDPOINT / OTEL_EXPORTER_OTLP_ENDPOINT turn it on.
    otlp_endpoint: str | None = None
    # Redact every secret the scanner finds in a record (llmtap.trust.redaction) before it is written.
    redact: bool = False

    @field_validator("otlp_endpoint")
    @classmethod
    def _otlp_url(cls, value: str | None) -> str | None:
        if value is None:
            return None
        url = yarl.URL(value)
        if url.scheme not in ("http", "https") or not url.host:
            raise ValueError(f"otlp_endpoint {value!r} must be an http:// or https:// URL with a host")
        return value

    @model_validator(mode="after")
    def _check(self) -> ServeConfig:
        if self.observability_enabled:
            if not self.model_call_capture_dir:
                raise ValueError("model_call_capture_dir is required when observability_enabled is true")
            if not Path(self.model_call_capture_dir).is_absolute():
                raise ValueError(
                    f"model_call_capture_dir {self.model_call_capture_dir!r} must be an absolute path"
                )
        if not self.upstreams:
            raise ValueError("at least one upstream is required (upstreams: {name: {base_url: ...}})")
        if self.default_upstream is not None and self.default_upstream not in self.upstreams:
            raise ValueError(
                f"default_upstream {self.default_upstream!r} is not one of the upstreams {sorted(self.upstreams)}"
            )
        return self

    def live_export_endpoint(self) -> tuple[bool, str | None]:
        """Whether serve exports spans live, and to which endpoint (None: the exporter reads the OTEL_ variables).

        The config key wins; otherwise either standard variable turns export on, and the official
        exporter then applies the standard rules (a traces endpoint as is, a base endpoint plus
        `/v1/traces`).
        """
        if self.otlp_endpoint is not None:
            return True, self.otlp_endpoint
        standard = ("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
        return any(os.environ.get(name) for name in standard), None

    @property
    def default_upstream_name(self) -> str:
        """The upstream used when no upstream's dialects or models select another."""
        return self.default_upstream or next(iter(self.upstreams))


def apply_overrides(config: dict[str, Any], overrides: Sequence[str]) -> dict[str, Any]:
    """Apply `++dotted.key=value` overrides (values parsed as YAML) to a config dict, returning a new dict."""
    result: dict[str, Any] = _deep_copy(config)
    for override in overrides:
        if not override.startswith("++") or "=" not in override:
            raise ConfigError(f"Override {override!r} is not of the form ++key=value.")
        key, _, raw_value = override[2:].partition("=")
        if not key:
            raise ConfigError(f"Override {override!r} names no key.")
        try:
            value = yaml.safe_load(raw_value) if raw_value else ""
        except yaml.YAMLError as exc:
            raise ConfigError(f"Override {override!r} has a value that is not valid YAML.") from exc
        node = result
        parts = key.split(".")
        for part in parts[:-1]:
            child = node.get(part)
            if not isinstance(child, dict):
                child = {}
                node[part] = child
            node = child
        node[parts[-1]] = value
    return result


def _deep_copy(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {key: _deep_copy(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_deep_copy(item) for item in value]
    return value


def load_serve_config(
    path: str | os.PathLike[str] | None = None,
    overrides: Sequence[str] = (),
    settings: Mapping[str, Any] | None = None,
) -> ServeConfig:
    """Read a YAML config (optional), then apply `settings` (from flags) and `++` overrides, and validate.

    Raises `ConfigError` with one readable sentence for a missing file, bad YAML or bad values.
    """
    data: dict[str, Any] = {}
    if path is not None:
        try:
            text = Path(path).read_text(encoding="utf-8")
        except OSError as exc:
            raise ConfigError(f"Cannot read config file '{path}': {exc.strerror}.") from exc
        try:
            loaded = yaml.safe_load(text) or {}
        except yaml.YAMLError as exc:
            raise ConfigError(f"Config file '{path}' is not valid YAML: {exc}.") from exc
        if not isinstance(loaded, dict):
            raise ConfigError(f"Config file '{path}' must hold a mapping at the top level.")
        data.update(loaded)
    data.update(settings or {})
    data = apply_overrides(data, overrides)
    try:
        return ServeConfig.model_validate(data)
    except ValidationError as exc:
        problems = "; ".join(
            f"{'.'.join(str(part) for part in error['loc']) or 'config'}: {error['msg']}" for error in exc.errors()
        )
        raise ConfigError(f"Invalid llmtap serve configuration: {problems}.") from None
