"""Symmetric patching: install once, undo only our own wrapper, the layering guard."""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

from llmtap.hooks.base import Hook, Patch, claim_call, inside_hooked_call, release_call, wrapped_original


class Library:
    def send(self) -> str:
        return "original"


def _wrap(original: Any) -> Any:
    def send(self: Any) -> str:
        return "wrapped:" + str(original(self))

    return send


class LibraryHook(Hook):
    name = "library"
    module_name = "library"

    def _make_patches(self, module: Any) -> list[Patch]:
        return [Patch(module.Library, "send", _wrap)]


def _module() -> Any:
    return SimpleNamespace(Library=type("Library", (Library,), {"send": Library.send}))


def test_install_patches_and_uninstall_restores_the_original() -> None:
    module = _module()
    original = module.Library.__dict__["send"]
    hook = LibraryHook()
    assert hook.install(module) is True
    assert module.Library().send() == "wrapped:original"
    assert wrapped_original(module.Library.__dict__["send"]) is original
    hook.uninstall()
    assert module.Library.__dict__["send"] is original
    assert module.Library().send() == "original"


def test_installing_twice_patches_once() -> None:
    module = _module()
    first, second = LibraryHook(), LibraryHook()
    assert first.install(module) is True
    assert first.install(module) is False
    assert second.install(module) is True  # a second hook object finds the method already ours
    assert module.Library().send() == "wrapped:original"
    first.uninstall()
    second.uninstall()
    assert module.Library().send() == "original"


def test_uninstall_leaves_a_patch_applied_on_top_of_ours() -> None:
    module = _module()
    hook = LibraryHook()
    hook.install(module)
    ours = module.Library.__dict__["send"]

    def theirs(self: Any) -> str:
        return "theirs:" + str(ours(self))

    module.Library.send = theirs
    hook.uninstall()
    assert module.Library.__dict__["send"] is theirs
    assert module.Library().send() == "theirs:wrapped:original"


def test_a_hook_that_cannot_find_its_target_installs_nothing() -> None:
    hook = LibraryHook()
    assert hook.install(SimpleNamespace()) is False
    assert hook.installed is False


def test_the_guard_is_claimed_for_the_call_and_released_after() -> None:
    assert inside_hooked_call() is False
    token = claim_call()
    try:
        assert inside_hooked_call() is True
    finally:
        release_call(token)
    assert inside_hooked_call() is False
