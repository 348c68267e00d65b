"""The engine tier's adapter check: every case of engine_adapter_cases.CASES (every shipped pack at
its own geometry, the seed table factorized, Iris-3B's cut, the Qwen3.5 bridge's FLUX.3 bank)
exported as this tool exports it, loaded by ggk 0.9.7's ModelLoader and run by the runner ggk
picks (adapter_probe.cpp) on the rows ggk's own template code builds for the case's prompt; the
runner's output equals this tool's forward of the same file (rel <= the case's tol), what the
runner detects is what the pack declares, and a prompt written to reach the family's cut-off
reaches it.
"""

from __future__ import annotations

import subprocess
import time
from types import SimpleNamespace

import numpy as np
import pytest
from engine_adapter_cases import CASES
from engine_build import build, build_t5clip
from engine_driver import Driver, hexs, ids, template

from gguf_trainer.data.samples import Sample
from gguf_trainer.packs import get_pack

pytestmark = [pytest.mark.slow, pytest.mark.timeout(1800)]


@pytest.fixture(scope="module")
def driver():
    d = Driver(build(log=print))
    yield d
    d.close()


@pytest.fixture(scope="module")
def t5clip():
    holder = {}
    yield lambda: holder.setdefault("d", Driver(build_t5clip(log=print)))
    if "d" in holder:
        holder["d"].close()


@pytest.fixture(scope="module")
def student(tiny_materials):
    from gguf_trainer.model.student import load_student

    return load_student(tiny_materials["student"], tiny_materials["tokenizer"])


def engine_rows(case, pack, driver, t5clip):
    """(student ids, seed ids or None, the template answer or None) ggk builds for the prompt."""
    if case.rows is not None:
        return (*case.rows(pack, case.prompt, {"probe": driver, "t5clip": t5clip}), None)
    if pack.engine_template:
        got = template(driver.ask("tmpl", case.template or pack.id, hexs(case.prompt), 0))
        return got["ids"], None, got
    window = pack.num_queries
    answer = driver.ask("pixart", window, hexs(case.prompt))
    student_ids, seeds = (ids(f) for f in answer.split(" | "))
    if pack.id != "t5xxl_pixart":  # T5CLIPEmbedder's window (t5clip_probe: T5 v1.1 / UMT5)
        kind = "umt5" if pack.seed_vocab > 32128 else "t5clip"
        seeds = ids(t5clip().ask(kind, window, hexs(case.prompt)))
    return student_ids, seeds, None


def run_probe(runner, export, out, **files) -> dict:
    args = [str(runner), str(export), str(out)]
    for flag, value in files.items():
        args += [f"--{flag.replace('_', '-')}", *map(str, value)]
    res = subprocess.run(args, capture_output=True, text=True, check=False)
    assert res.returncode == 0, res.stdout[-1000:] + res.stderr[-2000:]
    words = res.stdout.splitlines()[0].split()
    return {words[i]: words[i + 1] for i in range(0, len(words) - 1, 2)}


def rel_error(got_path, want: np.ndarray) -> float:
    """max |engine - ours| / max |ours|, row block by row block (the FLUX.3 and Fibo 2.0 outputs
    are 0.3-0.6 GB)."""
    got = np.memmap(got_path, dtype="<f4", mode="r")
    assert got.size == want.size, (got.size, want.shape)
    got = got.reshape(want.shape)
    worst, scale = 0.0, float(np.abs(want).max())
    for a in range(0, want.shape[0], 256):
        worst = max(worst, float(np.abs(got[a : a + 256] - want[a : a + 256]).max()))
    return worst / scale


