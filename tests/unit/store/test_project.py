"""project.json: steps parsing, validation that reports every bad field, naming and output
paths, create/update/read_steps, and the per-pack defaults of the reference trainer."""

from __future__ import annotations

import json
import math

import pytest

from gguf_trainer.base.errors import UserError
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.store.project import create_project, load_project, read_steps, update_settings
from gguf_trainer.store.project_schema import default_name, parse_steps
from gguf_trainer.store.schema_errors import validate_settings

PACK_IDS = ("llada_image", "qwen3vl_mageflow", "t5xxl_pixart")


def _one_sentence(msg: str) -> bool:
    """No line break, ends with a full stop, and no second sentence inside."""
    return "\n" not in msg and msg.endswith(".") and ". " not in msg[:-1].replace("e.g. ", "")


# ----------------------------------------------------------------- parse_steps


@pytest.mark.parametrize("value, expected", [
    (12000, 12000), ("12000", 12000), ("12_000", 12000), ("12,000", 12000), ("40k", 40000),
    ("40K", 40000), (" 40k ", 40000), (40000.0, 40000), ("2.5k", 2500), (1, 1),
])
def test_parse_steps_accepts(value, expected):
    got = parse_steps(value)
    assert got == expected and type(got) is int


@pytest.mark.parametrize(
    "value", [0, -5, "1.5", "abc", True, False, "", "k", None, 2.5, "-3k", "0k"]
)
def test_parse_steps_rejects_with_one_sentence(value):
    with pytest.raises(UserError) as info:
        parse_steps(value)
    msg = str(info.value)
    assert _one_sentence(msg), msg
    assert "steps" in msg and repr(value) in msg


@pytest.mark.parametrize("value", ["inf", math.inf, math.nan, "1e400"])
def test_parse_steps_rejects_non_finite(value):
    with pytest.raises(UserError):
        parse_steps(value)


# ----------------------------------------------------------------- validation


def _write_raw(root, data: dict) -> None:
    root.mkdir(parents=True, exist_ok=True)
    (root / "project.json").write_text(json.dumps(data), encoding="utf-8")


def test_every_bad_field_is_reported_at_once(tmp_path):
    bad = {
        "pack": "t5xxl_pixart",
        "name": "pig_t5_adapter",
        "train": {"width": 100, "steps": "abc", "bogus": 1},
        "corpus": {"n_val": 0},
        "precompute": {"teacher_mode": "fast"},
        "hf_token": "x",
    }
    _write_raw(tmp_path / "p", bad)
    with pytest.raises(UserError) as info:
        load_project(tmp_path / "p")
    head, *lines = str(info.value).splitlines()
    assert "6 bad settings" in head and "project.json" in head
    fields = [
        "train.width",
        "train.steps",
        "train.bogus",
        "corpus.n_val",
        "precompute.teacher_mode",
        "hf_token",
    ]
    assert len(lines) == len(fields)
    for field in fields:
        (line,) = [ln for ln in lines if ln.strip().startswith(field + ":")]
        what = line.split(":", 1)[1].strip()
        assert len(what) > 10, line  # says what to do, not just the field
    by_field = {ln.strip().split(":", 1)[0]: ln for ln in lines}
    assert "multiple of 64" in by_field["train.width"]
    assert "12000" in by_field["train.steps"]
    assert "remove it" in by_field["train.bogus"] and "remove it" in by_field["hf_token"]


def test_missing_required_fields_say_add_it():
    with pytest.raises(UserError) as info:
        validate_settings({})
    text = str(info.value)
    assert "pack: is required; add it" in text and "name" not in text  # name has a default


def test_only_pack_is_needed_and_name_defaults_to_the_packs(tmp_path):
    assert validate_settings({"pack": "t5xxl_pixart"}).name == "pig_t5_adapter"
    assert validate_settings({"pack": "t5xxl_pixart", "name": ""}).name == "pig_t5_adapter"
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "project.json").write_text('{"pack": "llada_image"}')
    assert load_project(tmp_path / "p").final_gguf.name == "pig_llada_adapter-f16.gguf"


