"""`gguf-trainer publish` against the local Hub (hub_server.py, which speaks the upload calls
huggingface_hub 2.4 makes): the adapter and its card arrive in one commit; a mock-teacher or
demo-student adapter, a file the project did not export and a missing login are refused
before any request; a refused token and an unreachable Hub are one sentence each."""

from __future__ import annotations

import getpass
import hashlib
import os
import pwd
import re

import pytest
from publish_project import TEACHER_COMMIT, TOKENIZER_COMMIT, front_matter, make_project

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.exit_codes import EXIT_OK, EXIT_USER
from gguf_trainer.cli import main
from gguf_trainer.packs.teacher_repos import T5_V1_1_XXL
from gguf_trainer.runner import publish

TOKEN = "hf_publish_test_token"
REPO = "tester/pig-t5-adapter"


@pytest.fixture
def hub(hub_server, monkeypatch):
    """The local Hub with a write token in HF_TOKEN, and the student tokenizer's repo, whose
    card states a license the saved listing lacks (asked of the Hub at publish)."""
    hub_server.tokens.add(TOKEN)
    monkeypatch.setenv("HF_TOKEN", TOKEN)
    tokenizer = hub_server.add_repo("callgg/pig-clip-tokenizer", {"config.json": b"{}"},
                                    card_data={"license": "mit"})
    tokenizer.commit = TOKENIZER_COMMIT  # the commit its saved listing names
    return hub_server


def writes(server) -> list:
    return [(m, p) for m, p, _ in server.requests if m in ("POST", "PUT")]


def test_publish_puts_the_adapter_and_its_card_in_one_commit(hub, tmp_path):
    project, final = make_project(tmp_path)
    res = publish.publish(project.dir, REPO, private=True)

    assert res["created"] and res["changed"]
    assert res["files"] == [final.name, "README.md"]
    assert len(hub.commits) == 1 and sorted(hub.commits[0]["files"]) == ["README.md", final.name]
    repo = hub.repos[("model", REPO)]
    assert repo.private
    assert sorted(repo.files) == ["README.md", final.name]  # nothing else went up
    assert repo.files[final.name] == final.read_bytes()
    assert repo.is_lfs(final.name) and not repo.is_lfs("README.md")
    assert hub.lfs_puts() == [hashlib.sha256(final.read_bytes()).hexdigest()]
    card = repo.files["README.md"].decode()
    assert card == res["card"]

    meta = front_matter(card)
    assert meta["library_name"] == "gguf" and meta["license"] == "apache-2.0"
    assert meta["base_model"] == [T5_V1_1_XXL]
    assert {"gguf", "ggk", "pig_clip", "t5xxl_pixart"} <= set(meta["tags"])
    assert meta["datasets"] == ["Gustavosta/Stable-Diffusion-Prompts"]
    for fact in ((f"{T5_V1_1_XXL}](https://huggingface.co/{T5_V1_1_XXL}) at commit "
                 f"`{TEACHER_COMMIT}`"), f"`{TOKENIZER_COMMIT}`", "license: `mit`",
                 "--llm pig_clip-f16.gguf --llm-adapter pig_t5_adapter-f16.gguf",
                 "**cos = 0.8123**", "beats the mean baseline (0.5100", "| mse | 0.1042 | 0.3000 |",
                 "500 trained of 500 planned", "ggk 0.9.7", "2,000 training and 64 validation",
                 "1 local prompt file (not published)", "PixArt",
                 hashlib.sha256(final.read_bytes()).hexdigest()):
        assert fact in card, fact

    # No local path, home folder or user name: only repos, revisions and file names.
    for private_text in {str(project.dir), str(tmp_path), os.path.expanduser("~"),
                         pwd.getpwuid(os.getuid()).pw_dir, str(final)}:
        assert private_text not in card, private_text
    assert not re.search(rf"\b{re.escape(getpass.getuser())}\b", card)

    # The same files again: nothing is sent, no second commit.
    before = len(hub.lfs_puts())
    again = publish.publish(project.dir, REPO)
    assert not again["changed"] and len(hub.commits) == 1 and len(hub.lfs_puts()) == before
    assert "nothing was committed" in publish.describe(again)[0]


def test_cli_publish_prints_where_and_exits_0(hub, tmp_path, capsys):
    project, final = make_project(tmp_path)
    code = main(["publish", "--project", str(project.dir), "--repo", REPO,
                 "--license", "other"])
    out = capsys.readouterr()
    assert code == EXIT_OK, out.err
    assert f"published {final.name}, README.md to {hub.url}/{REPO}" in out.out
    assert front_matter(hub.repos[("model", REPO)].files["README.md"].decode())[
        "license"] == "other"
    # the GUI's box reads a CLI publish from the same job state as its own detached one
    from gguf_trainer.runner.publish_job import publish_status

    st = publish_status(project.dir)
    assert st["status"] == "done" and st["result"]["url"] == f"{hub.url}/{REPO}"
    assert st["job_id"].startswith("foreground-") and "card" not in st["result"]
    # --private on a repo that exists: said, not silently ignored
    code = main(["publish", "--project", str(project.dir), "--repo", REPO, "--private",
                 "--license", "other"])
    out = capsys.readouterr().out
    assert code == EXIT_OK and "nothing was committed" in out
    assert "--private left its visibility as it was" in out
    assert not hub.repos[("model", REPO)].private and len(hub.commits) == 1


