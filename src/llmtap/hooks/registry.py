"""The URL registry: which outgoing HTTP calls are model calls, and whose.

A call is recorded only when its host AND its path match an entry (never a substring of the whole
URL, so a query string naming `api.openai.com` matches nothing). The vendored
`url_registry.yaml` lists the providers; `$LLMTAP_URL_REGISTRY`, else
`$LLMTAP_HOME/url_registry.yaml` (default `~/.llmtap/url_registry.yaml`), replaces it entirely.
A malformed override is a `ConfigError`, never a silent fallback.

Matching runs on every HTTP call a hooked library makes, so patterns are compiled once and
answers are cached per (host, port, path).

Usage::

    registry = load_registry()
    match = registry.match("api.openai.com", 443, "/v1/chat/completions")
    match.provider, match.operation   # ('openai', 'chat')
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Any, Callable, Mapping, NamedTuple

from ..errors import ConfigError

__all__ = [
    "REGISTRY_ENV",
    "EndpointMatch",
    "UrlRegistry",
    "load_registry",
    "registry_from_data",
    "registry_override_path",
    "vendored_registry_path",
]

REGISTRY_ENV = "LLMTAP_URL_REGISTRY"
SCHEMA_VERSION = 1
_CACHE_LIMIT = 4096
_PROVIDER_KEYS = frozenset({"provider", "hosts", "hosts_from_env", "endpoints", "notes", "watch_connections"})
_ENDPOINT_KEYS = frozenset({"path", "operation", "dialect"})


class EndpointMatch(NamedTuple):
    """What the registry says about one call: the provider, its operation and (maybe) its dialect."""

    provider: str
    operation: str
    dialect: str | None


class _HostPattern(NamedTuple):
    labels: tuple[str, ...]  # "*" stands for any one label
    port: int | None

    def matches(self, host: str, port: int | None) -> bool:
        if self.port is not None and self.port != port:
            return False
        labels = host.split(".")
        if len(labels) != len(self.labels):
            return False
        return all(want == "*" or want == got for want, got in zip(self.labels, labels))


class _Endpoint:
    """A path pattern, compiled the first time a call to one of its provider's hosts needs it."""

    __slots__ = ("pattern", "match", "_regex")

    def __init__(self, pattern: str, match: EndpointMatch) -> None:
        self.pattern = pattern
        self.match = match
        self._regex: re.Pattern[str] | None = None

    def matches(self, path: str) -> bool:
        if self._regex is None:
            self._regex = _compile_path(self.pattern)
        return self._regex.fullmatch(path) is not None


class _Provider(NamedTuple):
    name: str
    hosts: tuple[_HostPattern, ...]
    env_vars: tuple[str, ...]
    endpoints: tuple[_Endpoint, ...]
    watch: bool = True  # `watch_connections`: a connection no hook records is reported (hooks.socket_watch)


def vendored_registry_path() -> Path:
    """The registry shipped with llmtap."""
    return Path(__file__).with_name("url_registry.yaml")


def registry_override_path() -> Path | None:
    """The override that replaces the vendored registry, if one is configured or present."""
    explicit = os.environ.get(REGISTRY_ENV)
    if explicit:
        return Path(explicit).expanduser()
    home = Path(os.environ.get("LLMTAP_HOME") or "~/.llmtap").expanduser()
    candidate = home / "url_registry.yaml"
    return candidate if candidate.is_file() else None


def _normalize_host(host: str) -> str:
    return host.strip().lower().rstrip(".").strip("[]")


def _parse_host(pattern: str, where: str) -> _HostPattern:
    text = pattern.strip().lower()
    port: int | None = None
    if text.startswith("["):  # "[::1]" or "[::1]:11434"
        host_part, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host_part, _, port_text = text.partition(":")
    else:
        host_part, port_text = text, ""
    if port_text:
        if not port_text.isdigit():
            raise ValueError(f"{where}: host {pattern!r} has a port that is not a number")
        port = int(port_text)
    host_part = _normalize_host(host_part)
    if not host_part or "/" in host_part or any(not label for label in host_part.split(".")):
        raise ValueError(f"{where}: {pattern!r} is not a host name (write 'api.example.com' or 'host:port')")
    return _HostPattern(tuple(host_part.split(".")), port)


def _check_path(pattern: str, where: str) -> str:
    if not pattern.startswith(("/", "**")):
        raise ValueError(f"{where}: path {pattern!r} must start with '/' or '**'")
    return pattern


def _compile_path(pattern: str) -> re.Pattern[str]:
    """`*` is any run of characters inside one segment, `**` any run of segments; anchored by fullmatch."""
    regex = []
    index = 0
    while index < len(pattern):
        if pattern.startswith("**", index):
            regex.append(".*")
            index += 2
        elif pattern[index] == "*":
            regex.append("[^/]*")
            index += 1
        else:
            regex.append(re.escape(pattern[index]))
            index += 1
    return re.compile("".join(regex))


