"""docs/reference/adapters.md stays true to the adapters: every example it
shows is a golden file the adapter tests compare byte for byte, and it shows
each status of each adapter."""

from __future__ import annotations

import json
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent.parent
PAGE = (ROOT / "docs" / "reference" / "adapters.md").read_text()
GOLDEN = ROOT / "tests" / "adapters" / "golden"
EXAMPLE = re.compile(r"<!-- golden: (\S+) -->\n```json\n(.*?)\n```", re.S)


def test_every_example_is_its_golden_file() -> None:
    examples = EXAMPLE.findall(PAGE)
    assert examples
    for name, shown in examples:
        golden = (GOLDEN / name).read_text()
        assert json.loads(shown) == json.loads(golden), name
        if name.startswith("openai/"):
            assert shown + "\n" == golden, f"{name}: the content is shown as its exact bytes"


def test_each_status_of_each_adapter_is_shown() -> None:
    shown = {name for name, _ in EXAMPLE.findall(PAGE)}
    for adapter in ("openai", "mcp"):
        for example in ("succeeded", "suspended", "cancelled", "policy-denied"):
            assert f"{adapter}/{example}.json" in shown
        assert any(n.startswith(f"{adapter}/not-found-") for n in shown)


def test_every_golden_class_is_named_on_the_page() -> None:
    for path in sorted(GOLDEN.glob("*/*.json")):
        if path.stem.startswith("tools"):
            continue
        named = path.stem in PAGE or f"{path.parent.name}/{path.name}" in PAGE
        assert named, path.stem