def declared(pack, cfg, student) -> dict:
    """What ggk's runner must detect in the pack's file (llm_adapter.hpp AdapterConfig; a slot
    kind's runner: its geometry, the rest in its case's `expect`)."""
    from engine_adapter_cases import PLAIN_KINDS

    geometry = {"in_dim": student.hidden_size, "out_dim": cfg.out_dim, "width": cfg.width,
                "depth": cfg.depth}
    if pack.adapter_kind not in PLAIN_KINDS:
        return geometry
    out = {"runner": "plain", **geometry,
           "n_out_layers": max(1, len(pack.taps)),
           "has_vision_proj": int(bool(cfg.vis_dim)), "vis_dim": cfg.vis_dim or 0}
    if cfg.num_queries and pack.adapter_kind in ("resampler", "seeded_resampler"):
        out["num_queries"] = cfg.num_queries
    if cfg.seed_vocab:
        out.update(has_seed=1, t5_vocab=cfg.seed_vocab)
    else:
        out["token_aligned"] = int(pack.adapter_kind not in ("resampler", "seeded_resampler"))
    return out


def test_every_shipped_pack_has_a_case():
    from engine_adapter_cases import _shipped

    missing = set(_shipped()) - {c.pack for c in CASES}
    assert not missing, (f"no engine case for {sorted(missing)}: append one to "
                         "engine_adapter_cases.CASES (its docstring says how)")
    assert len({c.id for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_the_engines_loader_and_runner_read_the_export(driver, t5clip, student, tmp_path, case):
    import torch
    from engine_reference import vision_project

    from gguf_trainer.model.adapters import build_adapter, load_gguf

    t0 = time.perf_counter()
    pack = get_pack(case.pack)
    train = SimpleNamespace(**{"width": 128, "depth": 2, "seed_rank": 0, **case.train})
    bank_slots = getattr(train, "bank_slots", 0)  # the bridge's FLUX.3 bank head
    if bank_slots:
        pack = pack.configured(SimpleNamespace(train=train))
    cfg = pack.adapter_config(train, student.hidden_size, out_dim=case.out_dim)
    torch.manual_seed(0)
    module = build_adapter(cfg)
    with torch.no_grad():
        for p in module.parameters():
            p.add_(0.05 * torch.randn_like(p))
    export = case.export(pack, cfg, module.state_dict(), tmp_path / "adapter-f16.gguf")
    del module

    student_ids, seeds, tmpl = engine_rows(case, pack, driver, t5clip)
    n = len(student_ids)
    if case.reach:
        how, limit = case.reach
        limit = limit if limit is not None else tmpl["max"]
        assert {"max": n == limit, ">": n > limit, ">=": n >= limit}[how], (
            f"{case.id}: the prompt gives {n} template rows, not {how} {limit}")
        if how == "max":
            assert tmpl["real"] == n, "a cut template has no pads"
    if not case.template and case.rows is None:  # the engine's rows are the pack's rows
        encode = driver_encode()
        assert pack.student_ids(encode, Sample(case.prompt)) == student_ids
    x = torch.tensor([student_ids])
    with torch.no_grad():
        hidden = student.hidden(x, torch.ones_like(x))[0].float()
    hidden.numpy().astype("<f4").tofile(tmp_path / "h.bin")
    files = {"hidden": (tmp_path / "h.bin", n)}
    seeded = pack.adapter_kind == "seeded_resampler"
    if seeds is not None:
        assert not seeded or len(seeds) == cfg.num_queries
        (tmp_path / "ids.txt").write_text("".join(f"{i}\n" for i in seeds))
        files["ids"] = (tmp_path / "ids.txt",)
    vis = None
    if case.vision:  # raw rows at a run of the template, zeros elsewhere (as encode_prompt)
        vis = torch.zeros(n, cfg.vis_dim)
        vis[2:7] = torch.randn(5, cfg.vis_dim, generator=torch.Generator().manual_seed(1))
        vis.numpy().astype("<f4").tofile(tmp_path / "vis.bin")
        files["vis"] = (tmp_path / "vis.bin", n)
    if case.project:
        raw = np.random.default_rng(2).standard_normal((3, cfg.vis_dim)).astype("<f4")
        raw.tofile(tmp_path / "p.bin")
        files["project"] = (tmp_path / "p.bin", 3, tmp_path / "po.bin")
    bank_hidden = None
    if bank_slots:  # FLUX.3's pass: the student rows under the bank
        assert cfg.n_bank == bank_slots
        bank_hidden = lay_bank(hidden, student_ids, case.prompt, cfg.n_bank)
        bank_hidden.numpy().astype("<f4").tofile(tmp_path / "bh.bin")
        files["bank"] = (tmp_path / "bh.bin",)
    runner = driver.path.parent / "adapter_probe"
    detected = run_probe(runner, export, tmp_path / "out.bin", **files)

    want_fields = {**declared(pack, cfg, student), **case.expect}
    wrong = {k: (detected.get(k), v) for k, v in want_fields.items() if detected.get(k) != str(v)}
    assert not wrong, f"{case.id}: ggk's runner detected (got, declared) {wrong}"
    if seeded and pack.seed_vocab > 32128:
        assert max(seeds) >= 32128, "the prompt reaches no seed row past T5 v1.1's table"

    ours = load_gguf(export)

    def forward(bank=None):
        kw = {} if bank is None else {"want_bank": True, "bank_hidden": bank[None]}
        with torch.no_grad():
            return ours(hidden[None], seed_ids=None if seeds is None else torch.tensor([seeds]),
                        vis=None if vis is None else vis[None], **kw)[0].numpy()

    want = forward(bank_hidden)
    worst = rel_error(tmp_path / "out.bin", want)
    if bank_hidden is not None:  # the runner read the bank rows at training's offset: shifted
        # by one row they give another bank
        off = rel_error(tmp_path / "out.bin", forward(torch.roll(bank_hidden, 1, 0)))
        assert off > 1e-2, f"{case.id}: the bank rows shifted by one give {off:.2e}"
        print(f"{case.id}: bank rows shifted by one: {off:.2e}")
    if vis is not None:  # the runner read the rows: without them the image rows come out otherwise
        with torch.no_grad():
            blind = ours(hidden[None])[0].numpy()
        got = np.fromfile(tmp_path / "out.bin", dtype="<f4").reshape(want.shape)
        assert np.abs(blind[2:7] - got[2:7]).max() > 1e-3 * np.abs(got).max()
    if case.project:
        proj = np.fromfile(tmp_path / "po.bin", dtype="<f4").reshape(3, -1)
        ref = vision_project(export, raw)
        assert np.abs(proj - ref).max() <= case.tol * np.abs(ref).max()
    print(f"{case.id}: ggk's ModelLoader + {detected['runner']} runner on {n} rows "
          f"({want.shape[0]} x {want.shape[1]} out): max |d| / max |ref| = {worst:.2e} "
          f"in {time.perf_counter() - t0:.1f} s")
    assert worst <= case.tol


def lay_bank(hidden, student_ids, prompt: str, n_bank: int):
    """The student rows under the FLUX.3 bank as training lays them (data/bank_rows.collate_bank
    over teachers/qwen35_bank.bank_ids; the engine's conditioner.hpp 4426-4448): bank row
    PREFIX_ROWS + i reads student row i, the body cut at n_bank - 8, none for an empty prompt,
    zeros elsewhere."""
    import torch

    from gguf_trainer.data.bank_rows import PREFIX_ROWS
    from gguf_trainer.teachers.qwen35_bank import bank_ids

    _, n_body = bank_ids(student_ids, prompt, n_bank)
    assert 0 < n_body < len(student_ids), "the case's prompt reaches past the bank's body cut"
    out = torch.zeros(n_bank, hidden.shape[1])
    out[PREFIX_ROWS : PREFIX_ROWS + n_body] = hidden[:n_body]
    return out


_ENCODE = {}


def driver_encode():
    """The student tokenizer as the engine encodes (qwen_bpe.engine_bpe)."""
    if "f" not in _ENCODE:
        from gguf_trainer.engine.qwen_bpe import engine_bpe
        from gguf_trainer.model.student import load_tokenizer
        from gguf_trainer.tiny import qwen_tokenizer_dir

        _ENCODE["f"] = engine_bpe(load_tokenizer(qwen_tokenizer_dir())).encode
    return _ENCODE["f"]
