"""The adapters' public surface: the names a service's code calls."""

from __future__ import annotations

import inspect

import pytest

from warden.adapters import mcp, openai

SURFACE = {
    openai: {
        "tools": {"actor", "context", "strict"},
        "atools": {"actor", "context", "strict"},
        "call": {"actor", "context", "cancel", "strict"},
        "acall": {"actor", "context", "cancel", "strict"},
        "tool_name": set(),
        "capability_id": set(),
        "strict_schema": set(),
        "strict_arguments": set(),
    },
    mcp: {
        "build_server": {"actor", "context", "cancel", "name", "version"},
        "serve_stdio": {"actor", "context", "cancel", "name", "version"},
        "aserve_stdio": {"actor", "context", "cancel", "name", "version"},
    },
}
ASYNC = {"atools", "acall", "aserve_stdio"}


@pytest.mark.parametrize(
    ("module", "name"),
    [(m, n) for m, names in SURFACE.items() for n in names],
    ids=[f"{m.__name__}.{n}" for m, names in SURFACE.items() for n in names],
)
def test_adapter_function_and_its_keywords(module: object, name: str) -> None:
    function = getattr(module, name)
    assert function.__doc__
    keywords = {
        p.name
        for p in inspect.signature(function).parameters.values()
        if p.kind is inspect.Parameter.KEYWORD_ONLY
    }
    assert keywords == SURFACE[module][name]  # type: ignore[index]
    assert inspect.iscoroutinefunction(function) is (name in ASYNC)


def test_the_surfaces_are_the_adapters_names() -> None:
    assert (openai.SURFACE, mcp.SURFACE) == ("openai", "mcp")
