"""The command layer (issue 30 item 4): every pack's printed ggk command, parsed as ggk 0.9.7's
argument parser reads it, never makes ggk encode a negative prompt the family's template turns
into too few rows (MiniMax H3 aborted at conditioner.hpp 2898); LingBot Video's corpus trains
no reference images by default (ggk 0.9.7 never hands its text encoder one), behind a setting;
FLUX.2 klein's export names the teacher actually linked, not a fixed repo.

This fast check reads the options as ggk's CLI takes them; the engine tier runs ggk 0.9.7's own
parser and version defaults on every printed command (tests/engine/test_ggk_commands.py)."""

from __future__ import annotations

import json
import shlex

import pytest

from gguf_trainer import packs
from gguf_trainer.data.samples import Sample
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.model.student import load_tokenizer
from gguf_trainer.store.results import printed_command

SHIPPED = [i for i in packs.pack_ids()
           if type(packs.get_pack(i)).__module__.startswith("gguf_trainer.packs.")]


def ggk_args(cmd: str) -> dict[str, str]:
    """The options of a printed ggk command as ggk's CLI takes them (cli/common/common.cpp:
    `-n`/`--negative-prompt` 933-937, `--cfg-scale` 1074-1077), the last one winning."""
    words = shlex.split(cmd)
    if "--" in words:  # `ggk diffuser engine -- ARGS`
        words = words[words.index("--") + 1:]
    out: dict[str, str] = {}
    for i, w in enumerate(words):
        if w.startswith("-") and i + 1 < len(words):
            out[{"--negative-prompt": "-n"}.get(w, w)] = words[i + 1]
    return out


def encodes_uncond(args: dict[str, str]) -> bool:
    """Whether ggk 0.9.7 encodes the negative prompt: txt_cfg differs from img_cfg (1 unless
    set; resolve_guidance, gk-diffuser.cpp 5280-5293). Unset, txt_cfg is the model's default
    (cli/main.cpp 825-827), which is 1 for no family these packs serve but Qwen Image 2.1."""
    if "--cfg-scale" not in args:
        return True
    return float(args["--cfg-scale"]) != float(args.get("--img-cfg-scale", 1.0))


@pytest.fixture(scope="module")
def encode(qwen_tokenizer_dir):
    return engine_bpe(load_tokenizer(qwen_tokenizer_dir)).encode


@pytest.mark.parametrize("pack_id", [p for p in SHIPPED if packs.get_pack(p).engine_template])
def test_every_command_that_encodes_a_negative_prompt_gives_it_rows(pack_id, encode):
    """An LLM-template family whose template gives an empty prompt no rows past its start
    aborts at GGML_ASSERT(hidden_states.shape()[1] > prompt_template_encode_start_idx)
    (conditioner.hpp 2898) when ggk encodes the (default empty) negative prompt; its command
    must sample unguided (--cfg-scale 1) or set a non-empty -n. (The T5 embedders have no
    template start: their empty prompt is "▁" + EOS in a fixed window.)"""
    pack = packs.get_pack(pack_id)
    empty = Sample("")
    rows = len(pack.student_ids(encode, empty)) - pack.template_start(empty)
    args = ggk_args(printed_command(pack)[0])
    if rows > 0 or (args.get("-n") or "").strip():
        return
    assert not encodes_uncond(args), (
        f"{pack_id}: an empty negative prompt has {rows} rows past the start, and the command "
        f"makes ggk encode it: {printed_command(pack)[0]}")


def test_minimax_h3_samples_unguided():
    """The old command set neither: ggk took guidance 7 and aborted on the empty negative."""
    pack = packs.get_pack("qwen3vl_minimax_h3")
    args = ggk_args(printed_command(pack)[0])
    assert args.get("--cfg-scale") == "1" and not encodes_uncond(args)
    assert any("--cfg-scale 1" in n for n in pack.engine_notes)


def test_ggk_args_reads_the_options_as_ggk_does():
    args = ggk_args("ggk diffuser engine -- -M vid_gen -p 'a b' --negative-prompt 'blur' "
                    "--cfg-scale 1.0 -o out.avi")
    assert args == {"-M": "vid_gen", "-p": "a b", "-n": "blur", "--cfg-scale": "1.0",
                    "-o": "out.avi"}
    assert not encodes_uncond(args) and encodes_uncond({"--cfg-scale": "4"})
    assert encodes_uncond({})  # ggk's default guidance (7 for these families)


# ---- LingBot Video: no reference-image samples by default ------------------------------------

