"""The file browser shows nothing outside its roots: absolute paths, `..`, symlinks, blocked
places (SSH keys, the HF token store), and keeps the user's extra roots."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from gguf_trainer.base.errors import UserError
from gguf_trainer.ui import files


@pytest.fixture
def tree(tmp_path, monkeypatch):
    home = tmp_path / "home"
    monkeypatch.setenv("HOME", str(home))
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "gt_home"))
    monkeypatch.delenv("GGUF_TRAINER_MATERIALS", raising=False)
    # blocked places are computed from the (patched) home
    monkeypatch.setattr(files, "blocked_real_paths",
                        lambda: [home / ".ssh", home / ".cache" / "huggingface" / "token"])
    root = tmp_path / "root"
    (root / "models").mkdir(parents=True)
    (root / "models" / "pig_clip-f16.gguf").write_bytes(b"GGUF" + b"\0" * 10)
    (root / "notes.txt").write_text("x")
    (root / ".hidden").write_text("x")
    (root / "proj").mkdir()
    (root / "proj" / "project.json").write_text("{}")
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "secret.txt").write_text("s")
    (root / "escape").symlink_to(outside)  # a link out of the root
    (root / "inner").symlink_to(root / "models")  # a link that stays inside
    (home / ".ssh").mkdir(parents=True)
    (home / ".ssh" / "id_ed25519").write_text("key")
    return {"root": root, "outside": outside, "home": home, "tmp": tmp_path}


def test_lists_a_root_without_dot_entries_or_escaping_links(tree):
    folder, entries = files.list_dir(str(tree["root"]), [str(tree["root"])])
    names = [e.name for e in entries]
    assert folder == tree["root"].resolve()
    assert names == ["inner", "models", "proj", "notes.txt"]  # folders first; no .hidden, no escape
    assert next(e for e in entries if e.name == "proj").is_project
    _, only_gguf = files.list_dir(str(tree["root"] / "models"), [str(tree["root"])], (".gguf",))
    assert [e.name for e in only_gguf] == ["pig_clip-f16.gguf"] and only_gguf[0].size == 14


@pytest.mark.parametrize("how", ["absolute", "dotdot", "symlink", "relative"])
def test_cannot_list_outside_the_roots(tree, how):
    root = tree["root"]
    path = {"absolute": str(tree["outside"]), "dotdot": f"{root}/models/../../outside",
            "symlink": str(root / "escape"), "relative": "outside"}[how]
    with pytest.raises(UserError):
        files.list_dir(path, [str(root)])


def test_blocked_places_are_never_listed_even_inside_a_root(tree):
    home = tree["home"]
    with pytest.raises(UserError, match="blocked"):
        files.list_dir(str(home / ".ssh"), [str(home)])
    _, entries = files.list_dir(str(home), [str(home)])
    assert ".ssh" not in [e.name for e in entries]


def test_roots_are_project_parent_home_and_cli_roots_and_saved_ones(tree, monkeypatch):
    extra = tree["tmp"] / "extra"
    extra.mkdir()
    proj = tree["root"] / "proj"
    monkeypatch.setenv("GGUF_TRAINER_MATERIALS", str(tree["outside"]))
    files.save_roots([str(extra), "  ", str(extra)])
    roots = files.browse_roots(str(proj), [str(tree["tmp"] / "missing"), str(tree["root"])])
    assert roots == [
        str(p.resolve()) for p in (proj, tree["root"], tree["home"], tree["outside"], extra)
    ]
    assert files.saved_roots() == [str(extra)]
    with pytest.raises(UserError, match="absolute"):
        files.save_roots(["relative/dir"])
    with pytest.raises(UserError, match="blocked"):
        files.save_roots([str(tree["home"] / ".ssh")])


def test_big_folders_are_cut(tree, monkeypatch):
    big = tree["root"] / "big"
    big.mkdir()
    for i in range(30):
        (big / f"f{i:03d}.txt").write_text("")
    monkeypatch.setattr(files, "MAX_ENTRIES", 10)
    _, entries = files.list_dir(str(big), [str(tree["root"])])
    assert len(entries) == 10


def test_a_root_that_is_a_symlink_still_confines(tree):
    link_root = tree["tmp"] / "linkroot"
    os.symlink(tree["root"], link_root)
    folder, _ = files.list_dir(str(link_root / "models"), [str(link_root)])
    assert folder == (tree["root"] / "models").resolve()
    with pytest.raises(UserError):
        files.list_dir(str(Path(link_root) / "escape"), [str(link_root)])


@pytest.mark.parametrize("env", ["/", "tmp"])
def test_the_environment_root_is_refused_like_a_browse_root(tree, monkeypatch, env):
    """GGUF_TRAINER_MATERIALS=/ (or a folder holding ~/.ssh) is no root: Browse roots refuses
    the same folder, and the browser would otherwise list /etc (issue 29, item 7)."""
    folder = "/" if env == "/" else str(tree["tmp"])
    monkeypatch.setenv("GGUF_TRAINER_MATERIALS", folder)
    roots = files.browse_roots(None)
    assert "/" not in roots and str(tree["tmp"].resolve()) not in roots
    with pytest.raises(UserError):
        files.confine("/etc", roots)
