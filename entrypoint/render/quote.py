"""How a value is written into a script or a manifest, so that it reads back exactly as given.

Scripts (bash): a word of safe characters stays bare; one of printable characters is put in
single quotes; any other (a newline, a tab, a control or format character, a line or paragraph
separator) in ANSI-C quotes, `$'...'`, with every such character escaped (`\\n`, or its UTF-8
bytes as `\\xHH`, which bash turns back into the same bytes whatever the locale). So a quoted word
never spans two lines: a comment quoting a command ends where its line does.

Manifests (YAML 1.1, as kubectl reads them with go-yaml v2): a string stays plain only when it is
an identifier that no YAML 1.1 reader takes for anything else; every other string is double-quoted
with JSON's escapes (`\\"`, `\\\\`, `\\n`, `\\uXXXX`), so `1e-4`, `y`, `no`, `0x1F`, `012`, `.inf`,
`~`, `null`, `1_000`, `1:20` and dates stay strings, and a newline cannot start a new line.
"""

from __future__ import annotations

import re
from collections.abc import Iterable

# Words bash and every reader of a command line take as themselves (shlex.quote's set).
_SHELL_SAFE = re.compile(r"[A-Za-z0-9@%+=:,./_-]+", re.ASCII)
_SHELL_ESCAPES = {"\n": "\\n", "\t": "\\t", "\r": "\\r", "\\": "\\\\", "'": "\\'"}

# A plain YAML scalar no YAML 1.1 reader resolves to a non-string: it starts with a letter or /
# (not a digit, sign, dot or indicator) and is none of the 1.1 booleans or nulls, in any case.
_YAML_PLAIN = re.compile(r"[A-Za-z/][A-Za-z0-9_./-]*", re.ASCII)
_YAML_WORDS = {"y", "n", "yes", "no", "on", "off", "true", "false", "null"}
_JSON_ESCAPES = {
    '"': '\\"',
    "\\": "\\\\",
    "\n": "\\n",
    "\t": "\\t",
    "\r": "\\r",
    "\b": "\\b",
    "\f": "\\f",
}


def _printable(char: str) -> bool:
    return char == " " or char.isprintable()


def shell_word(word: str) -> str:
    """`word` as one bash word, on one line."""
    if _SHELL_SAFE.fullmatch(word):
        return word
    if all(_printable(char) for char in word):
        return "'" + word.replace("'", "'\"'\"'") + "'"
    out = []
    for char in word:
        if char in _SHELL_ESCAPES:
            out.append(_SHELL_ESCAPES[char])
        elif _printable(char):
            out.append(char)
        else:
            out.extend(f"\\x{byte:02x}" for byte in char.encode())
    return "$'" + "".join(out) + "'"


def shell_join(words: Iterable[str]) -> str:
    return " ".join(shell_word(word) for word in words)


def yaml_str(value: str) -> str:
    """`value` as a YAML scalar that go-yaml v2 and PyYAML both read back as this string."""
    if _YAML_PLAIN.fullmatch(value) and value.lower() not in _YAML_WORDS:
        return value
    out = []
    for char in value:
        if char in _JSON_ESCAPES:
            out.append(_JSON_ESCAPES[char])
        elif _printable(char):
            out.append(char)  # printable non-ASCII text stays readable
        elif ord(char) > 0xFFFF:
            out.append(f"\\U{ord(char):08x}")  # YAML's escape; JSON would need a surrogate pair
        else:
            out.append(f"\\u{ord(char):04x}")
    return '"' + "".join(out) + '"'