def test_unknown_keys_refused_at_create(tmp_path):
    with pytest.raises(UserError, match=r"train\.bogus: is not a setting; remove it"):
        create_project(tmp_path / "p", "t5xxl_pixart", overrides={"train.bogus": 1})
    assert not (tmp_path / "p" / "project.json").exists()


def test_unknown_pack_refused(tmp_path):
    with pytest.raises(UserError, match="unknown pack 'nope'"):
        create_project(tmp_path / "p", "nope")
    with pytest.raises(UserError, match="pack: unknown pack 'nope'; choose one of"):
        validate_settings({"pack": "nope", "name": "pig_x"})


def test_invalid_json_is_a_user_error(tmp_path):
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "project.json").write_text('{"pack": ', encoding="utf-8")
    with pytest.raises(UserError, match="is not valid JSON"):
        load_project(tmp_path / "p")


# ----------------------------------------------------------------- naming and paths


@pytest.mark.parametrize(
    "pack_id, expected",
    [
        ("llada_image", "pig_llada_adapter"),
        ("qwen3vl_mageflow", "pig_qwen3vl_4b_adapter"),
        ("t5xxl_pixart", "pig_t5_adapter"),
    ],
)
def test_default_names(tmp_path, pack_id, expected):
    proj = create_project(tmp_path / "p", pack_id)
    assert proj.settings.name == expected
    assert load_project(tmp_path / "p").settings.name == expected


def test_given_names(tmp_path):
    assert create_project(tmp_path / "a", "t5xxl_pixart", name="pig_x").settings.name == "pig_x"
    assert create_project(tmp_path / "b", "t5xxl_pixart", name="mine").settings.name == "pig_mine"
    assert default_name("t5_adapter") == "pig_t5_adapter"
    assert default_name("pig_t5_adapter") == "pig_t5_adapter"


def test_output_paths_default_to_the_projects_parent(tmp_path):
    proj = create_project(tmp_path / "projects" / "llada", "llada_image")
    out = (tmp_path / "projects").resolve()
    assert proj.output_dir == out
    assert proj.final_gguf == out / "pig_llada_adapter-f16.gguf"
    assert proj.snapshot_gguf(1250) == out / "pig_llada_adapter-step1250-f16.gguf"
    assert proj.companion_gguf("sigvq") == out / "pig_llada_sigvq-f16.gguf"


def test_output_paths_with_output_dir_and_a_name_without_adapter(tmp_path):
    out = tmp_path / "exports"
    proj = create_project(
        tmp_path / "p", "t5xxl_pixart", name="pig_custom", overrides={"export.output_dir": str(out)}
    )
    assert proj.output_dir == out.resolve()
    assert proj.final_gguf == out.resolve() / "pig_custom-f16.gguf"
    assert proj.snapshot_gguf(7) == out.resolve() / "pig_custom-step7-f16.gguf"
    assert proj.companion_gguf("sigvq") == out.resolve() / "pig_custom_sigvq-f16.gguf"


@pytest.mark.parametrize(
    "name",
    ["pig_a/b", "../pig_x", "pig_..x", "pig_a\\..", ".pig_x", "pig x", "/abs", "pig_" + "x" * 100],
)
def test_bad_names_refused(name):
    with pytest.raises(UserError, match="name"):
        validate_settings({"pack": "t5xxl_pixart", "name": name})


@pytest.mark.parametrize("name", ["a/b", "../x", "x/../y"])
def test_create_refuses_folder_names(tmp_path, name):
    with pytest.raises(UserError, match="no folders"):
        create_project(tmp_path / "p", "t5xxl_pixart", name=name)
    assert not (tmp_path / "p").exists()