def _host_from_env_value(value: str) -> tuple[str, int | None] | None:
    """Read `host[:port]` or a URL from an environment value; None when it holds neither."""
    text = value.strip()
    if not text:
        return None
    if "://" in text:
        text = text.split("://", 1)[1]
    text = text.split("/", 1)[0]
    if text.startswith("["):
        host, _, rest = text[1:].partition("]")
        port_text = rest[1:] if rest.startswith(":") else ""
    elif text.count(":") == 1:
        host, _, port_text = text.partition(":")
    else:
        host, port_text = text, ""
    port = int(port_text) if port_text.isdigit() else None
    host = _normalize_host(host)
    if host in ("0.0.0.0", "::"):  # a server's "listen everywhere" means this machine to a client
        host = "127.0.0.1"
    return (host, port) if host else None


class UrlRegistry:
    """Compiled provider patterns, matched on host and path with a per-call-site cache."""

    def __init__(self, data: Mapping[str, Any], *, source: str) -> None:
        self.source = source
        self.data = dict(data)
        self._providers = tuple(_parse(data, source))
        self._env_names = tuple(dict.fromkeys(name for provider in self._providers for name in provider.env_vars))
        self._cache: dict[tuple[str, int | None, str, tuple[Any, ...]], EndpointMatch | None] = {}
        # os.environ keeps its values in `_data` under encoded keys; reading that dict directly
        # makes the call-time environment check a few dictionary lookups instead of microseconds.
        environ_data = getattr(os.environ, "_data", None)
        encode = getattr(os.environ, "encodekey", None)
        self._env_values: Callable[[], tuple[Any, ...]]
        if isinstance(environ_data, dict) and callable(encode):
            keys = tuple(encode(name) for name in self._env_names)
            self._env_values = lambda: tuple(environ_data.get(key) for key in keys)
        else:  # pragma: no cover - other platforms keep the plain lookup
            names = self._env_names
            self._env_values = lambda: tuple(os.environ.get(name) for name in names)

    @property
    def providers(self) -> tuple[str, ...]:
        """Provider names in match order."""
        return tuple(provider.name for provider in self._providers)

    def named_hosts(self) -> list[tuple[str, int | None]]:
        """Every host the registry names without a wildcard, with its port (None: any); for replay's network guard."""
        return [
            (".".join(pattern.labels), pattern.port)
            for provider in self._providers
            for pattern in provider.hosts
            if "*" not in pattern.labels
        ]

    def match(self, host: str, port: int | None, path: str) -> EndpointMatch | None:
        """Return the endpoint a call to `host:port` + `path` belongs to, or None to pass it by.

        `path` is the URL path without its query string. Environment-named hosts are read now,
        so the answer follows the environment as it changes.
        """
        env_key = self._env_values()
        key = (host, port, path, env_key)
        try:
            return self._cache[key]
        except KeyError:
            pass
        found = self._match_uncached(_normalize_host(host), port, path)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = found
        return found

    def provider_for_host(self, host: str, port: int | None) -> str | None:
        """The watched provider whose hosts include `host:port`, whatever the path (for watching connections), or None."""
        host = _normalize_host(host)
        for provider in self._providers:
            if provider.watch and self._host_matches(provider, host, port):
                return provider.name
        return None

    def _match_uncached(self, host: str, port: int | None, path: str) -> EndpointMatch | None:
        for provider in self._providers:
            if not self._host_matches(provider, host, port):
                continue
            for endpoint in provider.endpoints:
                if endpoint.matches(path):
                    return endpoint.match
        return None

    @staticmethod
    def _host_matches(provider: _Provider, host: str, port: int | None) -> bool:
        for pattern in provider.hosts:
            if pattern.matches(host, port):
                return True
        for name in provider.env_vars:
            found = _host_from_env_value(os.environ.get(name, ""))
            if found is not None and found[0] == host and (found[1] is None or found[1] == port):
                return True
        return False


def _parse(data: Mapping[str, Any], source: str) -> list[_Provider]:
    if not isinstance(data, dict):
        raise ValueError("the top level must be a mapping with 'schema_version' and 'providers'")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(f"schema_version is {version!r}; this llmtap reads version {SCHEMA_VERSION}")
    providers = data.get("providers")
    if not isinstance(providers, list):
        raise ValueError("'providers' must be a list")
    return [_parse_provider(entry, f"providers[{index}]") for index, entry in enumerate(providers)]


def _string_list(value: Any, where: str) -> list[str]:
    if value is None:
        return []
    if not isinstance(value, list) or not all(isinstance(item, str) and item for item in value):
        raise ValueError(f"{where} must be a list of non-empty strings")
    return list(value)


