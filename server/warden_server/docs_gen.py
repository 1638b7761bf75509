"""Generate docs/reference/errors.md from the protobuf contract.

Run as ``python -m warden_server.docs_gen``; ``make proto-check`` and a test
fail when the committed file differs.
"""

from __future__ import annotations

from warden.shared.codes import CODES, STAGES


def render() -> str:
    lines = [
        "# Error reference",
        "",
        "<!-- Generated from proto/warden/v1/errors.proto by `make proto`. Do not edit. -->",
        "",
        "Every failure has a model-safe public face and a private diagnostic body.",
        "A model only ever sees one of two shapes (SI-9):",
        "",
        '- exposed: `{"code", "message", "retryable"}` plus `"details"` when present;',
        '- concealed: exactly `{"code": "INTERNAL_ERROR", "message": "The operation failed."}`.',
        "",
        "## Stages",
        "",
        "| stage | meaning |",
        "|---|---|",
    ]
    lines += [f"| `{s.name}` | {s.meaning} |" for s in STAGES.values()]
    lines += [
        "",
        "## Codes",
        "",
        "| code | stage | exposed | retryable | public message | meaning |",
        "|---|---|---|---|---|---|",
    ]
    for c in CODES.values():
        lines.append(
            f"| `{c.code}` | `{c.stage}` | {'yes' if c.exposed else '**no**'} | "
            f"{'yes' if c.retryable else 'no'} | {c.public_message} | {c.meaning} |"
        )
    lines += [
        "",
        "Declared codes (for example `NOT_ELIGIBLE`) belong to a capability: stage",
        "`execution`, exposed with their declared message and retryability.",
        "",
    ]
    return "\n".join(lines)


if __name__ == "__main__":
    print(render(), end="")