def test_update_refuses_a_leading_dot_name(tmp_path):
    create_project(tmp_path / "p", "t5xxl_pixart")
    with pytest.raises(UserError, match="name"):
        update_settings(tmp_path / "p", {"name": ".hidden"})


# ----------------------------------------------------------------- create / update / read_steps


def test_create_refuses_an_existing_project(tmp_path):
    create_project(tmp_path / "p", "t5xxl_pixart", overrides={"train.steps": 77})
    before = (tmp_path / "p" / "project.json").read_bytes()
    with pytest.raises(UserError, match="already holds a project"):
        create_project(tmp_path / "p", "llada_image")
    assert (tmp_path / "p" / "project.json").read_bytes() == before


def test_update_settings_applies_dotted_changes(tmp_path):
    create_project(tmp_path / "p", "t5xxl_pixart")
    proj = update_settings(tmp_path / "p", {"train.steps": "40k", "corpus.files": ["a.txt"]})
    assert proj.settings.train.steps == 40000
    disk = json.loads((tmp_path / "p" / "project.json").read_text())
    assert disk["train"]["steps"] == 40000 and disk["corpus"]["files"] == ["a.txt"]


@pytest.mark.parametrize(
    "changes",
    [
        {"train.steps": 0},
        {"train.lr": 1e-3, "train.width": 100},  # one good, one bad: neither is written
        {"train.nope": 3},
    ],
)
def test_update_settings_writes_nothing_when_a_value_is_bad(tmp_path, changes):
    create_project(tmp_path / "p", "t5xxl_pixart")
    pj = tmp_path / "p" / "project.json"
    before, mtime = pj.read_bytes(), pj.stat().st_mtime_ns
    with pytest.raises(UserError):
        update_settings(tmp_path / "p", changes)
    assert pj.read_bytes() == before and pj.stat().st_mtime_ns == mtime
    left = sorted(p.name for p in pj.parent.iterdir())
    assert left in (["project.json"], ["project.json", "settings.lock"])  # no temp file left


