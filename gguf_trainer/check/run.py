"""`gguf-trainer check`, the run: which pack judges an adapter, the adapter's rows for the dump's
prompt, the checks of the dump's ids against the prompt, the figures as a dict and as text.
The slot kinds (qwen35_bridge, ming_image) go to slot_dumps.py.

    res = run_check("pig_llada_adapter-f16.gguf", "pig_clip-f16.gguf", "dumps/run1", "a sheep")
    print(format_check(res))
"""

from __future__ import annotations

import json
from dataclasses import asdict
from pathlib import Path

import numpy as np

from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.materials.materials import seed_tokenizer
from gguf_trainer.materials.materials import student_path as linked_student
from gguf_trainer.packs import get_pack, pack_ids
from gguf_trainer.store.project import load_project

from .dump_files import (
    DUMP_FILES,
    NO_T5_MODEL,
    QWEN_HIDDEN,
    T5_IDS_TXT,
    TOKENS_TXT,
    VIS_EMBEDS,
    VIS_POS,
    read_dump,
    read_ids,
    read_vision_dump,
)
from .figures import compare, lead_figures, lead_rows, tap_figures, verdict_line
from .slot_dumps import SLOT_KINDS, slot_check, slot_ids_line


def _layerwise_pack(module) -> str:
    """The layerwise pack of this file: the one it names, else the first whose taps it carries."""
    taps = tuple(module.config.taps)
    named = (getattr(module, "metadata", {}) or {}).get("adapter.pack")
    packs = [p for p in map(get_pack, pack_ids()) if p.adapter_kind == "layerwise"]
    pack = next((p for p in packs if p.id == named and tuple(p.taps) == taps), None)
    pack = pack or next((p for p in packs if tuple(p.taps) == taps), None)
    if pack is None:
        raise UserError(
            f"this layerwise adapter's taps {list(taps)} are no family's in this version; "
            "check it against a dump of the family it was trained for."
        )
    return pack.id


# The adapter kinds whose engine output has a fixed shape: the only ones a dump checks row by row.
FIXED_KINDS = ("resampler", "seeded_resampler")


def _pack_for(module) -> str:
    """The pack that judges this adapter: the fixed-shape pack it names (adapter.pack), else the
    pack declared the default for its kind (exports from before adapter.pack)."""
    if module.config.kind == "layerwise":
        return _layerwise_pack(module)
    if module.config.kind in SLOT_KINDS:  # the pack it names, else the kind's shipped pack
        named = (getattr(module, "metadata", {}) or {}).get("adapter.pack")
        packs = [p for p in map(get_pack, pack_ids()) if p.adapter_kind == module.config.kind]
        pack = next((p for p in packs if p.id == named), None) or next(
            (p for p in packs if type(p).__module__.startswith("gguf_trainer.packs.")), None)
        if pack is None:
            raise UserError(f"no pack of this version serves a {module.config.kind} adapter.")
        return pack.id
    fixed = [p for p in map(get_pack, pack_ids()) if p.adapter_kind in FIXED_KINDS]
    pack = (getattr(module, "metadata", {}) or {}).get("adapter.pack")
    if pack not in [p.id for p in fixed]:
        pack = next(
            (
                p.id
                for p in fixed
                if p.check_default_for_kind and p.adapter_kind == module.config.kind
            ),
            None,
        )
    if pack is None:
        raise UserError(
            "only fixed-shape adapters (LLaDA-Image resampler, T5 seeded resampler) "
            "can be checked against a dump; a token-aligned adapter's rows follow the prompt."
        )
    return pack


