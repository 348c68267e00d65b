"""A linked folder is not the project (issue 29, item 3): every folder the tool writes into
inside a project is made or checked as a real directory under the project's real path."""

from __future__ import annotations

import pytest

from gguf_trainer.base import project_file
from gguf_trainer.base.errors import UserError


def test_a_linked_folder_on_the_way_is_refused_and_nothing_is_made_there(tmp_path):
    root, pictures = tmp_path / "proj", tmp_path / "Pictures"
    root.mkdir()
    pictures.mkdir()
    (root / "renders").symlink_to(pictures)
    with pytest.raises(UserError, match="renders is a symbolic link"):
        project_file.make_dir(root, root / "renders" / "20250101-s1")
    assert list(pictures.iterdir()) == []


def test_the_project_folder_itself_may_be_a_link(tmp_path):
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    made = project_file.make_dir(tmp_path / "link", tmp_path / "link" / "renders" / "x")
    assert made == real / "renders" / "x" and made.is_dir()
    made = project_file.make_dir(tmp_path / "link", tmp_path / "link" / "renders")
    assert made == real / "renders"


def test_a_file_in_the_place_of_a_folder_is_refused(tmp_path):
    (tmp_path / "shards").write_text("x")
    with pytest.raises(UserError, match="is not a folder"):
        project_file.make_dir(tmp_path, tmp_path / "shards" / "val")


def test_a_path_outside_the_project_is_refused(tmp_path):
    (tmp_path / "proj").mkdir()
    with pytest.raises(UserError, match="leads outside"):
        project_file.make_dir(tmp_path / "proj", tmp_path / "elsewhere")
