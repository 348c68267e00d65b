"""The README's "Adding a pack" example is a working pack: one file of declarations that
registers, builds a demo project and has its teacher files checked like a built-in pack's."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from gguf_trainer import packs
from gguf_trainer.demo import prepare_demo
from gguf_trainer.store.project import load_project
from gguf_trainer.store.results import ggk_command

README = Path(__file__).resolve().parents[3] / "README.md"


def readme_pack_source() -> str:
    text = README.read_text(encoding="utf-8")
    section = text.split("## Adding a pack", 1)[1].split("\n## ", 1)[0]
    blocks = re.findall(r"```python\n(.*?)```", section, flags=re.DOTALL)
    assert len(blocks) == 1, "the section shows one pack file"
    return blocks[0]


@pytest.fixture
def readme_pack(monkeypatch):
    scope = {"__name__": "gguf_trainer.packs.t5xxl_mymodel", "__package__": "gguf_trainer.packs"}
    exec(compile(readme_pack_source(), "README.md", "exec"), scope)  # noqa: S102 - our own README
    monkeypatch.setitem(packs._PACKS, scope["PACK"].id, scope["PACK"])
    return scope["PACK"]


def test_the_readme_pack_is_one_file_of_declarations(readme_pack):
    """It subclasses the T5 kind, no family, and resets none of PixArt's facts: no verdict, no
    reference, not the check default, unless it declares them."""
    from gguf_trainer.packs.t5_seeded import T5SeededPack

    source = readme_pack_source()
    assert type(readme_pack).__bases__ == (T5SeededPack,)
    for fact in ("verdict", "reference", "check_default_for_kind"):
        assert f"{fact} =" not in source, fact
    assert packs.get_pack("t5xxl_mymodel") is readme_pack
    assert readme_pack.verdict is None and readme_pack.reference == {}
    assert not readme_pack.check_default_for_kind and not readme_pack.remote_code
    assert readme_pack.health_line({"cos": 0.9, "baseline_cos": 0.5}) == (
        "n/a: no published pig_clip + My model (T5-XXL) run to compare with; cos 0.9000 "
        "(mean baseline 0.5000)"
    )
    assert readme_pack.num_queries == readme_pack.max_len_teacher == 120


def test_the_readme_pack_builds_a_demo_project(readme_pack, tmp_path):
    root = prepare_demo("t5xxl_mymodel", tmp_path / "demo", steps=2)
    project = load_project(root)
    assert project.settings.pack == "t5xxl_mymodel"
    assert project.settings.name == "pig_mymodel_t5_adapter"
    # the demo's tiny T5 passes the pack's header check, as it does for PixArt
    assert project.pack.check_teacher({"teacher": project.material_path("teacher")})
    cmd, notes = ggk_command(project)
    assert "--diffusion-model mymodel-q8_0.gguf" in cmd
    assert "run pig_clip at f16 or q8_0" in " ".join(notes)