def predict(adapter, student, prompt: str, pack_id: str, seed_ids=None, images=None):
    """The adapter's rows [Q, out_dim] for one prompt, the student ids it read and the student
    states [L, hidden]. `images` (read_vision_dump): the edit template with those reference
    images, spliced as the engine splices them (conditioner.hpp 2676-2695)."""
    import torch

    from gguf_trainer.data.samples import Sample
    from gguf_trainer.model.vision import image_runs


    pack = get_pack(pack_id)
    images = images or []
    sample = Sample(prompt, images=tuple(Path(f"reference_{i + 1}") for i in range(len(images))))
    ids = pack.student_ids(engine_bpe(student.tokenizer).encode, sample,
                           [r.shape[0] for _, r in images])
    x = torch.tensor([ids])
    keep = torch.ones_like(x)
    keep[0, pack.padding.real_length(ids) :] = 0  # the family's pads: masked student keys
    at = pack.padding.positions(ids)
    splices, vis = [], None
    if images:
        runs = image_runs(ids, pack.image_pad_id)[: len(images)]
        if [s for s, _ in runs] != [s for s, _ in images]:
            raise UserError(
                f"the dump's {VIS_POS} splices the images at rows {[s for s, _ in images]} but "
                f"this prompt's edit template has them at {[s for s, _ in runs]}; pass the "
                "exact --prompt the engine ran."
            )
        w = adapter.vision_proj.weight.detach().float()
        vis = torch.zeros(1, len(ids), w.shape[1])
        for s, r in images:
            rows = torch.from_numpy(np.ascontiguousarray(r, dtype=np.float32))
            splices.append((0, s, rows @ w.T))
            vis[0, s : s + rows.shape[0]] = rows
    hidden = student.hidden(x, keep, splices=splices,
                            position_ids=None if at is None else torch.tensor([at]))
    with torch.no_grad():
        seeds = None if seed_ids is None else torch.tensor([seed_ids])
        out = adapter(hidden, seed_ids=seeds, vis=vis)
    return out[0].float().cpu().numpy(), ids, hidden[0].float().cpu().numpy()


def check_seed_ids(
    seed_ids: list[int], window: int, prompt: str, t5_model=None, vocab: int | None = None
) -> None:
    """A T5 dump's `t5_ids.txt` against the adapter and the prompt, one sentence per fault:
    its length must be the adapter's window, every id a row of its `vocab`-row seed table
    (another T5 vocabulary's dump is not this adapter's); a non-empty prompt whose ids are the empty
    prompt's is the CFG negative pass (written last); with the teacher's `spiece.model` the ids
    must be this prompt's (the engine's T5 rule, t5_unigram.py)."""
    from gguf_trainer.engine.t5_unigram import T5Unigram
    from gguf_trainer.engine.template_ids import Piece, template_ids
    from gguf_trainer.teachers.t5 import T5_VOCAB, window_ids

    if len(seed_ids) != window:
        raise UserError(
            f"the dump's {T5_IDS_TXT} holds {len(seed_ids)} ids but this adapter reads a "
            f"{window}-slot window; the dump was written by another model or adapter."
        )
    bad = next((i for i in seed_ids if i < 0 or (vocab is not None and i >= vocab)), None)
    if bad is not None:
        raise UserError(
            f"the dump's {T5_IDS_TXT} holds the id {bad}, outside this adapter's {vocab}-row "
            "seed table; the dump was written by another model (another T5 vocabulary)."
        )
    encode = None
    if t5_model is not None:
        try:
            encode = T5Unigram.from_spm(t5_model).encode
        except (OSError, RuntimeError) as e:
            raise UserError(f"{t5_model} is not a sentencepiece model ({e}); pass the T5 "
                            "teacher's spiece.model.") from None

    def ids_of(text: str) -> list[int]:
        return window_ids(template_ids(encode, [Piece(text, prompt=True)]), window)

    # "" is [▁, EOS]: [3, 1] in T5 v1.1's vocabulary (and the tiny demos'); a larger one (UMT5)
    # is known only through its tokenizer
    if encode is not None:
        empty = [i for i in ids_of("") if i != 0]
    else:
        empty = [3, 1] if vocab is None or vocab <= T5_VOCAB else None
    if prompt.strip() and [i for i in seed_ids if i != 0] == empty:
        raise UserError(
            f"the dump's {T5_IDS_TXT} is the empty prompt's: with CFG on, the last pass the "
            "engine writes is the empty negative prompt; dump again with --cfg-scale 1."
        )
    if encode is not None and ids_of(prompt) != seed_ids:
        raise UserError(
            f"the dump's {T5_IDS_TXT} is not this prompt's T5 ids; pass the exact "
            "--prompt the engine ran (a dump is overwritten by each pass)."
        )


