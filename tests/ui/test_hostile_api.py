"""The GUI's API endpoints called as any client can: bad values are one short sentence.

The endpoints are the functions `ui/api.py` registers (gradio_client calls exactly these,
through `common.user_errors`, which turns a UserError into the sentence the client gets;
anything else would be Gradio's generic error and a traceback in the GUI log).
"""

from __future__ import annotations

import inspect
import json
from pathlib import Path

import pytest

from gguf_trainer.base.errors import UserError
from gguf_trainer.ui import api

PACK = "t5xxl_pixart"
BAD_FOLDERS = ["x\0y", 5, 1.5, ["a"], {"a": 1}, None, "", "   "]


@pytest.fixture
def proj(tmp_path):
    return api.create_project(str(tmp_path / "p"), PACK, "")["root"]


def _args(name: str, folder) -> list:
    """`folder` first, then plausible values for the endpoint's other required arguments."""
    params = list(inspect.signature(getattr(api, name)).parameters.values())[1:]
    fill = {"pack": PACK, "changes": {}, "target": "train", "steps": "10", "step": 500,
            "repo": "me/pig_t5_adapter"}
    return [folder] + [fill[p.name] for p in params if p.default is inspect.Parameter.empty]


@pytest.mark.parametrize("folder", BAD_FOLDERS, ids=repr)
def test_every_endpoint_answers_a_bad_folder_with_a_sentence(folder, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    for name in api.ENDPOINTS:
        with pytest.raises(UserError) as e:
            getattr(api, name)(*_args(name, folder))
        assert len(str(e.value)) < 300, name
    assert not list(tmp_path.iterdir())  # nothing written into the GUI's working folder


def test_an_empty_path_never_creates_a_project_in_the_working_folder(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    with pytest.raises(UserError, match="empty"):
        api.create_project("", PACK, "")
    assert not (tmp_path / "project.json").exists()


def test_a_folder_with_someone_elses_files_does_not_become_a_project(tmp_path):
    folder = tmp_path / "photos"
    (folder / "data").mkdir(parents=True)
    (folder / "data" / "mine.csv").write_text("1,2\n")
    with pytest.raises(UserError, match="not empty and holds no project"):
        api.create_project(str(folder), PACK, "")
    assert sorted(p.name for p in folder.rglob("*")) == ["data", "mine.csv"]
    empty = tmp_path / "empty"
    empty.mkdir()
    assert api.create_project(str(empty), PACK, "")["ok"]  # an empty folder is fine


@pytest.mark.parametrize("changes", [None, [1, 2], "train.lr=1", 5, [["train.lr", 1]]], ids=repr)
def test_save_settings_with_changes_that_are_not_an_object(proj, changes):
    with pytest.raises(UserError, match="changes must be an object"):
        api.save_settings(proj, changes)


def test_save_settings_with_a_bad_expected(proj):
    with pytest.raises(UserError, match="expected must be the settings object"):
        api.save_settings(proj, {"train.lr": 1e-4}, ["x"])


@pytest.mark.parametrize("key", ["name", "train.device", "train.steps",
                                 "materials.student.path", "corpus.presets", "BIGKEY"])
def test_a_huge_value_is_quoted_in_at_most_80_characters(proj, key):
    big = "x" * 3_000_000
    changes = {big: 1} if key == "BIGKEY" else {key: [big] if key == "corpus.presets" else big}
    before = (Path(proj) / "project.json").read_bytes()
    try:
        out = json.dumps(api.save_settings(proj, changes))
    except UserError as e:
        out = str(e)
    assert len(out) < 2000 and "x" * 81 not in out
    assert (Path(proj) / "project.json").read_bytes() == before  # nothing written


@pytest.mark.parametrize("name,arg", [("snapshot", "checkpoint"), ("reset", "target"),
                                      ("reset_plan", "target"), ("set_steps", "steps")])
def test_other_text_arguments_are_quoted_short(proj, name, arg):
    args = _args(name, proj)
    params = [p.name for p in inspect.signature(getattr(api, name)).parameters.values()]
    kwargs = {arg: "y" * 100_000}
    args = args[:params.index(arg)] if arg in params[:len(args)] else args
    with pytest.raises(UserError) as e:
        getattr(api, name)(*args, **kwargs)
    assert len(str(e.value)) < 400 and "y" * 81 not in str(e.value)


def test_a_conflict_does_not_send_a_huge_value_back(proj):
    big = "z" * 3_000_000
    res = api.save_settings(proj, {"name": big}, {"name": "what I read"})
    assert "name" in res["conflicts"] and not res["ok"]
    assert len(json.dumps(res)) < 2000 and "z" * 81 not in json.dumps(res)
