"""Where TOML keys are written: the lines config errors point at."""

from __future__ import annotations

import tomllib

from warden_server.tomlpos import key_lines, line_of

DOCUMENT = """\
# a comment with [brackets] and key = "value"
top = 1
[server]
listen = "127.0.0.1:0"   # trailing [comment]
a.b = "dotted"

[services."my.svc"]
namespaces = [
  "one",   # a comment ]
  "two",
]
token = "has = and [ inside"
note = \"\"\"
not_a_key = 1
[not.a.table]
\"\"\"
after = 2
inline = { x = 1, y = [1, 2] }

[[hooks]]
url = "a"
[[hooks]]
url = "b"
"""


def test_every_key_and_header_has_its_line() -> None:
    tomllib.loads(DOCUMENT)  # the module reads documents that parsed
    lines = key_lines(DOCUMENT)
    assert lines[("top",)] == 2
    assert lines[("server",)] == 3
    assert lines[("server", "listen")] == 4
    assert lines[("server", "a", "b")] == 5
    assert lines[("services", "my.svc")] == 7
    assert lines[("services", "my.svc", "namespaces")] == 8
    assert lines[("services", "my.svc", "token")] == 12
    assert lines[("services", "my.svc", "note")] == 13
    assert lines[("services", "my.svc", "after")] == 17
    assert lines[("services", "my.svc", "inline")] == 18
    assert lines[("hooks", 0, "url")] == 21
    assert lines[("hooks", 1, "url")] == 23
    assert ("services", "my.svc", "not_a_key") not in lines
    assert ("not", "a", "table") not in lines


def test_a_path_below_a_key_resolves_to_the_key_that_holds_it() -> None:
    lines = key_lines(DOCUMENT)
    assert line_of(lines, ("services", "my.svc", "namespaces", 1)) == 8
    assert line_of(lines, ("services", "my.svc", "inline", "y")) == 18
    assert line_of(lines, ("services", "my.svc", "missing")) == 7
    assert line_of(lines, ("nowhere", "at all")) is None
