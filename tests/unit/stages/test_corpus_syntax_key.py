"""The prompt rule's version in the corpus fingerprint (prompt_syntax.RULE_VERSION: what a stored
prompt is and how its ids are made): a corpus recorded under another version, or before versions
were recorded, is redone with everything built on it, `status` names prompt_syntax and the log
says what changed; a corpus that records the current version stays."""

from __future__ import annotations

import logging

import pytest

from gguf_trainer.data.samples import read_samples
from gguf_trainer.engine import prompt_syntax
from gguf_trainer.runner import stages
from gguf_trainer.runner.stages import stale_stages, write_manifest
from gguf_trainer.stages import corpus
from gguf_trainer.store.project import create_project, load_project

ONLY = (corpus.STAGE,)  # the stages after it need real materials; the corpus is what changes here


def stage_inputs(project):
    return stages.stage_inputs(project, ONLY)


class Report:
    def progress(self, *args, **kwargs):
        pass


@pytest.fixture
def project(tmp_path):
    prompts = tmp_path / "prompts.txt"
    lines = [
        f"prompt {i}: a (red:1.2) fox by the [old] lake" if i % 7 == 0 else f"prompt {i}: a cat"
        for i in range(60)
    ]
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proj = create_project(
        tmp_path / "p",
        "t5xxl_pixart",
        overrides={
            "corpus.files": [str(prompts)],
            "corpus.n_train": 40,
            "corpus.n_val": 8,
            "corpus.min_chars": 1,
        },
    )
    corpus.run_corpus(proj, Report())
    return load_project(proj.dir)


def test_a_new_corpus_records_the_version_and_keeps_weight_syntax(project):
    assert stage_inputs(project)["corpus"]["prompt_syntax"] == prompt_syntax.RULE_VERSION == 2
    assert stale_stages(project, ONLY, stage_inputs(project)) == {}
    texts = [s.text for s in read_samples(project.paths.samples("train"))]
    assert any("a (red:1.2) fox by the [old] lake" in t for t in texts)


@pytest.mark.parametrize("recorded", [None, 1])
def test_a_corpus_of_another_rule_is_redone_and_status_and_log_say_why(project, caplog, recorded):
    inputs = stage_inputs(project)["corpus"]
    old = {k: v for k, v in inputs.items() if k != "prompt_syntax"}
    if recorded is not None:
        old["prompt_syntax"] = recorded
    write_manifest(project.paths, corpus.STAGE, old, complete=True)
    with caplog.at_level(logging.WARNING, logger="gguf_trainer.stages.corpus"):
        now = stage_inputs(project)
    assert now["corpus"]["prompt_syntax"] == prompt_syntax.RULE_VERSION
    stale = stale_stages(project, ONLY, now)
    assert stale["corpus"] == "corpus inputs changed (prompt_syntax)", stale
    assert f"the prompt rule changed (version {recorded or 'unrecorded'} -> 2" in caplog.text
    assert "weight syntax is now kept" in caplog.text
    caplog.clear()  # the predicate itself only looks: the loop's make_inputs said it
    with caplog.at_level(logging.DEBUG):
        assert corpus.STAGE.inputs(project, {}, old) == now["corpus"]
    assert not caplog.records
