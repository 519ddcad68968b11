"""docs/architecture.md stays true: every module it names exists where it says, and every module
and package of ``src/hybridfl`` is named in its tree ("The parts")."""

from __future__ import annotations

import re

from tests.conftest import ROOT

SRC = ROOT / "src" / "hybridfl"


def _tree() -> list[str]:
    text = (ROOT / "docs" / "architecture.md").read_text()
    start = text.index("```\nsrc/hybridfl/\n")
    return text[start + 4 : text.index("```", start + 4)].splitlines()[1:]


def _named() -> set[str]:
    """``dir/module.py`` paths the tree names: a line's first token at indentation ``2k`` is an
    entry of the folder opened by the last ``name/`` at ``2k - 2``; the ``*.py`` words of a
    folder's description column are its modules too."""
    named: set[str] = set()
    stack: list[tuple[int, str]] = []  # (indent, folder path)
    for line in _tree():
        if not line.strip():
            continue
        indent = len(line) - len(line.lstrip())
        first = line.split()[0]
        if indent >= 20:  # a description's continuation: modules of the folder above
            folder = stack[-1][1] if stack and stack[-1][0] >= 0 else ""
            named |= {f"{folder}{m}" for m in re.findall(r"\b([a-z_]+\.py)\b", line)}
            continue
        while stack and stack[-1][0] >= indent:
            stack.pop()
        parent = stack[-1][1] if stack else ""
        if first.endswith("/"):
            stack.append((indent, f"{parent}{first}"))
            named.add(f"{parent}{first}")
            rest = line.strip()[len(first) :]
            named |= {f"{parent}{first}{m}" for m in re.findall(r"\b([a-z_]+\.py)\b", rest)}
        elif first.endswith(".py"):
            named.add(f"{parent}{first}")
    return named


def test_every_module_the_doc_names_exists():
    missing = sorted(p for p in _named() if not (SRC / p).exists())
    assert missing == [], f"docs/architecture.md names {missing}, which do not exist"


def test_every_module_and_package_is_named():
    named = _named()
    actual = {
        p.relative_to(SRC).as_posix()
        for p in SRC.rglob("*.py")
        if p.name != "__init__.py" and "__pycache__" not in p.parts
    }
    packages = {p.parent.relative_to(SRC).as_posix() + "/" for p in SRC.rglob("__init__.py") if p.parent != SRC}
    unnamed = sorted((actual | packages) - named)
    assert unnamed == [], f"docs/architecture.md does not name {unnamed}"