@pytest.mark.parametrize("kind, says", [
    ("mock", "trained with the mock teacher"),
    ("tiny_student", "the demo's tiny stand-in student (input width 64"),
    ("tiny_teacher", "tiny stand-in teacher"),
])
def test_stand_in_adapters_are_refused_before_any_request(hub, tmp_path, capsys, kind, says):
    from gguf_trainer.base.paths import TINY_MARKER

    project, _ = make_project(tmp_path, mock=kind == "mock",
                              in_dim=64 if kind == "tiny_student" else 1024)
    if kind == "tiny_teacher":
        (project.material_path("teacher") / TINY_MARKER).write_text("stand-in")
    with pytest.raises(UserError, match=re.escape(says)):
        publish.publish(project.dir, REPO)
    code = main(["publish", "--project", str(project.dir), "--repo", REPO])
    err = capsys.readouterr().err
    assert code == EXIT_USER and says in err and "Traceback" not in err
    assert len(err.strip().splitlines()) == 1
    assert hub.requests == []  # refused before anything reached the Hub


def test_only_the_projects_own_exports_are_published(hub, tmp_path):
    project, final = make_project(tmp_path)
    stray = tmp_path / "someone-elses.gguf"
    stray.write_bytes(final.read_bytes())
    with pytest.raises(UserError, match="not a file this project exported.*pig_t5_adapter-f16"):
        publish.publish(project.dir, REPO, files=[str(stray)])
    final.unlink()
    with pytest.raises(UserError, match="no exported adapter on disk"):
        publish.publish(project.dir, REPO)
    assert hub.requests == []


def test_no_login_and_a_bad_repo_id_are_refused_before_any_request(hub, tmp_path, monkeypatch,
                                                                   capsys):
    project, _ = make_project(tmp_path)
    with pytest.raises(UserError, match="not a Hub repo id; give it as USER/NAME"):
        publish.publish(project.dir, "no-slash")
    monkeypatch.delenv("HF_TOKEN")
    code = main(["publish", "--project", str(project.dir), "--repo", REPO])
    err = capsys.readouterr().err
    assert code == EXIT_USER and "publishing needs a Hugging Face login" in err
    assert hub.requests == []


def test_a_refused_token_is_one_sentence(hub, tmp_path, monkeypatch, capsys):
    project, _ = make_project(tmp_path)
    monkeypatch.setenv("HF_TOKEN", "hf_not_a_token_this_hub_knows")
    code = main(["publish", "--project", str(project.dir), "--repo", REPO])
    err = capsys.readouterr().err
    assert code == EXIT_USER, err
    assert "the Hub refused your token for tester/pig-t5-adapter (401)" in err
    assert len(err.strip().splitlines()) == 1 and not hub.commits


def test_an_unreachable_hub_is_one_sentence(hub, tmp_path, monkeypatch, capsys):
    import socket

    project, _ = make_project(tmp_path)
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    monkeypatch.setenv("HF_ENDPOINT", f"http://127.0.0.1:{port}")
    code = main(["publish", "--project", str(project.dir), "--repo", REPO])
    err = capsys.readouterr().err
    assert code == EXIT_USER, err
    assert f"cannot reach the Hub at http://127.0.0.1:{port}" in err
    assert "publishing again sends only the rest" in err and len(err.strip().splitlines()) == 1


def test_a_download_saves_the_license_its_repo_card_states(hub, tmp_path):
    """The card's license fields come from the listing each download saves."""
    from gguf_trainer.materials import hub as hub_mod
    from gguf_trainer.store.model_card import snapshot_record

    hub.add_repo("org/teacher", {"config.json": b"{}"}, card_data={"license": "apache-2.0"})
    listing = hub_mod.list_remote("org/teacher", "model", ("config.json",))
    hub_mod.save_listing(listing, tmp_path / "teacher")
    assert snapshot_record(tmp_path / "teacher") == {
        "repo": "org/teacher", "revision": "main", "commit": listing.commit,
        "license": "apache-2.0"}


def test_a_project_linked_to_the_demos_tiny_student_is_refused(hub, tmp_path, tiny_materials):
    """An adapter of pig_clip's width, but the project's student is the tiny stand-in."""
    from gguf_trainer.store.project import update_settings

    project, _ = make_project(tmp_path)
    update_settings(project.dir, {"materials.student.path": str(tiny_materials["student"])})
    with pytest.raises(UserError, match=re.escape(
            "the demo's tiny stand-in student (the project's student file is it)")):
        publish.publish(project.dir, REPO)
    assert hub.requests == []


def test_a_folder_without_a_project_exits_2(hub, tmp_path, capsys):
    from gguf_trainer.base.exit_codes import EXIT_NO_PROJECT

    code = main(["publish", "--project", str(tmp_path / "nothing"), "--repo", REPO])
    assert code == EXIT_NO_PROJECT and hub.requests == []
