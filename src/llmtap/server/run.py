"""Running `llmtap serve` under uvicorn."""

from __future__ import annotations

import ctypes
import gc
import os
import platform
import resource
import sys
from typing import Any

import uvicorn

from ..health import HEALTH
from .asgi import ASGIApp
from .capture_dir import check_capture_dir
from .config import ServeConfig
from .header_guard import configure_header_guard, guarded_protocol_path
from .proxy import build_app

__all__ = [
    "app_from_environment", "prepare_server_process", "raise_open_file_limit", "run_server", "steady_gc",
    "steady_heap", "uvicorn_config",
]

# Enough descriptors for thousands of client and upstream connections and the capture store's
# open rollouts (two descriptors each, kept within an eighth of the limit).
_WANTED_OPEN_FILES = 65536


def uvicorn_config(config: ServeConfig, app: ASGIApp | None = None) -> uvicorn.Config:
    """Return the uvicorn settings llmtap serves `app` with (by default the proxy `config`
    describes) in one process."""
    _guard_request_heads(config)
    return uvicorn.Config(app if app is not None else build_app(config), **_uvicorn_settings(config))


def _guard_request_heads(config: ServeConfig) -> None:
    """Bound how long and how large a request head may be (uvicorn bounds neither: `header_guard`)."""
    configure_header_guard(
        config.header_read_timeout_s, config.max_request_head_bytes, on_refused=lambda reason: HEALTH.count(reason)
    )


def _uvicorn_settings(config: ServeConfig) -> dict[str, Any]:
    """Fast HTTP parser when installed (either one behind the request-head guard), no access log.

    uvicorn adds `date` and `server` headers to every response unless told not to, which would
    put a second `date` and a `server: uvicorn` in front of the upstream's own: the client must
    get the upstream's headers (hop-by-hop ones aside), so both are off. X-Forwarded-* rewriting
    is off too: llmtap reads no client address.
    """
    return {
        "host": config.host,
        "port": config.port,
        "http": guarded_protocol_path(),
        "lifespan": "on",
        "access_log": False,
        "log_level": config.log_level,
        "timeout_keep_alive": 75,
        "server_header": False,
        "date_header": False,
        "proxy_headers": False,
    }


# How `run_server` hands its validated configuration to the worker processes it starts.
_CONFIG_VARIABLE = "LLMTAP_SERVE_CONFIG"


def app_from_environment() -> ASGIApp:
    """The app of one worker process of `llmtap serve --workers N`, built from the configuration
    its parent validated (upstream keys are still read from their own variables)."""
    steady_heap()  # a spawned worker starts with glibc's and the collector's defaults again
    steady_gc()
    config = ServeConfig.model_validate_json(os.environ[_CONFIG_VARIABLE])
    _guard_request_heads(config)
    return build_app(config)


def raise_open_file_limit(wanted: int = _WANTED_OPEN_FILES) -> int:
    """Raise this process's soft limit on open files towards `wanted`, within the hard limit; never lower it.

    Many systems start processes at 1,024 descriptors. The capture store keeps the files of at
    most an eighth of the limit's worth of rollouts open, 64 there: with more rollouts in
    progress than that, every append would reopen its files. Returns the soft limit now in force.
    """
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    target = wanted if hard == resource.RLIM_INFINITY else min(wanted, hard)
    if soft != resource.RLIM_INFINITY and soft < target:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (target, hard))
        except (ValueError, OSError):
            return soft
        return target
    return soft


# glibc's mallopt parameters, and the values a server process runs with: blocks up to 4 MiB come
# from the heap, and up to 64 MiB of freed heap stays mapped for reuse.
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3
_MMAP_THRESHOLD = 4 * 1024 * 1024
_TRIM_THRESHOLD = 64 * 1024 * 1024


def steady_heap() -> bool:
    """Fix glibc's mmap and trim thresholds, so the heap stops handing pages back and faulting them in again.

    asyncio reads every socket into a fresh 256 KiB buffer and shrinks it to what arrived. Under
    glibc's moving thresholds that buffer is often a new mapping, page-faulted in on every read
    (the faults and their cost are in docs/benchmarks.md); fixed thresholds keep those buffers
    in the heap. Returns False where the C library is not glibc, which is then left alone.
    """
    if platform.libc_ver()[0] != "glibc":
        return False
    try:
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
    return bool(mallopt(_M_MMAP_THRESHOLD, _MMAP_THRESHOLD)) and bool(mallopt(_M_TRIM_THRESHOLD, _TRIM_THRESHOLD))


# Net allocations of tracked objects between two young collections (CPython's default is 700).
_GC_YOUNG_THRESHOLD = 10_000


def steady_gc() -> None:
    """Let the cycle collector run only when cycles pile up, and never walk what start-up built.

    Calls in flight hold thousands of container objects (parsed bodies, headers, tasks) that
    reference counting frees when each call ends. Under CPython's default threshold that working
    set alone keeps setting off collections that walk the whole heap (measured in
    docs/benchmarks.md). A cycle is still collected, after 10,000 net allocations instead of 700;
    `gc.freeze` moves what start-up built (modules, configuration, the app) out of every
    collection's walk.
    """
    gc.collect()  # what start-up left as garbage is freed, not frozen for good
    gc.freeze()
    young, older, oldest = gc.get_threshold()
    gc.set_threshold(max(_GC_YOUNG_THRESHOLD, young), older, oldest)


def prepare_server_process() -> None:
    """The process settings of a long-running llmtap server: descriptors to spare, a steady heap
    and a collector that leaves the working set alone."""
    raise_open_file_limit()
    steady_heap()
    steady_gc()


def run_server(config: ServeConfig) -> None:
    """Serve until interrupted, printing where it listens and where it captures.

    An unwritable capture directory is refused first (`ConfigError`), before anything is printed
    or bound: a server that could record nothing must not look as if it records.
    """
    if config.observability_enabled and config.model_call_capture_dir is not None:
        check_capture_dir(config.model_call_capture_dir)
    prepare_server_process()
    capture = config.model_call_capture_dir if config.observability_enabled else "off"
    upstreams = ", ".join(f"{name}={u.shown_base_url}" for name, u in config.upstreams.items())
    workers = f"  workers: {config.workers}" if config.workers > 1 else ""
    print(
        f"llmtap serve on http://{config.host}:{config.port}  upstreams: {upstreams}  capture: {capture}{workers}",
        file=sys.stderr,
        flush=True,
    )
    if config.workers == 1:
        uvicorn.Server(uvicorn_config(config)).run()
        return
    # Each worker is its own process with its own store and sync helper; the store's locks make
    # them share the capture directory safely. Building the app here first reports a bad
    # directory or a missing key once, before any worker starts.
    _check_app_builds(config)
    _guard_request_heads(config)
    os.environ[_CONFIG_VARIABLE] = config.model_dump_json()
    uvicorn.run(
        f"{__name__}:app_from_environment", factory=True, workers=config.workers, **_uvicorn_settings(config)
    )


def _check_app_builds(config: ServeConfig) -> None:
    app = build_app(config)
    live_export = getattr(app, "live_export", None)
    if live_export is not None:
        live_export.close(timeout=0)  # this app only checked the settings: each worker exports on its own
    store = getattr(app, "store", None)
    if store is not None:
        store.close()
