"""docs/sdk.md is the guide to the SDK's public surface: it names every public
name, and every decorator keyword and invoke keyword it promises exists."""

from __future__ import annotations

import inspect
import re

import pytest

import warden
from tests.conftest import ROOT

GUIDE = (ROOT / "docs" / "sdk.md").read_text()


@pytest.mark.parametrize("name", warden.__all__)
def test_the_guide_names_every_public_name(name: str) -> None:
    assert re.search(rf"`(warden\.)?{re.escape(name)}[`(.]", GUIDE), name


def test_the_decorator_keywords_the_guide_lists_exist() -> None:
    parameters = inspect.signature(warden.Runtime.capability).parameters
    for keyword in (
        "side_effect",
        "errors",
        "timeout_ms",
        "exposure",
        "required_roles",
        "tags",
        "description",
        "version",
        "authorize",
    ):
        assert f"`{keyword}`" in GUIDE and keyword in parameters, keyword


def test_the_invoke_keywords_the_guide_lists_exist() -> None:
    for method in (warden.Runtime.invoke, warden.Runtime.ainvoke):
        parameters = inspect.signature(method).parameters
        for keyword in (
            "context",
            "surface",
            "approval_id",
            "idempotency_key",
            "timeout_ms",
            "retry",
            "cancel",
        ):
            assert f"`{keyword}=`" in GUIDE and keyword in parameters, keyword


def test_the_envelope_attributes_the_guide_lists_exist() -> None:
    for attribute in (
        "status",
        "output",
        "model_output",
        "error",
        "approval_id",
        "invocation_id",
        "executed_before_failure",
    ):
        assert f"`{attribute}`" in GUIDE
        assert attribute in warden.Envelope.__dataclass_fields__, attribute