def _jsonl_with_images(tmp_path, n=60):
    from PIL import Image

    img = tmp_path / "pic.png"
    Image.new("RGB", (64, 96), (200, 30, 30)).save(img)
    lines = [json.dumps({"text": f"a red fox number {i} running through snow",
                         "images": [str(img)]}) for i in range(n)]
    path = tmp_path / "edits.jsonl"
    path.write_text("\n".join(lines) + "\n")
    return path


def test_lingbot_takes_no_reference_images_by_default(tmp_path):
    """A new LingBot project writes corpus.reference_images off: the .jsonl images are
    dropped (text samples); on, they are kept. The setting is LingBot's alone and its help
    says which ggk serves the images; the pack's note says --ref-image --llm_vision is not
    enough."""
    from gguf_trainer.stages.corpus_build import make_split
    from gguf_trainer.store.project import create_project, load_project, update_settings
    from gguf_trainer.store.schema_fields import field_metadata

    pack = packs.get_pack("qwen3vl_lingbot")
    assert pack.all_defaults["corpus.reference_images"] is False
    src = _jsonl_with_images(tmp_path)
    proj = create_project(tmp_path / "p", "qwen3vl_lingbot",
                          overrides={"corpus.files": [str(src)], "corpus.n_val": 4,
                                     "corpus.n_train": 40})
    assert proj.settings.corpus.reference_images is False
    assert not proj.pack.takes_images(proj.settings)
    train, val = make_split(proj)
    assert train and not any(s.images for s in train + val)
    update_settings(proj.dir, {"corpus.reference_images": True})
    proj = load_project(proj.dir)
    train, val = make_split(proj)
    assert all(s.images for s in train + val if s.text)  # (the empty-prompt share is text)

    meta = {f["key"]: f for f in field_metadata("qwen3vl_lingbot")}["corpus.reference_images"]
    assert "0.9.7" in meta["help"]
    assert not meta.get("hidden")
    assert {f["key"]: f for f in field_metadata("qwen3vl_boogu")}["corpus.reference_images"][
        "hidden"]  # LingBot's alone
    note = " ".join(pack.engine_notes)
    assert "not enough" in note and "--ref-image" in note and "pass_to_vlm" in note
    assert "I2V" not in pack.title + pack.serves


def test_the_other_vision_packs_still_take_images():
    from gguf_trainer.store.project_schema import ProjectSettings

    for pid in ("qwen3vl_mageflow", "qwen3vl_boogu", "qwen3vl_qwen_image_2_1", "qwen3vl_fibo2"):
        settings = ProjectSettings(pack=pid)
        assert packs.get_pack(pid).takes_images(settings), pid


def test_the_new_setting_leaves_old_corpora_valid():
    """A project recorded before corpus.reference_images (no key = on) keeps its corpus
    fingerprint; off is a change of the corpus."""
    from gguf_trainer.stages.corpus import placeless

    old = {"files": ["a.txt"], "n_train": 10}
    assert placeless({**old, "reference_images": True}) == placeless(old)
    assert placeless({**old, "reference_images": False}) != placeless(old)


# ---- FLUX.2 klein: the linked teacher -------------------------------------------------------

def test_klein_export_names_the_linked_teacher(tmp_path):
    """No fixed `Qwen/Qwen3-4B`: the export names the snapshot the train shards recorded and
    the width the adapter learned (a linked 9B's Qwen3 is not the 4B's)."""
    from gguf_trainer.base import atomic
    from gguf_trainer.base.paths import MANIFEST_JSON
    from gguf_trainer.stages.export import export_metadata
    from gguf_trainer.store.project import create_project

    proj = create_project(tmp_path / "p", "qwen3_flux2_klein")
    assert "adapter.teacher" not in proj.pack.export_kv
    shard_dir = proj.paths.shard_dir("train")
    shard_dir.mkdir(parents=True)
    sha = "ab" * 32
    atomic.write_json(shard_dir / MANIFEST_JSON,
                      {"fingerprint": "x", "inputs": {"teacher": {"snapshot": sha, "files": 7}}})
    ck = {"step": 5, "planned_steps": 10, "mock": False, "config": {"out_dim": 3 * 4096}}
    meta = export_metadata(proj, ck, "best", False)
    assert meta["adapter.teacher_snapshot"] == sha
    assert meta["adapter.teacher"] == f"linked Qwen3 snapshot sha256:{sha[:16]}, hidden 4096"
    assert "Qwen3-4B" not in meta["adapter.teacher"]
    # a mock run names no teacher (adapter.mock_teacher says what it was)
    meta = export_metadata(proj, {**ck, "mock": True}, "best", False)
    assert "adapter.teacher" not in meta and meta["adapter.mock_teacher"] is True
