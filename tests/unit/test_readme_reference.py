"""The README is the user's manual: every pack has its row in the pack table (teacher, adapter
kind) and in the ggk-command table (the command the pack prints, character for character),
and every subcommand and option of the CLI is in the Command line synopsis."""

from __future__ import annotations

import argparse
import re
from pathlib import Path

import pytest

from gguf_trainer import cli, packs

README = Path(__file__).resolve().parents[2] / "README.md"
# The packs that ship: other test modules register their own test packs while the suite collects.
SHIPPED = [i for i in packs.pack_ids()
           if type(packs.get_pack(i)).__module__.startswith("gguf_trainer.packs.")]


def readme() -> str:
    return README.read_text(encoding="utf-8")


def table_rows(header: str) -> dict[str, str]:
    """The rows of the README table whose header line starts with `header`, by the pack id
    in their first cell."""
    text = readme()
    assert header in text, f"the README has no table headed {header!r}"
    body = text.split(header, 1)[1].split("\n\n", 1)[0]
    rows = {}
    for line in body.splitlines()[2:]:
        m = re.match(r"\| `([a-z0-9_]+)` \|", line)
        if m:
            rows[m.group(1)] = line
    return rows


def printed_command(pack) -> str:
    """The command the pack prints for a project whose student is pig_clip-f16.gguf and whose
    adapter has the pack's default name (LLaDA: its SigVQ companion exported)."""
    from gguf_trainer.store.results import printed_command

    extras = {"sigvq": "pig_llada_sigvq-f16.gguf"} if pack.id == "llada_image" else None
    return printed_command(pack, extras=extras)[0]  # the one function every place prints with


@pytest.mark.parametrize("pack_id", SHIPPED)
def test_every_pack_has_its_row_in_the_pack_table(pack_id):
    pack = packs.get_pack(pack_id)
    rows = table_rows("| pack id | family: the text encoder it replaces | teacher |")
    assert pack_id in rows, f"{pack_id} has no row in the README's pack table"
    row = rows[pack_id]
    assert f"`{pack.adapter_kind}`" in row, f"{pack_id}: its adapter kind is {pack.adapter_kind}"
    teacher = pack.teacher_materials[0]
    want = f"`{teacher.repo}`" if teacher.repo else "link a local copy"
    assert want in row, f"{pack_id}: its teacher is {want}"


@pytest.mark.parametrize("pack_id", SHIPPED)
def test_every_pack_has_the_ggk_command_it_prints(pack_id):
    rows = table_rows("| pack id | ggk command |")
    assert pack_id in rows, f"{pack_id} has no row in the README's ggk command table"
    cmd = printed_command(packs.get_pack(pack_id))
    assert f"| `{cmd}` |" in rows[pack_id], f"{pack_id}: the pack prints {cmd}"


@pytest.mark.parametrize("pack_id", SHIPPED)
def test_a_printed_command_pastes_into_bash(pack_id):
    """Issue 31 item 9: no unquoted `<placeholder>` (bash reads `<` as a redirect): each is
    one quoted word, and a line says what to put there."""
    from gguf_trainer.store.results import printed_command

    cmd, notes = printed_command(packs.get_pack(pack_id))
    bare = re.sub(r"'[^']*'|\"[^\"]*\"", "", cmd)  # what the shell reads outside quotes
    assert "<" not in bare and ">" not in bare, cmd
    for word in re.findall(r"'(<[^']*>)'", cmd):
        assert any(n.startswith(f"'{word}': put the path") for n in notes), word


def test_the_tables_list_no_pack_that_does_not_exist():
    known = set(SHIPPED)
    for header in ("| pack id | family: the text encoder it replaces | teacher |",
                   "| pack id | ggk command |"):
        assert set(table_rows(header)) == known


def synopsis() -> dict[str, str]:
    """The Command line section's synopsis block: its `gguf-trainer CMD ...` line per command."""
    section = readme().split("\n## Command line\n", 1)[1].split("\n## ", 1)[0]
    block = section.split("```bash\n", 1)[1].split("```", 1)[0]
    lines = {}
    for line in block.splitlines():
        words = line.split()
        if len(words) > 1 and words[0] == "gguf-trainer":
            lines[words[1]] = line
    return lines


def options(parser: argparse.ArgumentParser) -> list[str]:
    """The long option strings of a parser (its --help left out)."""
    return [s for a in parser._actions for s in a.option_strings
            if s.startswith("--") and s != "--help"]


def subcommands() -> dict[str, argparse.ArgumentParser]:
    parser = cli.build_parser()
    sub = next(a for a in parser._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


@pytest.mark.parametrize("name", sorted(subcommands()))
def test_every_subcommand_and_option_is_in_the_synopsis(name):
    lines = synopsis()
    assert name in lines, f"`gguf-trainer {name}` is missing from the README's synopsis"
    for opt in options(subcommands()[name]):
        assert re.search(rf"{re.escape(opt)}\b", lines[name]), (
            f"`gguf-trainer {name} {opt}` is missing from the README's synopsis")


def test_every_top_level_option_is_documented():
    text = readme()
    for opt in options(cli.build_parser()):
        assert f"`{opt}" in text or f"| {opt}" in text or f"{opt} |" in text, (
            f"`gguf-trainer {opt}` is not described in the README")
