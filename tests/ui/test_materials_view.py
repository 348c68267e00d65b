"""The Materials table on Setup: where each material came from, and Replace."""

from __future__ import annotations

import pytest
from material_repos import pig_clip_header_gguf

from gguf_trainer.base.errors import UserError
from gguf_trainer.store.project import create_project
from gguf_trainer.ui import materials_section


@pytest.fixture(autouse=True)
def home(tmp_path, monkeypatch):
    monkeypatch.setenv("GGUF_TRAINER_HOME", str(tmp_path / "gt_home"))


def test_the_table_says_where_each_came_from_and_replace_links_a_checked_copy(tmp_path):
    root = tmp_path / "projects" / "p"
    create_project(root, "t5xxl_pixart")
    table = materials_section.materials_view(str(root))[0]
    header = table.splitlines()[0]
    assert "| need |" in header and "| from |" in header and "|  |" not in header  # no empty header
    shared = tmp_path / "shared"
    shared.mkdir()
    student = pig_clip_header_gguf(shared / "pig_clip-f16.gguf")
    said = materials_section.replace_material(str(root), "student", str(student))
    assert said.startswith("Student: pig_clip GGUF: now ready, linked from `…/")
    row = next(line for line in materials_section.materials_view(str(root))[0].splitlines()
               if line.startswith("| Student: pig_clip GGUF"))
    assert "linked from `…/" in row and "shared`" in row
    (shared / "notes.txt").write_text("not a model")
    with pytest.raises(UserError, match="is not a GGUF file"):
        materials_section.replace_material(str(root), "student", str(shared / "notes.txt"))
    with pytest.raises(UserError, match="choose the material"):
        materials_section.replace_material(str(root), None, str(student))
