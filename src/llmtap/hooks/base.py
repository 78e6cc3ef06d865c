"""What every library hook shares: the layering guard, marked patches, and symmetric install.

- **One record per call.** A hooked entry point claims the `_IN_HOOKED_CALL` context variable for
  the whole call, captured or not, so a lower hooked layer (urllib3 under requests, or a second
  httpx client inside a transport) sees the claim and passes straight through.
- **Undo only our own patch.** Each wrapper is marked with the original it replaced; uninstall
  restores the original only while the attribute still holds our wrapper, so a patch someone
  applied on top of ours is never torn away.
- **Symmetry.** `Hook.install(module)` patches once (a second call does nothing and says so);
  `Hook.uninstall()` restores what install changed and nothing else.
"""

from __future__ import annotations

import logging
import sys
from contextvars import ContextVar, Token
from typing import Any, Callable, ClassVar

__all__ = [
    "Hook",
    "Patch",
    "claim_call",
    "inside_hooked_call",
    "recorded_answer",
    "release_call",
    "replaced_tool_result",
    "wrapped_original",
]

logger = logging.getLogger("llmtap.capture")

_IN_HOOKED_CALL: ContextVar[bool] = ContextVar("llmtap_in_hooked_call", default=False)
_MARK = "__llmtap_original__"


def inside_hooked_call() -> bool:
    """True while an outer hooked entry point is handling the current call."""
    return _IN_HOOKED_CALL.get()


def claim_call() -> Token[bool]:
    """Claim the current call for this layer; pass the token to `release_call` when it returns."""
    return _IN_HOOKED_CALL.set(True)


def release_call(token: Token[bool]) -> None:
    """Give the claim back (also after an exception)."""
    _IN_HOOKED_CALL.reset(token)


def recorded_answer(call: Any) -> Any:
    """The recording's answer for a captured call while a replay runs, else None (send it).

    Costs one dictionary lookup when no replay was ever started (its module is not loaded);
    raises `llmtap.replay.live.ReplayMissError` for a call the recording does not hold.
    """
    live = sys.modules.get("llmtap.replay.live")
    return None if live is None else live.replay_answer(call)


def replaced_tool_result(tool: Any) -> Any:
    """The result an intervention replay gives this MCP tool call instead of its server's, else None.

    Like `recorded_answer`: one dictionary lookup when no replay was ever started.
    """
    live = sys.modules.get("llmtap.replay.live")
    return None if live is None else live.replaced_tool_result(tool)


def wrapped_original(function: Any) -> Any:
    """The function a llmtap wrapper replaced, or None when `function` is not ours."""
    return getattr(function, _MARK, None)


class Patch:
    """One attribute replaced by a wrapper, restorable only while it still holds that wrapper."""

    __slots__ = ("owner", "name", "original", "wrapper")

    def __init__(self, owner: Any, name: str, make_wrapper: Callable[[Any], Any]) -> None:
        self.owner = owner
        self.name = name
        self.original = owner.__dict__[name] if name in getattr(owner, "__dict__", {}) else getattr(owner, name)
        wrapper = make_wrapper(self.original)
        setattr(wrapper, _MARK, self.original)
        self.wrapper = wrapper

    def apply(self) -> None:
        setattr(self.owner, self.name, self.wrapper)

    def revert(self) -> bool:
        """Restore the original; False (and nothing touched) when another patch sits on top of ours."""
        current = self.owner.__dict__.get(self.name) if hasattr(self.owner, "__dict__") else None
        if current is None:
            current = getattr(self.owner, self.name, None)
        if current is not self.wrapper:
            return False
        setattr(self.owner, self.name, self.original)
        return True


class Hook:
    """Base of the per-library hooks: install once when the library is imported, undo cleanly.

    A subclass names the module whose import triggers it (`module_name`), its label on records
    (`name`), and builds its patches in `_patches(module)`. A library that is already patched by
    llmtap (for example by a second copy of this hook) is left alone.
    """

    name: ClassVar[str]
    module_name: ClassVar[str]

    def __init__(self) -> None:
        self._patches: list[Patch] = []
        self.installed = False

    def _make_patches(self, module: Any) -> list[Patch]:
        raise NotImplementedError

    def install(self, module: Any) -> bool:
        """Patch `module`; returns False (changing nothing) when already installed or not applicable."""
        if self.installed:
            logger.debug("llmtap hook %s is already installed; nothing to do.", self.name)
            return False
        try:
            patches = self._make_patches(module)
        except Exception as exc:  # an unexpected library version: capture skips it, the library works
            logger.warning(
                "llmtap could not hook %s (%s); its calls are not captured.", self.name, type(exc).__name__
            )
            return False
        patches = [patch for patch in patches if wrapped_original(patch.original) is None]
        for patch in patches:
            patch.apply()
        self._patches = patches
        self.installed = True
        return True

    def uninstall(self) -> None:
        """Restore every attribute this hook replaced and still owns."""
        for patch in reversed(self._patches):
            patch.revert()
        self._patches = []
        self.installed = False