def _project_t5_model(adapter, project) -> tuple[Path | None, str]:
    """The project's teacher tokenizer for this adapter's seed ids (materials.seed_tokenizer), or
    None and why; an adapter that names another pack than the project's is refused."""
    named = (getattr(adapter, "metadata", {}) or {}).get("adapter.pack")
    if named and named != project.pack.id:
        raise UserError(
            f"this adapter was trained by the {named} pack but the project {project.dir} is "
            f"{project.pack.id}; pass the --project it was trained in."
        )
    path, why = seed_tokenizer(project)
    if path is None:
        why = why or f"the {project.pack.title} pack reads no T5 ids"
        why = f"the project's teacher tokenizer is not found: {why}; link the teacher or pass " \
              "--t5-model"
    return path, why


def check_inputs(project, adapter=None, student=None, tokenizer=None) -> tuple[Path, Path, Path]:
    """The adapter GGUF, student GGUF and student tokenizer folder a check runs: each one given
    as given, else the `project`'s (loaded, or None): its export (what `status` names, the
    render's adapter) and its linked student materials; one that is neither is a sentence
    saying what to do. Without a project and a tokenizer: the real Qwen BPE files."""
    if project is None:
        for value, flag in ((adapter, "--adapter FILE"), (student, "--student FILE")):
            if value is None:
                raise UserError(f"pass {flag}, or --project DIR to take it from the project.")
        if tokenizer is None:
            # the real Qwen BPE files pig_clip uses
            from gguf_trainer.tiny import qwen_tokenizer_dir

            tokenizer = qwen_tokenizer_dir()
        return Path(adapter), Path(student), Path(tokenizer)
    if adapter is None:
        adapter = project.final_gguf
        if not adapter.is_file():
            raise UserError(
                f"the project {project.dir} has no exported adapter yet ({adapter} does not "
                f"exist); run it first (gguf-trainer run --project {project.dir}) or pass "
                "--adapter FILE."
            )
    if student is None:
        student = linked_student(project, "student", "--student FILE")
    if tokenizer is None:
        tokenizer = linked_student(project, "student_tokenizer", "--tokenizer DIR")
    return Path(adapter), Path(student), Path(tokenizer)