def _parse_provider(entry: Any, where: str) -> _Provider:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a mapping")
    unknown = set(entry) - _PROVIDER_KEYS
    if unknown:
        raise ValueError(f"{where} has unknown keys {sorted(unknown)}")
    name = entry.get("provider")
    if not isinstance(name, str) or not name:
        raise ValueError(f"{where}.provider must be a non-empty string")
    hosts = [_parse_host(host, f"{where}.hosts") for host in _string_list(entry.get("hosts"), f"{where}.hosts")]
    env_vars = _string_list(entry.get("hosts_from_env"), f"{where}.hosts_from_env")
    if not hosts and not env_vars:
        raise ValueError(f"{where} ({name}) needs 'hosts' or 'hosts_from_env'")
    endpoints_data = entry.get("endpoints")
    if not isinstance(endpoints_data, list) or not endpoints_data:
        raise ValueError(f"{where}.endpoints must be a non-empty list")
    endpoints = [_parse_endpoint(name, item, f"{where}.endpoints[{i}]") for i, item in enumerate(endpoints_data)]
    watch = entry.get("watch_connections", True)
    if not isinstance(watch, bool):
        raise ValueError(f"{where}.watch_connections must be true or false")
    return _Provider(name, tuple(hosts), tuple(env_vars), tuple(endpoints), watch)


def _parse_endpoint(provider: str, entry: Any, where: str) -> _Endpoint:
    if not isinstance(entry, dict):
        raise ValueError(f"{where} must be a mapping with 'path' and 'operation'")
    unknown = set(entry) - _ENDPOINT_KEYS
    if unknown:
        raise ValueError(f"{where} has unknown keys {sorted(unknown)}")
    path, operation, dialect = entry.get("path"), entry.get("operation"), entry.get("dialect")
    if not isinstance(path, str) or not path:
        raise ValueError(f"{where}.path must be a non-empty string")
    if not isinstance(operation, str) or not operation:
        raise ValueError(f"{where}.operation must be a non-empty string such as 'chat'")
    if dialect is not None and not isinstance(dialect, str):
        raise ValueError(f"{where}.dialect must be a string when given")
    return _Endpoint(_check_path(path, where), EndpointMatch(provider, operation, dialect))


def registry_from_data(data: Mapping[str, Any], *, source: str) -> UrlRegistry:
    """Build a registry from already-parsed data; raises ConfigError naming `source` when invalid."""
    try:
        return UrlRegistry(data, source=source)
    except (ValueError, re.error) as exc:
        raise ConfigError(f"The URL registry '{source}' is invalid: {exc}; fix it or remove the override.") from None


def load_registry(path: str | os.PathLike[str] | None = None) -> UrlRegistry:
    """Load the effective registry: `path` if given, else the override, else the vendored file.

    Raises ConfigError with one sentence naming the file when it cannot be read or is malformed.
    """
    chosen = Path(path) if path is not None else (registry_override_path() or vendored_registry_path())
    try:
        raw = chosen.read_bytes()
    except OSError as exc:
        raise ConfigError(
            f"Cannot read the URL registry '{chosen}' ({exc.strerror}); fix ${REGISTRY_ENV} or create the file."
        ) from None
    return registry_from_data(_parsed_yaml(chosen, raw), source=str(chosen))


def _cache_dir() -> Path:
    configured = os.environ.get("LLMTAP_CACHE_DIR")
    if configured:
        return Path(configured).expanduser()
    home = os.environ.get("LLMTAP_HOME")
    return Path(home).expanduser() / "cache" if home else Path("~/.cache/llmtap").expanduser()


def _parsed_yaml(path: Path, raw: bytes) -> Any:
    """Parse the registry YAML, through a JSON cache keyed by the file's content.

    Importing and running PyYAML costs more than the rest of `llmtap run`'s start-up together,
    so a registry already seen is read back from `<cache>/url_registry-<sha256>.json`.
    """
    import hashlib
    import json

    cached = _cache_dir() / f"url_registry-{hashlib.sha256(raw).hexdigest()[:32]}.json"
    try:
        return json.loads(cached.read_bytes())
    except (OSError, ValueError):
        pass
    import yaml  # type: ignore[import-untyped]

    loader = getattr(yaml, "CSafeLoader", yaml.SafeLoader)  # libyaml when present: the faster parser
    try:
        data = yaml.load(raw.decode("utf-8"), Loader=loader)  # noqa: S506 - a safe loader either way
    except (yaml.YAMLError, UnicodeDecodeError) as exc:
        raise ConfigError(f"The URL registry '{path}' is not valid YAML ({exc}); fix its syntax.") from None
    try:
        from ..store.durable import write_file_atomic  # only on a miss, which pays for PyYAML anyway

        cached.parent.mkdir(parents=True, exist_ok=True)
        write_file_atomic(cached, json.dumps(data).encode("utf-8"), sync=False)
    except (OSError, TypeError, ValueError):  # no cache then; the next run parses again
        pass
    return data
