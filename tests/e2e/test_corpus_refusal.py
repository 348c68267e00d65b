"""Issue 8 class 6 through the real pipeline: a finished project whose prompt file is replaced
by bytes that give no usable prompt is refused at the corpus stage — exit code for a user
error, one sentence with the reason, no model loaded — and its corpus, shards, checkpoints
and export are byte-identical afterwards (validate before destroy)."""

from __future__ import annotations

import json
import shutil

import pytest
from hostile_fs import tree_bytes
from pipeline_helpers import make_project

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.exit_codes import EXIT_USER
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import pipeline
from gguf_trainer.store.project import update_settings

pytestmark = pytest.mark.slow

PROTECTED = (
    "proj/checkpoints/",
    "proj/shards/",
    "proj/data/",
    "proj/project.json",
    "proj/eval.json",
)

MEMBERS = {  # name -> (bytes of the new prompt file, a word the refusal must contain)
    "nul_lines": (b"\x00\x01 binary \x00\n" * 60, "NUL bytes"),
    "empty_file": (b"", "usable prompts"),
    "only_blank_lines": (b"\r\n \t \n\n" * 40, "usable prompts"),
    "too_short": ("\n".join(f"é{i}" for i in range(80)).encode("latin-1"), "min_chars"),
    "bad_jsonl": (b"\n".join([b'{"prompt": "x"}', b"[1, 2]", b"not json"] * 20), "JSON object"),
}


@pytest.fixture(scope="module")
def finished(tmp_path_factory, tiny_materials):
    disk = tmp_path_factory.mktemp("corpus-refusal") / "disk"
    make_project(disk / "proj", "t5xxl_pixart", tiny_materials, **{"corpus.min_chars": 4})
    assert pipeline.run_foreground(ProjectPaths(disk / "proj")) == 0
    return disk


def _protected(disk) -> dict[str, bytes]:
    files = tree_bytes(disk)
    return {
        k: v
        for k, v in files.items()
        if (k.startswith(PROTECTED) or k.endswith(".gguf")) and not k.endswith("verified.json")
    }


@pytest.mark.parametrize("member", sorted(MEMBERS))
def test_unusable_corpus_is_refused_before_anything_changes(finished, tmp_path, member):
    raw, reason = MEMBERS[member]
    disk = tmp_path / "disk"
    shutil.copytree(finished, disk, symlinks=True)
    paths = ProjectPaths(disk / "proj")
    bad = disk / ("prompts.jsonl" if member == "bad_jsonl" else "prompts.txt")
    bad.write_bytes(raw)
    update_settings(paths.root, {"corpus.files": [str(bad)]})
    before = _protected(disk)
    stages = {}
    try:
        code = pipeline.run_foreground(paths)
        state = json.loads(paths.state_json.read_text())
        sentence, stages = state.get("error") or "", state.get("stages", {})
    except UserError as e:
        code, sentence = EXIT_USER, str(e)
    assert code == EXIT_USER, (code, sentence)
    assert (
        "Traceback" not in sentence
        and "\n" not in sentence.strip()
        and sentence.strip().endswith(".")
    )
    assert "usable prompts" in sentence and reason in sentence, sentence
    assert _protected(disk) == before  # corpus, shards, checkpoints, export untouched
    # refused while validating, before any stage ran (so before the student or teacher loaded)
    assert all(st.get("started") is None for st in stages.values()), stages