def run_check(
    adapter_path, student_path, dump, prompt: str, tokenizer_dir=None, t5_model=None,
    project=None,
) -> dict:
    """Every figure of the check as a dict (see `format_check`). `t5_model`: the T5 teacher's
    spiece.model, to compare a T5 dump's ids with the prompt's; without it, the loaded
    `project`'s linked teacher's (materials.seed_tokenizer). The adapter, student and
    tokenizer left None are the project's (check_inputs)."""
    from gguf_trainer.model.adapters import TOKEN_ALIGNED_KINDS, load_gguf
    from gguf_trainer.model.student import load_student

    adapter_path, student_path, tokenizer_dir = check_inputs(
        project, adapter_path, student_path, tokenizer_dir
    )
    adapter = load_gguf(adapter_path)
    pack_id = _pack_for(adapter)
    t5_why = "" if t5_model is not None else NO_T5_MODEL
    if project is not None:
        found, why = _project_t5_model(adapter, project)
        if t5_model is None:
            t5_model, t5_why = found, why
    if adapter.config.kind in SLOT_KINDS:  # rows per teacher token: slot_dumps.py
        return slot_check(adapter, adapter_path, load_student(student_path, tokenizer_dir),
                          prompt, dump, pack_id)
    dump_dir = Path(dump) if Path(dump).is_dir() else Path(dump).parent
    seed_ids = read_ids(dump_dir / T5_IDS_TXT)
    pack = get_pack(pack_id)
    seeded = adapter.config.kind == "seeded_resampler"  # its rows follow the T5 window's ids
    if seeded:
        if seed_ids is None:
            raise UserError(
                f"{dump_dir} has no {T5_IDS_TXT}; a {pack.title} check needs the engine's seed "
                "ids."
            )
        check_seed_ids(
            seed_ids, adapter.config.num_queries, prompt, t5_model, adapter.config.seed_vocab
        )
    student = load_student(student_path, tokenizer_dir)
    images = read_vision_dump(dump_dir, adapter.config.vis_dim)
    pred, ids, hidden = predict(adapter, student, prompt, pack_id, seed_ids, images)
    ref = read_dump(dump, pred.shape[1], max_rows=pred.shape[0])
    if ref.shape[0] != pred.shape[0]:
        raise UserError(
            f"the dump has {ref.shape[0]} rows but the adapter makes {pred.shape[0]}; "
            "it was written by another model or adapter."
        )
    engine_ids = read_ids(dump_dir / TOKENS_TXT)
    if engine_ids is not None and engine_ids != ids:
        raise UserError(
            f"the dump's {TOKENS_TXT} ({len(engine_ids)} ids) is not the student's "
            f"tokenization of this prompt ({len(ids)} ids); pass the exact --prompt the "
            "engine ran, without weights syntax."
        )
    rows = pack.check_rows(seed_ids) if seeded else None  # the rows the DiT reads
    keep = None if rows is None else np.array(rows)
    if pack.taps:  # the rows the DiT reads (Krea2 drops its 34 prefix rows)
        keep = np.arange(pred.shape[0]) >= pack.start
    figures = compare(pred, ref, keep)
    per_tap = tap_figures(pred, ref, pack.taps, keep) if pack.taps else None
    # the lead: tokens and pads apart, each centred on its own mean (a resampler's rows the DiT
    # reads are all tokens)
    sets = (lead_rows(pack, ids, engine_bpe(student.tokenizer).encode)
            if adapter.config.kind in TOKEN_ALIGNED_KINDS
            else {"tokens": np.ones(pred.shape[0], bool) if keep is None else keep})
    lead = lead_figures(pred, ref, sets, pack.taps)
    student_cos = None
    if (dump_dir / QWEN_HIDDEN).is_file():
        engine_states = read_dump(dump_dir / QWEN_HIDDEN, hidden.shape[1],
                                  max_rows=hidden.shape[0])
        if engine_states.shape != hidden.shape:
            raise UserError(
                f"the dump's {QWEN_HIDDEN} has {engine_states.shape[0]} student rows but this "
                f"prompt is {hidden.shape[0]} student tokens; pass the exact --prompt the "
                "engine ran (with CFG on, dump with --cfg-scale 1: the empty "
                "negative is written last)."
            )
        student_cos = compare(hidden, engine_states)["cos"]
    return {
        "student_cos": student_cos,
        "adapter": str(adapter_path),
        "dump": str(dump),
        "pack": pack_id,
        "prompt": prompt,
        "student_tokens": len(ids),
        "images": len(images or ()),
        "tokens_checked": engine_ids is not None,
        # T5: whether t5_ids.txt was compared with this prompt's ids (the T5 tokenizer of
        # --t5-model or the project's teacher), with which file, or why not
        "t5_ids_checked": (t5_model is not None) if seeded else None,
        "t5_model": str(t5_model) if t5_model is not None and seeded else None,
        "t5_ids_why_not": t5_why if t5_model is None and seeded else None,
        "lead": lead,
        **figures,
        "per_tap": per_tap,
        "verdict": _verdict(pack_id, figures, ref_name(dump)),
        "thresholds": asdict(pack.verdict) if pack.verdict else None,
    }


