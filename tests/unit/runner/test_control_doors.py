"""The one door to materials, downloads, code trust and the Hugging Face token: the GUI and
the CLI call runner.control for each (no module looked up by name), and `gguf-trainer
login` stores the token where the GUI's Store token does."""

from __future__ import annotations

import os
import stat
import subprocess
import sys

import pytest

from gguf_trainer.base.exit_codes import EXIT_OK, EXIT_USER
from gguf_trainer.runner import control
from gguf_trainer.store.project import create_project
from gguf_trainer.teachers import trust
from gguf_trainer.tiny.llada import copy_tiny_llada
from gguf_trainer.ui import api, common, materials_section


def _login(token: str, hf_home) -> subprocess.CompletedProcess:
    env = {**os.environ, "HF_HOME": str(hf_home)}
    env.pop("HF_TOKEN", None)
    return subprocess.run([sys.executable, "-m", "gguf_trainer.cli", "login"], input=token,
                          capture_output=True, text=True, env=env, timeout=120, check=False)


def test_login_stores_the_token_for_huggingface_hub_only_readable_by_us(tmp_path):
    res = _login("hf_secret123\n", tmp_path / "hf")
    assert res.returncode == EXIT_OK, res.stderr
    assert res.stdout.strip() == "A Hugging Face token is stored." and "hf_secret" not in res.stdout
    token = tmp_path / "hf" / "token"
    assert token.read_text() == "hf_secret123"
    assert stat.S_IMODE(token.stat().st_mode) == 0o600


def test_login_refuses_a_token_with_spaces_and_writes_nothing(tmp_path):
    res = _login("hf_ab cd\n", tmp_path / "hf")
    assert res.returncode == EXIT_USER and "no spaces" in res.stderr
    assert not (tmp_path / "hf" / "token").exists()


def test_the_gui_reaches_materials_and_trust_through_control(tmp_path, monkeypatch):
    monkeypatch.setenv(trust.HOME_ENV, str(tmp_path / "home"))
    teacher = copy_tiny_llada(tmp_path / "LLaDA-Image-Turbo", with_sigvq=False)
    root = tmp_path / "proj"
    create_project(root, "llada_image",
                   overrides={"materials": {"teacher": {"path": str(teacher)}}})
    assert not hasattr(common, "feature")  # no lookups by name left
    rows = api.materials(str(root))["materials"]
    assert rows == control.material_statuses(root)
    untrusted = control.untrusted_code(root)
    assert [u["path"] for u in untrusted] == [str(teacher)] and untrusted[0]["title"]
    assert materials_section.trust_view(str(root))[1]["visible"] is True  # the Trust button shows
    assert control.trust_code(root) == [str(teacher)]
    assert control.untrusted_code(root) == [] and trust.trust_status(teacher)["trusted"]


@pytest.mark.parametrize("token", ["", "   "])
def test_store_token_refuses_an_empty_token(token):
    with pytest.raises(Exception, match="paste a Hugging Face token"):
        control.store_token(token)
