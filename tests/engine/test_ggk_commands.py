"""The engine tier's command layer (issue 30 item 4): every shipped pack's printed ggk command
(store/results.printed_command, the one the demo, run, status, the Output tab and the README
print) read by ggk 0.9.7's own CLI parser and resolved by its own version defaults
(command_probe.cpp), then held against what ggk does with it:

  * the parser takes it (an unknown option or a bad value makes ggk print its usage and exit);
  * it loads the student and the adapter (--llm, --llm-adapter);
  * when ggk encodes the negative prompt (use_uncond after resolve_guidance: txt_cfg, the
    family's default when unset, differs from img_cfg), the family's template gives that prompt
    rows past its start, or ggk aborts at GGML_ASSERT(hidden_states.shape()[1] >
    prompt_template_encode_start_idx) (conditioner.hpp, LLMEmbedder::encode_prompt);
  * a command passing --ref-image to a vision pack gives the vision tower (--llm_vision) and runs
    a path that hands references to the conditioner (image mode with the family's preset
    pass_to_vlm; the video path hands none), and a pack whose new projects train reference
    images is one ggk 0.9.7 hands them to in the mode its command runs; else the adapter's
    vision rows are ignored;
  * the render size the command takes (its -W/-H or the family's default) is the one the pack
    sizes its references by (Qwen Image 2.1: qwen_image_refs.DEFAULT_RENDER).
The checks are shown to fail on the two commands issue 30 found broken (MiniMax H3 without
--cfg-scale; LingBot Video training its image path).
"""

from __future__ import annotations

import shlex
import subprocess

import pytest
from engine_build import GK_DIFFUSER, build
from engine_driver import Driver, hexs, template
from engine_source import Source

from gguf_trainer.packs import get_pack, pack_ids
from gguf_trainer.store.results import printed_command

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]

SHIPPED = [i for i in pack_ids()
           if type(get_pack(i)).__module__.startswith("gguf_trainer.packs.")]
# The packs that declare no LLMEmbedder branch (the T5 embedders, the Qwen3.5 bridge): the
# version ggk detects from the DiT their command names (Chroma1-HD loads as a Flux model).
RAW_VERSIONS = {"t5xxl_pixart": "VERSION_PIXART", "t5xxl_chroma": "VERSION_FLUX",
                "umt5xxl_wan": "VERSION_WAN2_2_TI2V", "qwen35_bridge": "VERSION_MOSS_IMAGE",
                "ming_image": "VERSION_MING_IMAGE"}


def version_of(pack) -> str:
    version = pack.engine_template.get("version") or RAW_VERSIONS.get(pack.id)
    assert version, (f"{pack.id} declares no engine_template: name the VERSION_* ggk detects "
                     "for its command's DiT in RAW_VERSIONS")
    return version


def ggk_words(cmd: str) -> list[str]:
    """The words ggk's parser gets: after `--` (`ggk diffuser engine -- ...`), else after `ggk`."""
    words = shlex.split(cmd)
    return words[words.index("--") + 1:] if "--" in words else words[1:]


@pytest.fixture(scope="module")
def engine():
    probe = build(log=print)
    d = Driver(probe)
    yield d, probe.parent / "command_probe"
    d.close()


def parse(command_probe, version: str, words: list[str]) -> dict | None:
    """What ggk's parser and defaults make of the words; None when ggk refuses them."""
    res = subprocess.run([str(command_probe), version, *words], capture_output=True, text=True,
                         check=False, timeout=60)
    if res.returncode == 1:
        return None
    assert res.returncode == 0, res.stderr[-2000:]
    w = res.stdout.splitlines()[-1].split()
    out = {w[i]: w[i + 1] for i in range(0, len(w) - 1, 2)}
    for k in ("prompt", "negative", "llm", "llm_adapter", "llm_vision"):
        out[k] = "" if out[k] == "-" else bytes.fromhex(out[k]).decode("utf-8")
    return out


def trains_images(pack) -> bool:
    """Whether a new project of the pack keeps reference-image samples (its stored defaults)."""
    from gguf_trainer.store.project_schema import ProjectSettings

    settings = ProjectSettings(pack=pack.id)
    for key, value in pack.all_defaults.items():
        section, name = key.split(".", 1)
        if hasattr(getattr(settings, section, None), name):
            setattr(getattr(settings, section), name, value)
    return pack.takes_images(settings)


