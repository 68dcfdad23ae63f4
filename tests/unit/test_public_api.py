"""The public API: ``__all__``, the final framework methods, one exception tree, the
files the package ships (the installed package seen from other processes:
tests/tools/test_installed_package.py)."""

from __future__ import annotations

import importlib
import inspect

import streamjobs


def test_all_matches_public_names() -> None:
    public = {n for n in vars(streamjobs) if not n.startswith("_")} - {"annotations"}
    modules = {n for n, v in vars(streamjobs).items() if inspect.ismodule(v)}
    assert set(streamjobs.__all__) == public - modules
    assert list(streamjobs.__all__) == sorted(streamjobs.__all__)


def test_framework_methods_are_final_and_handle_is_abstract() -> None:
    cls = streamjobs.StreamConsumer
    assert cls.__abstractmethods__ == frozenset({"handle"})
    for name in ("run", "aclose", "claim", "finish", "wait_ready"):
        assert getattr(getattr(cls, name), "__final__", False), name


def test_exception_tree_has_one_root() -> None:
    import streamjobs.testing

    for module in (streamjobs, streamjobs.testing):
        for name in module.__all__:
            obj = getattr(module, name)
            if inspect.isclass(obj) and issubclass(obj, BaseException):
                assert issubclass(obj, streamjobs.StreamJobsError), name


def test_package_ships_typed_marker_and_lua() -> None:
    from importlib.resources import files

    root = files("streamjobs")
    assert (root / "py.typed").is_file()
    from streamjobs._redis._scripts import NAMES, source

    for name in NAMES:
        text = source(name)
        assert text.startswith(f"-- {name}.lua"), name
        assert "KEYS[1]" in text
        assert "\n--#include" not in text, f"{name}: an include left unexpanded"
    importlib.import_module("streamjobs.cli")
