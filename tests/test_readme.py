"""The README's examples run: every `gpusim estimate`, `memory` and `kernel` command in its code
blocks exits 0 in a scratch folder, and its Python snippet runs (issue 18: two examples used
to end out of memory)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from gpusim.cli import main

README = Path(__file__).resolve().parents[1] / "README.md"


def _blocks(language: str) -> list[str]:
    return re.findall(rf"```{language}\n(.*?)```", README.read_text(), flags=re.S)


def _commands() -> list[list[str]]:
    commands = []
    for block in _blocks("bash"):
        for line in block.replace("\\\n", " ").splitlines():
            argv = shlex.split(line, comments=True)
            if argv[:2] in (["gpusim", "estimate"], ["gpusim", "memory"],
                            ["gpusim", "kernel"]) and "..." not in argv:
                commands.append(argv[1:])
    return commands


def test_the_readme_has_commands_to_run() -> None:
    assert len(_commands()) >= 7


@pytest.mark.parametrize("argv", _commands(), ids=lambda a: " ".join(a[:4]))
def test_readme_command_runs(argv: list[str], tmp_path: Path,
                             monkeypatch: pytest.MonkeyPatch,
                             capsys: pytest.CaptureFixture[str]) -> None:
    monkeypatch.chdir(tmp_path)  # --plot and --trace write beside it
    assert main(argv) == 0, capsys.readouterr().err
    out = capsys.readouterr().out
    assert "error" not in out.lower() or "--json" in argv


def test_readme_python_snippet_runs(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.chdir(tmp_path)
    snippets = [b for b in _blocks("python") if "import gpusim" in b]
    assert snippets
    for code in snippets:
        exec(compile(code, "README.md", "exec"), {})  # the README's own code