def problems(pack, got: dict | None, driver, images: bool) -> list[str]:
    """Why ggk 0.9.7 would refuse, abort on, or ignore part of this parsed command."""
    if got is None:
        return ["ggk's parser refuses the command (it prints its usage and exits 1)"]
    out = []
    if not got["llm"] or not got["llm_adapter"]:
        out.append("the command does not load the student and the adapter (--llm, --llm-adapter)")
    if pack.engine_template:
        for what in ("prompt", "negative") if got["use_uncond"] == "1" else ("prompt",):
            t = template(driver.ask("tmpl", pack.id, hexs(got[what]), 0))
            if len(t["ids"]) <= t["start"]:
                out.append(
                    f"ggk encodes the {what} {got[what]!r} (txt_cfg {got['txt_cfg']}"
                    f"{'' if got['txt_cfg_set'] == '1' else ', the family default'} != img_cfg "
                    f"{got['img_cfg']}) and its template has {len(t['ids'])} rows, not past the "
                    f"start {t['start']}: GGML_ASSERT(hidden_states.shape()[1] > "
                    "prompt_template_encode_start_idx) aborts")
    if pack.vis_dim:
        reach = got["mode"] == "img_gen" and got["pass_to_vlm"] == "1"
        why = (f"{got['mode']} hands the conditioner no references" if got["mode"] != "img_gen"
               else f"the family's preset {got['preset']!r} has pass_to_vlm off")
        if int(got["ref_images"]) and not got["llm_vision"]:
            out.append("--ref-image without --llm_vision: no vision tower, the references "
                       "never become vision rows")
        if int(got["ref_images"]) and not reach:
            out.append(f"--ref-image is ignored by the conditioner: {why}")
        if images and not reach:
            out.append(f"new projects train reference images, but {why} in ggk 0.9.7: the "
                       "adapter's vision rows serve no run")
    return out


def test_the_video_path_hands_no_references(engine):
    """The reading `problems` rests on: the video path builds ConditionerParams with no
    references; the image path hands them when the preset's pass_to_vlm is on, the preset
    resolved from the version with no user override."""
    src = Source()
    lines = "\n".join(src.lines(GK_DIFFUSER, *src.function(
        GK_DIFFUSER, "static ImageGenerationEmbeds prepare_video_generation_embeds(")))
    assert "get_learned_condition" in lines and "ref_images" not in lines
    head = "static std::optional<ImageGenerationEmbeds> prepare_image_generation_embeds("
    image = "\n".join(src.lines(GK_DIFFUSER, *src.function(GK_DIFFUSER, head)))
    assert "condition_params.ref_images            = (ref_image_params.pass_to_vlm ||" in image
    assert "RefImageParams ref_image_params = sd_ctx->sd->resolve_ref_image_params(nullptr);" in \
        "\n".join(src.text(GK_DIFFUSER))


@pytest.mark.parametrize("pack_id", SHIPPED)
def test_the_printed_command_runs_as_the_pack_trained(engine, pack_id):
    driver, command_probe = engine
    pack = get_pack(pack_id)
    cmd = printed_command(pack)[0]
    got = parse(command_probe, version_of(pack), ggk_words(cmd))
    found = problems(pack, got, driver, trains_images(pack))
    assert not found, f"{pack_id}: {cmd}\n" + "\n".join(found)
    if pack.id == "qwen3vl_qwen_image_2_1":  # references sized by the render area
        from gguf_trainer.engine.qwen_image_refs import DEFAULT_RENDER

        assert (int(got["width"]), int(got["height"])) == DEFAULT_RENDER
        words = ggk_words(cmd)  # without -W/-H and the reference: the family's default size
        bare = [w for i, w in enumerate(words) if w not in ("-W", "-H", "--ref-image")
                and (i == 0 or words[i - 1] not in ("-W", "-H", "--ref-image"))]
        default = parse(command_probe, version_of(pack), bare)
        assert (int(default["width"]), int(default["height"])) == DEFAULT_RENDER
    print(f"{pack_id}: ggk parses it ({got['mode']}, txt_cfg {got['txt_cfg']}"
          f"{'' if got['txt_cfg_set'] == '1' else ' by default'}, uncond {got['use_uncond']}, "
          f"{got['width']}x{got['height']}, {got['ref_images']} reference(s), preset "
          f"{got['preset']} pass_to_vlm {got['pass_to_vlm']})")


def test_the_checks_catch_the_broken_commands(engine):
    """MiniMax H3's old command (no --cfg-scale: the default guidance 7 encodes the empty
    negative) and LingBot Video training its image path are reported; so is a refused option."""
    driver, command_probe = engine
    h3 = get_pack("qwen3vl_minimax_h3")
    words = ggk_words(printed_command(h3)[0])
    i = words.index("--cfg-scale")
    old = words[:i] + words[i + 2:]
    got = parse(command_probe, version_of(h3), old)
    assert got["txt_cfg"] == "7" and got["use_uncond"] == "1"
    assert any("GGML_ASSERT" in p for p in problems(h3, got, driver, False))
    assert not problems(h3, parse(command_probe, version_of(h3), old + ["-n", "blurry"]),
                        driver, False)
    lingbot = get_pack("qwen3vl_lingbot")
    got = parse(command_probe, version_of(lingbot), ggk_words(printed_command(lingbot)[0]))
    assert any("serve no run" in p for p in problems(lingbot, got, driver, True))
    with_refs = ggk_words(printed_command(lingbot)[0]) + ["--ref-image", "a.png", "--llm_vision",
                                                         "mmproj.gguf"]
    got = parse(command_probe, version_of(lingbot), with_refs)
    assert any("ignored by the conditioner" in p for p in problems(lingbot, got, driver, False))
    assert parse(command_probe, "VERSION_FLUX3", ["--diffusion-model", "x.gguf", "--cfg-scael",
                                                  "1"]) is None