def ref_name(dump) -> str:
    """The dump file the figures compare with."""
    path = Path(dump)
    if path.is_dir():
        return next((n for n in DUMP_FILES if (path / n).is_file()), "")
    return path.name


def _verdict(pack_id: str, figures: dict, ref: str) -> str:
    """A dump the engine writes only when it runs this very adapter (the pack's
    `port_check_dump`: a T5 family's adapter_out.bin) gives a port check (the engine vs this
    tool on one file), not a verdict on the adapter's quality."""
    port = get_pack(pack_id).port_check_dump
    if port and ref == port:
        return (
            "port check (the engine's run of this adapter vs this tool's): cos "
            f"{figures['cos']:.6f}; "
            "near 1 means the engine reads the file as trained, not that the adapter is good "
            "(judge quality by eval's val cos)"
        )
    return verdict_line(pack_id, figures)


def format_check(res: dict) -> str:
    student = []
    if res.get("t5_ids_checked") is False:
        student.append(
            f"t5 ids:   {T5_IDS_TXT} not compared with this prompt's "
            f"({res.get('t5_ids_why_not') or NO_T5_MODEL}): a dump of another prompt of the same "
            "length is not refused, only its figure drops"
        )
    elif res.get("t5_ids_checked"):
        student.append(f"t5 ids:   {T5_IDS_TXT} is this prompt's ({res.get('t5_model')})")
    if res.get("student_cos") is not None:
        student.append(
            f"student:  cosine {res['student_cos']:.6f} to the engine's {QWEN_HIDDEN} "
            "(a quantized --llm lowers it; the adapter figures include that)"
        )
    return "\n".join(
        [
            f"adapter:  {res['adapter']} ({res['pack']})",
            (
                f"dump:     {res['dump']} ({res['rows']} rows; "
                + (slot_ids_line(res) if res.get("slots") is not None else "student tokens "
                   + ('match' if res['tokens_checked'] else 'not checked: no tokens.txt'))
                + (f"; {res['images']} reference image(s) from {VIS_EMBEDS}"
                   if res.get("images") else "")
                + ")"
            ),
            *[f"{n + ':':<9} centred cosine {f['cos_centered']:.6f}   rel_mse "
              f"{f['rel_mse']:.6g}   ({f['rows']} rows, each set centred on its own mean)"
              + ("" if not f.get("per_tap") else "; per tap " + ", ".join(
                  f"L{t} {c:.4f}" for t, c in zip(res["per_tap"]["taps"], f["per_tap"])))
              for n, f in (res.get("lead") or {}).items()],
            (
                f"all rows: cosine {res['cos']:.6f}   centred cosine {res['cos_centered']:.6f}   "
                f"rel_mse {res['rel_mse']:.6g}   worst centred row "
                f"{res['worst_row_cos_centered']:.4f}"
            ),
            *student,
            *(
                []
                if not res.get("per_tap")
                else [
                    "per tap:  "
                    + ", ".join(
                        f"L{t} {c:.4f}"
                        for t, c in zip(res["per_tap"]["taps"], res["per_tap"]["cos"])
                    )
                ]
            ),
            f"verdict:  {res['verdict']}",
        ]
    )


def check_main(
    adapter, student, dump, prompt, tokenizer=None, as_json=False, out=None, t5_model=None,
    project=None,
) -> int:
    """The body of `gguf-trainer check`: prints the figures and the verdict. Exit 0 whenever
    the check ran (the verdict is a finding, not a failure); bad input is a UserError.
    `project`: the project folder whose export, linked student and tokenizer stand in for the
    ones not given and whose linked teacher gives the T5 tokenizer."""
    import sys

    loaded = load_project(project) if project is not None else None
    res = run_check(adapter, student, dump, prompt, tokenizer, t5_model, loaded)
    print(json.dumps(res, indent=2) if as_json else format_check(res), file=out or sys.stdout)
    return 0