def test_read_steps(tmp_path):
    create_project(tmp_path / "p", "t5xxl_pixart", overrides={"train.steps": 1234})
    paths = ProjectPaths(tmp_path / "p")
    assert read_steps(paths) == 1234
    full = paths.project_json.read_text()
    paths.project_json.write_text(full[: len(full) // 2])  # half-written
    assert read_steps(paths) is None
    paths.project_json.write_text("")
    assert read_steps(paths) is None
    paths.project_json.write_text(json.dumps({"train": {"steps": "12k"}}))
    assert read_steps(paths) == 12000
    paths.project_json.write_text(json.dumps({"train": {}}))
    assert read_steps(paths) is None
    paths.project_json.write_text(json.dumps({"train": {"steps": 0}}))
    assert read_steps(paths) is None
    paths.project_json.write_text("[1, 2]")
    assert read_steps(paths) is None
    paths.project_json.unlink()
    assert read_steps(paths) is None


def test_read_steps_survives_non_finite_steps(tmp_path):
    create_project(tmp_path / "p", "t5xxl_pixart")
    paths = ProjectPaths(tmp_path / "p")
    paths.project_json.write_text('{"train": {"steps": 1e400}}')
    assert read_steps(paths) is None


def test_material_path_relative_to_project(tmp_path):
    proj = create_project(
        tmp_path / "p",
        "t5xxl_pixart",
        overrides={
            "materials": {"student": {"path": "m/s.gguf"}, "teacher": {"path": str(tmp_path / "t")}}
        },
    )
    assert proj.material_path("student") == proj.dir / "m" / "s.gguf"
    assert proj.material_path("teacher") == tmp_path / "t"
    assert proj.material_path("student_tokenizer") is None


# ----------------------------------------------------------------- per-pack defaults

# anchor-trainer.md §2.1 DEFAULT_CONFIG, the keys this schema keeps. Precompute batch/token
# budgets and student_dtype are left out on purpose: here 0/"auto" = chosen for the device.
REFERENCE_DEFAULTS = {
    "auto_resume": True,
    "corpus.n_train": 60000,
    "corpus.n_val": 1024,
    "corpus.empty_frac": 0.01,
    "corpus.min_chars": 8,
    "corpus.max_chars": 1200,
    "corpus.seed": 8,
    "corpus.train_file": "",
    "corpus.val_file": "",
    "precompute.device": "auto",
    "precompute.placement": "sequential",
    "precompute.shard_size": 1024,
    "precompute.val_shard_size": 512,
    "precompute.teacher_mode": "auto",
    "precompute.gpu_mem_gib": 0,
    "precompute.cpu_mem_gib": 0,
    "train.device": "auto",
    "train.width": 1024,
    "train.depth": 6,
    "train.steps": 20000,
    "train.batch_size": 32,
    "train.lr": 2e-4,
    "train.warmup": 1000,
    "train.weight_decay": 0.01,
    "train.grad_clip": 1.0,
    "train.cos_weight": 0.5,
    "train.sigma_floor": 0.03,
    "train.grad_checkpoint": "auto",
    "train.log_every": 25,
    "train.val_every": 500,
    "train.save_every": 250,
    "train.seed": 42,
    "export.output_dir": "",
    "export.copy_to": "",
    "export.export_sigvq": True,
    "export.run_eval": True,
}
# anchor-trainer.md §2.2, the per-pack overrides (llada_image has none).
REFERENCE_PACK_OVERRIDES = {
    "llada_image": {},
    # n_train / n_val: the trainer5 mix (56k + 3k two-image + 27k text; val 1024 + 512) as totals
    "qwen3vl_mageflow": {
        "corpus.empty_frac": 0.015,
        "corpus.n_train": 86000,
        "corpus.n_val": 1536,
        "precompute.shard_size": 512,
        "precompute.val_shard_size": 256,
        "train.width": 1024,
        "train.depth": 4,
        "train.steps": 20000,
        "train.batch_size": 32,
        "export.export_sigvq": False,
        "precompute.teacher_batch": 0,
        "precompute.tok_budget": 0,
        "precompute.student_batch": 0,
        "precompute.student_tok_budget": 0,
    },
    "t5xxl_pixart": {
        "corpus.n_train": 120000,
        "corpus.n_val": 2048,
        "precompute.shard_size": 1024,
        "precompute.val_shard_size": 512,
        "precompute.teacher_batch": 0,
        "precompute.tok_budget": 0,
        "precompute.student_batch": 0,
        "train.width": 1024,
        "train.depth": 6,
        "train.steps": 20000,
        "train.batch_size": 32,
        "train.sigma_floor": 0.03,
        "export.export_sigvq": False,
    },
}


def _get(data: dict, dotted: str):
    for key in dotted.split("."):
        data = data[key]
    return data


@pytest.mark.parametrize("pack_id", PACK_IDS)
def test_per_pack_defaults_match_the_reference(tmp_path, pack_id):
    create_project(tmp_path / "p", pack_id)
    disk = json.loads((tmp_path / "p" / "project.json").read_text())
    expected = {**REFERENCE_DEFAULTS, **REFERENCE_PACK_OVERRIDES[pack_id]}
    wrong = {k: (_get(disk, k), v) for k, v in expected.items() if _get(disk, k) != v}
    assert not wrong, wrong
    assert disk["pack"] == pack_id


def test_overrides_win_over_pack_defaults(tmp_path):
    proj = create_project(
        tmp_path / "p",
        "qwen3vl_mageflow",
        overrides={"train.depth": 2, "precompute.shard_size": 64},
    )
    assert proj.settings.train.depth == 2 and proj.settings.precompute.shard_size == 64
    assert proj.settings.corpus.empty_frac == 0.015  # other pack defaults stay
