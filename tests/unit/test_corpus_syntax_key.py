"""The prompt-syntax rule's version in the corpus fingerprint: a corpus recorded without it is
kept when no stored prompt would be rewritten by the rule, and rebuilt (with a log line) when
some would; a corpus that records the version is not scanned again."""

from __future__ import annotations

import logging

import pytest

from gguf_trainer import corpus, prompt_syntax
from gguf_trainer.project import create_project, load_project
from gguf_trainer.runner import stages
from gguf_trainer.runner.stages import stale_stages, write_manifest
from gguf_trainer.samples import Sample, read_samples, write_samples

ONLY = (corpus.STAGE,)  # the stages after it need real materials; the corpus is what changes here


def stage_inputs(project):
    return stages.stage_inputs(project, ONLY)


class Report:
    def progress(self, *args, **kwargs):
        pass


@pytest.fixture
def project(tmp_path):
    prompts = tmp_path / "prompts.txt"
    lines = [f"prompt {i}: a (red:1.2) fox by the [old] lake" if i % 7 == 0 else f"prompt {i}: a cat"
             for i in range(60)]
    prompts.write_text("\n".join(lines) + "\n", encoding="utf-8")
    proj = create_project(tmp_path / "p", "t5xxl_pixart", overrides={
        "corpus.files": [str(prompts)], "corpus.n_train": 40, "corpus.n_val": 8, "corpus.min_chars": 1})
    corpus.run_corpus(proj, Report())
    inputs = stage_inputs(proj)["corpus"]
    assert inputs["prompt_syntax"] == prompt_syntax.RULE_VERSION  # a new corpus records it
    # as a project built before the version was recorded: same inputs, no key
    write_manifest(proj.paths, corpus.STAGE, {k: v for k, v in inputs.items() if k != "prompt_syntax"},
                   complete=True)
    return load_project(proj.dir)


def test_a_recorded_corpus_the_rule_leaves_alone_is_kept(project):
    texts = [s.text for s in read_samples(project.paths.samples("train"))]
    assert any("a red fox by the old lake" in t for t in texts)  # built with the rule
    inputs = stage_inputs(project)
    assert "prompt_syntax" not in inputs["corpus"]
    assert stale_stages(project, ONLY, inputs) == {}


def test_a_corpus_with_bracketed_prompts_is_rebuilt_and_the_log_says_why(project, caplog):
    path = project.paths.samples("train")
    samples = read_samples(path)
    samples[0] = Sample("a (red:1.2) fox by the [old] lake")  # what the corpus held before the rule
    write_samples(path, samples)
    with caplog.at_level(logging.WARNING, logger="gguf_trainer.corpus"):
        inputs = stage_inputs(project)
    assert inputs["corpus"]["prompt_syntax"] == prompt_syntax.RULE_VERSION
    stale = stale_stages(project, ONLY, inputs)
    assert stale["corpus"] == "corpus inputs changed (prompt_syntax)", stale
    assert "1 stored prompt(s) carry weight syntax" in caplog.text


def test_a_recorded_version_is_not_scanned_again(project, monkeypatch):
    inputs = stage_inputs(project)["corpus"]
    write_manifest(project.paths, corpus.STAGE, {**inputs, "prompt_syntax": prompt_syntax.RULE_VERSION},
                   complete=True)

    def no_scan(text):
        raise AssertionError("scanned")

    monkeypatch.setattr(corpus, "would_rewrite", no_scan)
    assert stage_inputs(project)["corpus"]["prompt_syntax"] == prompt_syntax.RULE_VERSION


def test_would_rewrite_is_the_training_policy():
    assert prompt_syntax.would_rewrite("a (red:1.2) fox") and prompt_syntax.would_rewrite("[old] lake")
    assert not prompt_syntax.would_rewrite("a red fox by the old lake")
    assert prompt_syntax.would_rewrite("a (red:.) fox")  # the engine cannot run it: skipped
