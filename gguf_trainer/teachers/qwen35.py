"""The Qwen3.5 bridge's teacher: the text stack of a transformers `qwen3_5` snapshot (Qwen3.5-9B,
MOSS-Image's text encoder: a hybrid of Gated-DeltaNet and full-attention layers), run on the
MOSS template the engine builds, returning its LAST HIDDEN STATE after the final norm (4096 for
the 9B), one row per Qwen3.5 template token: the rows MOSS-Image's DiT conditions on
(engine-families §2 row 20).

Owns: the vocabulary read from the snapshot's tokenizer.json (what the adapter GGUF carries, so
the engine tokenizes with the teacher's own vocabulary), the slot ids (engine/qwen35_bpe.py: the
engine's tokenizer and template, never Hugging Face's), the run (right-padded batches: every layer
is causal, so a real row never reads a pad), and the embedding table the seed PCA is taken from,
read from the weight files alone. References (conditioner.hpp 3465-3548, the full MOSS path the
adapter replaces): `vision` runs the snapshot's own Qwen3.5 tower (transformers' `visual`, the
model `mmproj-qwen3.5-9b` is converted from) on the engine's pixels (engine/qwen35_refs.py),
its merger rows (`pooler_output`, vis_dim wide) being what the engine's `--llm_vision` hands
both the full text encoder and the adapter; `targets` then splices each image's rows over its
`<|image_pad|>` run of the template and runs the text stack at the M-RoPE positions the engine
builds from the image's grid (its `LLMImageExtra` grid_h / grid_w, 3530-3531: text counts on,
image row j at (p, p + j // gw, p + j % gw), the text after it at p + max(gh, gw)). A batch
without images runs at plain positions 0..P-1, as before. Placement as the other Qwen
teachers (qwen3vl.place): gpu resident in bf16, offload streamed through the card, cpu in fp32.
Must not: know packs, projects or settings.

    teacher = load_qwen35_teacher(root, device, max_slots=1536, mode=plan.mode)
    out = teacher.targets(samples, student_ids)   # [TargetRows(rows [P, 4096], seed_ids)]
    rows = teacher.vision(paths)                  # [(n_i, 4096)] the tower's merger rows
    segs = teacher.vision_segments(rows)          # VisionSegment(first <|image_pad|> slot, rows)
    out = teacher.targets(samples, student_ids, [segs])
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Sequence
from pathlib import Path

from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.qwen35_bpe import PREFIX, EngineQwen35BPE, moss_prompt, padded_tokens

from .base import VisionSegment
from .offload import teacher_device, weights_dtype
from .qwen3vl import mrope_positions, place, run_tower
from .snapshot_files import weight_files

log = logging.getLogger(__name__)

MODEL_TYPES = ("qwen3_5", "qwen3_5_text")
IMAGE_PAD_ID = 248056  # <|image_pad|> (conditioner.hpp 4374: the engine's own constant)
PAD_SLOT = -1  # seed_ids past a sample's slots (slot_resampler.PAD_SLOT)
# At load: the template of an empty prompt must give the engine's ids (anchor 0.0.14 §4 probe).
PROBE_HEAD, PROBE_TAIL = [248045, 846, 198], [248068, 198]


def read_vocabulary(root: Path) -> tuple[list[str], list[str]]:
    """(tokens, merges) of the snapshot's tokenizer.json: the id-ordered token list (added
    tokens included, the engine's specials and `[PAD<i>]` filled in up to the embedding rows)
    and the merges as "a b" strings, in rank order."""
    path = Path(root) / "tokenizer.json"
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        model = data["model"]
        vocab = dict(model["vocab"])
        merges = [m if isinstance(m, str) else " ".join(m) for m in model["merges"]]
    except FileNotFoundError:
        raise UserError(f"{path} is missing; download the teacher snapshot again.") from None
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{path} is not a BPE tokenizer.json; download the teacher snapshot "
                        "again.") from None
    for added in data.get("added_tokens", ()):
        vocab[added["content"]] = int(added["id"])
    return padded_tokens(vocab), merges


def read_config(root: Path) -> dict:
    """config.json, refused unless it is a Qwen3.5 (qwen3_5) config."""
    path = Path(root) / "config.json"
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is missing; download the teacher snapshot again.") from None
    except ValueError:
        raise UserError(f"{path} is not valid JSON; download the teacher snapshot again.") from None
    if config.get("model_type") not in MODEL_TYPES:
        raise UserError(f"{path} is a {config.get('model_type')!r} config, not Qwen3.5 "
                        "(qwen3_5); point materials.teacher.path at Qwen/Qwen3.5-9B.")
    return config


def text_config(config: dict) -> dict:
    return config.get("text_config", config)


def embed_table(root: Path):
    """The token embedding table (V, D) as float32, read from the weight files alone (the seed
    PCA's input; no model is built)."""
    import torch
    from safetensors import safe_open

    root = Path(root)
    for name in weight_files(root):
        with safe_open(str(root / name), framework="pt") as f:
            for key in f.keys():  # noqa: SIM118 (safe_open has no __iter__)
                if key.endswith("embed_tokens.weight") and "visual" not in key:
                    return f.get_tensor(key).to(torch.float32)
    raise UserError(f"{root} has no embed_tokens.weight; download the teacher snapshot again.")


class Qwen35Teacher:
    """See the module docstring."""

    is_mock = False

    def __init__(self, text, bpe: EngineQwen35BPE, device, max_slots: int, identity: dict,
                 mode: str, visual=None):
        import torch

        self.text, self.bpe, self.max_slots = text, bpe, max_slots
        self.visual = visual
        self.device, self.mode = torch.device(device), mode
        self.dtype = next(text.parameters()).dtype
        self.identity = identity
        self.hidden = int(text.config.hidden_size)
        self.vis_dim = int(visual.config.out_hidden_size) if visual is not None else 0

    def slot_ids(self, sample, image_tokens: Sequence[int] = ()) -> list[int]:
        return self.bpe.encode(moss_prompt(sample.text, image_tokens))

    def lengths(self, samples: Sequence, student_ids, vision=None) -> list[int]:
        vision = vision or [()] * len(samples)
        return [len(self.slot_ids(s, [g.rows.shape[0] for g in segs or ()]))
                for s, segs in zip(samples, vision)]

    # -- references -------------------------------------------------------------------------

    def vision(self, images: Sequence) -> list:
        """The tower's merger rows (n_i, vis_dim) float32 on the CPU per reference (a path),
        on the engine's pixels (engine/qwen35_refs.py: smart resize to 32s, antialiased
        bilinear, alpha over white, 2x - 1; default max_pixels 1024²)."""
        from gguf_trainer.engine.qwen35_refs import FACTOR, bridge_pixels, load_image

        if self.visual is None:
            raise UserError("this Qwen3.5 snapshot has no vision tower (model.visual.*); "
                            "download Qwen/Qwen3.5-9B again or build the corpus without "
                            "reference images.")
        device = self.device if self.mode != "cpu" else "cpu"
        dtype = next(self.visual.parameters()).dtype
        grids = []

        def prepare(path):
            x = bridge_pixels(load_image(path))
            grids.append((x.shape[1] // FACTOR, x.shape[2] // FACTOR))  # merged rows (gh, gw)
            return x

        rows = run_tower(self.visual, images, prepare, device, dtype)
        for r, g in zip(rows, grids):  # prepared in order: the M-RoPE grid rides on the rows
            r.grid = g
        return rows

    def vision_segments(self, rows: Sequence) -> list:
        """One VisionSegment per reference of a sample: its rows and its first
        `<|image_pad|>` slot in the template, as the engine counts it."""
        return vision_segments(self.bpe, rows)

    def targets(self, samples: Sequence, student_ids, vision=None) -> list:
        """Per sample the last hidden state (P, hidden) of its P template tokens, and its slot
        ids padded with PAD_SLOT to max_slots (the shard's seed_ids). `vision`: per sample its
        VisionSegments (vision_segments), spliced over the image pads at M-RoPE positions."""
        import torch

        from .base import TargetRows

        vision = vision or [()] * len(samples)
        ids = [self.slot_ids(s, [g.rows.shape[0] for g in segs or ()])
               for s, segs in zip(samples, vision)]
        if max(len(x) for x in ids) > self.max_slots:
            raise UserError(f"a prompt is over {self.max_slots} Qwen3.5 tokens, more than the "
                            "adapter's slots; precompute drops such samples (max_len_teacher).")
        width = max(len(x) for x in ids)
        input_ids = torch.zeros(len(ids), width, dtype=torch.long)
        keep = torch.zeros(len(ids), width, dtype=torch.long)
        for b, row in enumerate(ids):
            input_ids[b, : len(row)] = torch.tensor(row)
            keep[b, : len(row)] = 1
        table = self.text.embed_tokens.weight  # gathered where it sits (offload: RAM)
        embeds = table[input_ids.to(table.device)].to(self.device, self.dtype)
        position_ids = None
        if any(vision):
            position_ids = torch.arange(width).repeat(4, len(ids), 1)  # text axis: 0..P-1
            for b, (row, segs) in enumerate(zip(ids, vision)):
                grids = []
                for g in segs or ():
                    check_image_slots(row, g)
                    embeds[b, g.start : g.start + g.rows.shape[0]] = g.rows.to(self.device,
                                                                               self.dtype)
                    grids.append((g.start, *g.grid))
                position_ids[1:, b, : len(row)] = torch.tensor(mrope_positions(len(row), grids))
            position_ids = position_ids.to(self.device)
        with torch.inference_mode():
            out = self.text(inputs_embeds=embeds, attention_mask=keep.to(self.device),
                            position_ids=position_ids, use_cache=False)
            out = out.last_hidden_state.float().cpu()
        return [
            TargetRows(rows=out[b, : len(row)].clone(),
                       seed_ids=row + [PAD_SLOT] * (self.max_slots - len(row)))
            for b, row in enumerate(ids)
        ]

    def embed_table(self):
        return self.text.embed_tokens.weight.detach().float().cpu()

    def close(self) -> None:
        import torch

        self.text = self.visual = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


class SlotSegment(VisionSegment):
    """A reference's rows at its first `<|image_pad|>` slot, with its merged grid (gh, gw):
    the M-RoPE layout of the teacher's image rows."""

    def __init__(self, start: int, rows, grid: tuple[int, int]):
        super().__init__(start, rows)
        self.grid = grid


def vision_segments(bpe: EngineQwen35BPE, rows: Sequence, grids: Sequence | None = None) -> list:
    """The SlotSegments of one sample's references (rows per image, in order): the first slot
    of each by the engine's count (qwen35_refs.image_slot_starts); `grids` (gh, gw) per image,
    default a single row of n (the mock's rows carry no grid)."""
    from gguf_trainer.engine.qwen35_refs import image_slot_starts

    counts = [int(r.shape[0]) for r in rows]
    starts = image_slot_starts(bpe.encode, counts)
    grids = grids or [getattr(r, "grid", None) or (1, n) for r, n in zip(rows, counts)]
    return [SlotSegment(s, r, tuple(g)) for s, r, g in zip(starts, rows, grids)]


def check_image_slots(ids: Sequence[int], seg) -> None:
    """The image's rows lie on its `<|image_pad|>` run (a prompt spelling the token itself
    would shift it: refused, not spliced over text)."""
    run = ids[seg.start : seg.start + seg.rows.shape[0]]
    if len(run) != seg.rows.shape[0] or any(i != IMAGE_PAD_ID for i in run) or (
            seg.start + len(run) < len(ids) and ids[seg.start + len(run)] == IMAGE_PAD_ID):
        raise UserError("a reference image's rows do not fall on its <|image_pad|> run of the "
                        "MOSS template; a prompt that spells <|image_pad|> cannot be used.")


def check_vocabulary(bpe: EngineQwen35BPE, root: Path) -> None:
    ids = bpe.encode(moss_prompt(""))
    if ids[:3] != PROBE_HEAD or ids[-2:] != PROBE_TAIL or bpe.encode(PREFIX) != PROBE_HEAD:
        raise UserError(f"{Path(root) / 'tokenizer.json'} does not give Qwen3.5's ids for the "
                        "MOSS template; use the Qwen/Qwen3.5-9B snapshot's tokenizer.json.")


def load_qwen35_teacher(root: Path, device, max_slots: int, mode: str | None = None,
                        ram_limit_gib: float = 0.0) -> Qwen35Teacher:
    """Check config and vocabulary, then load the text stack (the vision tower is dropped)
    placed as the planner's `mode` says."""
    import torch
    from transformers import AutoModel

    from .t5 import _quiet_progress

    root = Path(root)
    if not root.is_dir():
        raise UserError(f"the teacher snapshot {root} does not exist; download it or set "
                        "materials.teacher.path.")
    config = read_config(root)
    tokens, merges = read_vocabulary(root)
    bpe = EngineQwen35BPE(tokens, merges)
    check_vocabulary(bpe, root)
    mode = mode or ("gpu" if torch.device(device).type == "cuda" else "cpu")
    device = teacher_device(mode, device)
    if mode in ("offload", "cpu") and ram_limit_gib:
        need = sum((root / n).stat().st_size for n in weight_files(root)) / 1024**3
        need *= 2 if mode == "cpu" else 1  # bf16 files, fp32 on a CPU (the tower included)
        if need > ram_limit_gib:
            raise UserError(f"the Qwen3.5 teacher needs {need:.1f} GiB of RAM in teacher mode "
                            f"{mode} but only {ram_limit_gib:.1f} GiB is available; use a CUDA "
                            "card, raise precompute.cpu_mem_gib, or close other programs.")
    dtype = weights_dtype(mode, device)
    with _quiet_progress():
        model = AutoModel.from_pretrained(str(root), dtype=dtype)
    text = getattr(model, "language_model", model)
    visual = getattr(model, "visual", None)  # the references' tower (kept: ~0.9 GB of 19)
    text.eval().requires_grad_(False)
    if visual is not None:
        visual.eval().requires_grad_(False)
    place(text, visual, device, mode)
    identity = {"teacher": config["model_type"], "rows": "last_hidden_state",
                "template": "moss", "max_slots": max_slots}
    log.info("teacher: Qwen3.5, %d layers (%s), hidden %d; last hidden state; mode %s on %s as %s",
             text.config.num_hidden_layers, ",".join(sorted(set(text.config.layer_types))),
             text.config.hidden_size, mode, device, dtype)
    return Qwen35Teacher(text, bpe, device, max_slots, identity, mode, visual)
