"""Start-up hook that `llmtap run` injects into every Python process of a workload.

`llmtap run` puts this directory first on PYTHONPATH, so Python imports this module at start-up
in the workload, its subprocesses and its multiprocessing workers. It must cost next to nothing:
it imports nothing beyond `sys` and `os` (already loaded; not even `__future__`, so annotations
naming types are strings), notes the interpreter for `env.lock` (first process only), and puts a
tiny finder on `sys.meta_path`. Only when the workload imports an HTTP library llmtap hooks does
it load llmtap itself and start capturing.

Then it imports the `sitecustomize` that this one shadows, if there is one further down the path,
so a workload's own start-up customisation still happens.
"""

import os
import sys

TYPE_CHECKING = False  # typing itself is not imported: start-up must stay cheap
if TYPE_CHECKING:
    from collections.abc import Sequence
    from importlib.machinery import ModuleSpec
    from types import ModuleType

# socket too: a client that speaks HTTP over it itself must still be noticed (hooks.socket_watch)
_WATCHED = frozenset({"httpx", "httpx2", "requests", "urllib3", "aiohttp", "mcp", "http.client", "socket"})
_HERE = os.path.dirname(os.path.abspath(__file__))


def _note_interpreter(capsule: str) -> None:
    """The workload's first Python process describes its interpreter for env.lock (one syscall or two)."""
    path = os.path.join(capsule, "internal", "interpreter")
    try:
        fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o644)
    except OSError:
        return  # another process of the run got there first, or the capsule is gone
    lines = [
        "executable=" + sys.executable,
        "version=" + sys.version.splitlines()[0],
        "implementation=" + sys.implementation.name,
        "prefix=" + sys.prefix,
        "base_prefix=" + sys.base_prefix,
        "platform=" + sys.platform,
    ]
    lines.extend("path=" + entry for entry in sys.path if entry != _HERE)
    try:
        os.write(fd, ("\n".join(lines) + "\n").encode("utf-8", "replace"))
    finally:
        os.close(fd)


def _load_bootstrap() -> "ModuleType":
    try:
        from llmtap.hooks import bootstrap
    except ImportError:
        # The workload's environment has no llmtap: borrow the recorder's, placed last on the
        # path so the workload's own packages still win.
        for entry in os.environ.get("LLMTAP_RUN_LIBPATH", "").split(os.pathsep):
            if entry and entry not in sys.path:
                sys.path.append(entry)
        from llmtap.hooks import bootstrap
    return bootstrap


class _FirstHttpImport:
    """Waits for the first import of a hooked HTTP library, then hands over to llmtap's bootstrap."""

    def __init__(self, capsule: str) -> None:
        self.capsule = capsule
        self.fired = False

    def find_spec(
        self, name: str, path: "Sequence[str] | None" = None, target: "ModuleType | None" = None
    ) -> "ModuleSpec | None":
        if self.fired or name not in _WATCHED:
            return None
        self.fired = True
        try:
            bootstrap = _load_bootstrap()
            bootstrap.start(self.capsule)
        except Exception as exc:  # capture is off in this process; the workload runs on
            sys.stderr.write("llmtap: capture is off in this process (%s).\n" % type(exc).__name__)
            return None
        spec: ModuleSpec | None = bootstrap.spec_notifying(name, path, target, skip=self)
        return spec


def _run_shadowed_sitecustomize() -> None:
    """Import the next `sitecustomize` on sys.path after this directory, as `sitecustomize`.

    An ordinary import with this directory (under any spelling) off the path finds it; it then
    stands in `sys.modules` where `site` looks for it, as if this one had never been there.
    """
    ours = sys.modules.pop("sitecustomize", None)
    path = sys.path
    sys.path = [entry for entry in path if os.path.abspath(entry or ".") != _HERE]
    try:
        __import__("sitecustomize")  # the workload's own, run for its effects
    except ImportError as exc:
        if exc.name != "sitecustomize":
            raise  # the workload's sitecustomize failed: `site` reports it, as without llmtap
        if ours is not None:
            sys.modules["sitecustomize"] = ours  # there is none further down
    finally:
        path[:] = sys.path  # the same list object, with whatever the workload's sitecustomize did to it
        sys.path = path


def _main() -> None:
    capsule = os.environ.get("LLMTAP_RUN_CAPSULE")
    if capsule:
        _note_interpreter(capsule)
        sys.meta_path.insert(0, _FirstHttpImport(capsule))
    if _HERE in sys.path:
        sys.path.remove(_HERE)  # the workload sees the sys.path it would have had
    _run_shadowed_sitecustomize()


_main()
