"""The MageFlow pack's real teacher: Qwen3-VL-4B-Instruct as ggk's MageFlow conditioner runs it
(engine-contract §3.2, §4b).

Owns: the template check (the 64-token edit prefix, the 34-token text-to-image prefix, the
6-token `Image N: <|vision_start|>` header, counted by the snapshot's tokenizer at every load:
the engine hard-codes these counts, so a tokenizer that disagrees is refused, naming the
template), the engine's splice positions (70, then +1+n+6 per further image), the vision tower
(raw `pooler_output` rows = the main merger, deepstack dropped as ggk drops it), the text stack
over the templated ids with the raw rows spliced over the `<|image_pad|>` runs, position ids
all equal (M-RoPE with t = h = w, i.e. plain rope) and the final-norm state of every token.
Placement: `gpu` (all resident, bf16), `offload` (vision tower resident, text stack streamed
from RAM with accelerate's cpu_offload, bf16), `cpu` (fp32: bf16 matmul on CPUs is hundreds of
times slower). Must not: know projects, settings or the planner (the pack's hook passes the
resolved snapshot folder and the planned mode).

    report = check_snapshot(root)                       # headers only: names, dims, tokenizer
    teacher = load_qwen3vl_teacher(root, device, "gpu", student_pieces=pack.student_pieces,
                                   template=pack.teacher_template())
    rows = teacher.vision([path, ...])                  # [n_i, vis_dim] float32 per image
    out = teacher.targets(samples, student_ids, segments)   # [TargetRows(rows [L, hidden])]
    teacher.close()
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_ids import IMAGE_PAD_ID, VISION_END_ID, VISION_START_ID
from gguf_trainer.engine.template_ids import student_ids as engine_ids

from .offload import stream_offload, teacher_device, weights_dtype
from .snapshot_files import weight_files

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)


# Vision tokens per vision-tower batch (the tower's attention is per image: this only bounds
# the activations held at once).
VIS_TOKENS_PER_BATCH = {"cuda": 8192, "cpu": 1024}
VISUAL_PREFIXES = ("model.visual.", "visual.")


# ---------------------------------------------------------------- templates (the engine's counts)


@dataclass(frozen=True)
class Template:
    """The pack's edit and text-to-image prefixes, its image header and size rule, and the
    counts the engine relies on; the pack passes it in (a teacher imports no pack).

    MageFlow (the defaults): the engine hard-codes the prefixes' counts (64 / 34, which are
    also the first rows the DiT reads) and splices image i at 64 + 6 + ... Boogu: the engine
    counts the tokens before each image with its tokenizer (`counts_hard_coded` False), the
    header is `<|vision_start|>` alone and the DiT reads from row 0. (The families whose
    teacher runs the full Qwen3-VL path, deepstack + M-RoPE, use the tap teacher: qwen_taps.)"""

    edit_prefix: str
    edit_start: int  # the first row the DiT reads with images (MageFlow: the prefix's 64 tokens)
    t2i_prefix: str
    t2i_start: int  # the first row the DiT reads without images (MageFlow: 34)
    image_header_tokens: int  # the header's tokens, <|vision_start|> included (MageFlow: 6)
    image_header: str = "Image {n}: <|vision_start|>"  # n = the 1-based image number
    counts_hard_coded: bool = True  # the prefix counts are the engine's constants (MageFlow)
    image_size: Callable | None = None  # (h, w) -> (h̄, w̄); None = MageFlow's rule
    family: str = "MageFlow"
    # a vision input -> (3, h̄, w̄) pixels; None: preprocess_image(path, image_size)
    prepare: Callable | None = None

    def header(self, i: int) -> str:
        """The header of image i (0-based)."""
        return self.image_header.format(n=i + 1)


def count_tokens(tokenizer, text: str) -> int:
    return len(tokenizer(text, add_special_tokens=False)["input_ids"])


def check_templates(tokenizer, p: Template, max_images: int = 9) -> dict[str, int]:
    """The token counts the engine relies on, measured with `tokenizer`: where it hard-codes
    them (MageFlow) the edit prefix (64) and the text-to-image prefix (34); every image
    header (MageFlow `Image i: <|vision_start|>` 6, for i = 1..max_images: ten or more images
    break the engine's assumption; Boogu `<|vision_start|>` 1). UserError naming the template
    whose count differs (the engine would splice images at the wrong rows). Returns the
    counts, the edit prefix's always (the splice rows start after it)."""
    want = {"edit prefix": (p.edit_prefix, p.edit_start if p.counts_hard_coded else None),
            "text-to-image prefix": (p.t2i_prefix, p.t2i_start if p.counts_hard_coded else None)}
    for i in range(max_images):
        want[f"image {i + 1} header"] = (p.header(i), p.image_header_tokens)
    got = {}
    for name, (text, n) in want.items():
        got[name] = count_tokens(tokenizer, text)
        if n is not None and got[name] != n:
            raise UserError(
                f"the {p.family} {name} is {got[name]} tokens with this tokenizer, but "
                f"ggk hard-codes {n}: the teacher's tokenizer is not Qwen3-VL's (or the "
                "template was edited); use the Qwen3-VL tokenizer files."
            )
    ids = tokenizer("<|vision_start|><|image_pad|><|vision_end|>", add_special_tokens=False)[
        "input_ids"
    ]
    if list(ids) != [VISION_START_ID, IMAGE_PAD_ID, VISION_END_ID]:
        raise UserError(
            f"the tokenizer maps <|vision_start|><|image_pad|><|vision_end|> to {list(ids)}, not "
            f"{[VISION_START_ID, IMAGE_PAD_ID, VISION_END_ID]}; use the Qwen3-VL tokenizer files."
        )
    return got


def splice_starts(
    counts: Sequence[int], p: Template, prefix_tokens: int | None = None
) -> list[int]:
    """Where the engine splices each image's rows: the edit prefix's tokens (`prefix_tokens`,
    as the tokenizer counts them; MageFlow: its hard-coded 64) + the header (6) = 70 for the
    first, then each next image 1 (`<|vision_end|>`) + n_prev + the header later (Boogu: the
    engine's tokenizer count of everything before the image, the same rows)."""
    at = (p.edit_start if prefix_tokens is None else prefix_tokens) + p.image_header_tokens
    out = []
    for n in counts:
        out.append(at)
        at += n + 1 + p.image_header_tokens
    return out


def check_splices(
    ids: Sequence[int], counts: Sequence[int], p: Template, prefix_tokens: int | None = None
) -> None:
    """The image runs of `ids` sit where the engine splices them, framed by vision start/end;
    UserError otherwise (the sample's text would shift the engine's rows)."""
    for start, n in zip(splice_starts(counts, p, prefix_tokens), counts):
        ok = (
            start + n < len(ids)
            and ids[start - 1] == VISION_START_ID
            and ids[start + n] == VISION_END_ID
            and all(t == IMAGE_PAD_ID for t in ids[start : start + n])
        )
        if not ok:
            raise UserError(
                f"an image run of {n} tokens is not at row {start} where ggk splices it; the "
                "edit template or its image headers do not tokenize as the engine assumes."
            )


def sup_start(has_images: bool, p: Template) -> int:
    """First row the DiT consumes: MageFlow 64 for the edit template, 34 for text-to-image."""
    return p.edit_start if has_images else p.t2i_start


def mrope_positions(length: int, images: Sequence[tuple[int, int, int]]) -> list[list[int]]:
    """The (t, h, w) rope positions of `length` rows with images (start row, gh, gw) in row
    order, as llm.hpp 2336-2365 builds them for the full Qwen3-VL (HF get_rope_index for still
    images): text rows count on, an image's row j sits at (p, p + j // gw, p + j % gw), the text
    after it resumes at p + max(gh, gw). One rule for both Qwen3-VL teachers (qwen_taps too)."""
    axes = [[0] * length for _ in range(3)]
    nxt = cur = 0
    for start, gh, gw in list(images) + [(length, 0, 0)]:
        if start < cur or start + gh * gw > length:
            raise ValueError(f"an image at row {start} ({gh}×{gw}) does not fit here")
        for r in range(cur, start):
            for a in axes:
                a[r] = nxt
            nxt += 1
        for j in range(gh * gw):
            axes[0][start + j] = nxt
            axes[1][start + j] = nxt + j // gw
            axes[2][start + j] = nxt + j % gw
        nxt += max(gh, gw)
        cur = start + gh * gw
    return axes


# ---------------------------------------------------------------- snapshot check (headers only)


@dataclass
class SnapshotReport:
    root: Path
    text_hidden: int  # out_dim: the final-norm width
    vis_dim: int  # the merger's output width (= text hidden for Qwen3-VL)
    vocab: int
    text_bytes: int  # the text stack as stored (everything outside model.visual.)
    vision_bytes: int
    n_params_text: int
    n_params_vision: int

    def summary(self) -> str:
        return (
            f"Qwen3-VL: text hidden {self.text_hidden}, vision out {self.vis_dim}, vocab "
            f"{self.vocab}; "
            f"text stack {self.n_params_text / 1e9:.2f}B, vision tower "
            f"{self.n_params_vision / 1e6:.0f}M "
            f"parameters ({(self.text_bytes + self.vision_bytes) / 1024**3:.2f} GiB stored)"
        )

    def gib(self, mode: str) -> float:
        """Weights in memory for `mode`: bf16 on a card or streamed, fp32 for cpu."""
        per = 4 if mode == "cpu" else 2
        return (self.n_params_text + self.n_params_vision) * per / 1024**3


def check_snapshot(root: Path) -> SnapshotReport:
    """config.json (a Qwen3-VL config), the tokenizer files, and every weight shard present
    and complete (its header and byte count), from headers alone; UserError naming the file."""
    from .t5 import _numel, read_safetensors_header

    root = Path(root)
    if not root.is_dir():
        raise UserError(
            f"the Qwen3-VL teacher snapshot {root} does not exist; download it or set "
            "materials.teacher.path."
        )
    try:
        config = json.loads((root / "config.json").read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{root / 'config.json'} is missing; download the Qwen3-VL snapshot again."
        ) from None
    except ValueError:
        raise UserError(
            f"{root / 'config.json'} is not valid JSON; download the Qwen3-VL snapshot again."
        ) from None
    if (
        config.get("model_type") != "qwen3_vl"
        or "text_config" not in config
        or "vision_config" not in config
    ):
        raise UserError(
            f"{root / 'config.json'} is not a Qwen3-VL config (model_type "
            f"{config.get('model_type')!r}); point materials.teacher.path at "
            "Qwen/Qwen3-VL-4B-Instruct."
        )
    if not (root / "tokenizer.json").is_file():
        raise UserError(
            f"{root / 'tokenizer.json'} is missing; download the Qwen3-VL snapshot again."
        )
    files = weight_files(root)
    sizes = {"BF16": 2, "F16": 2, "F32": 4}
    tb = vb = tp = vp = 0
    for name in files:
        if not (root / name).is_file():
            raise UserError(
                f"{root / name} is missing (named by the weight index); run the "
                "download again (it resumes)."
            )
        for tensor, info in read_safetensors_header(root / name).items():
            n = _numel(info["shape"])
            if tensor.startswith("lm_head."):
                continue  # the teacher never runs the LM head
            if tensor.startswith(VISUAL_PREFIXES):
                vp, vb = vp + n, vb + n * sizes.get(info["dtype"], 4)
            else:
                tp, tb = tp + n, tb + n * sizes.get(info["dtype"], 4)
    tc, vc = config["text_config"], config["vision_config"]
    return SnapshotReport(
        root,
        int(tc["hidden_size"]),
        int(vc.get("out_hidden_size", tc["hidden_size"])),
        int(tc["vocab_size"]),
        tb,
        vb,
        tp,
        vp,
    )


# ---------------------------------------------------------------- the teacher


def _check_rotary(text_model) -> None:
    """The text rotary table must be the config's (a model built on the meta device and
    loaded can keep an uninitialised non-persistent buffer: every target would be wrong)."""
    import torch

    rot = text_model.rotary_emb
    inv = rot.inv_freq.detach().float().cpu()
    dim = inv.numel() * 2
    theta = float(text_model.config.rope_parameters.get("rope_theta", 5e6))
    want = 1.0 / (theta ** (torch.arange(0, dim, 2, dtype=torch.float32) / dim))
    if not torch.allclose(inv, want, rtol=1e-4):
        raise UserError(
            "the Qwen3-VL text rotary table did not load as the config describes; this "
            "transformers version is not supported for the teacher (pip install "
            "'transformers>=4.57,<6')."
        )


def run_tower(
    visual, items: Sequence, prepare: Callable, device, dtype, full: bool = False
) -> list:
    """The vision tower over pictures: each item prepared by `prepare` (-> (3, h̄, w̄) pixels,
    the family's preprocessing), patchified, run in batches of <= VIS_TOKENS_PER_BATCH merged
    rows (the tower's attention is per picture: this only bounds the activations held at once;
    a shard's 500 pictures at 144 rows would be ~2 GB of patch rows prepared at once). Per
    item its main merger rows (n_i, out) float32 on the CPU (`pooler_output`: what ggk splices
    for a student), or with `full` (main rows, [deepstack rows per merger], (gh, gw) merged
    grid) for a teacher that runs the full Qwen3-VL path. One tower loop for both Qwen3-VL
    teachers (this one and qwen_taps')."""
    import numpy as np
    import torch

    from gguf_trainer.engine.qwen_vl_images import patchify

    merge = int(visual.spatial_merge_size)
    cap = VIS_TOKENS_PER_BATCH["cuda" if torch.device(device).type == "cuda" else "cpu"]

    def tower(batch) -> list:
        rows = torch.from_numpy(np.concatenate([r for r, _ in batch]))
        grid = torch.tensor([g for _, g in batch], dtype=torch.long, device=device)
        with torch.inference_mode():
            res = visual(rows.to(device, dtype), grid_thw=grid)
        sizes = [t * gh * gw // merge**2 for _, (t, gh, gw) in batch]
        mains = [t.float().cpu().clone() for t in torch.split(res.pooler_output, sizes)]
        if not full:
            return mains
        deep = [torch.split(d, sizes) for d in res.deepstack_features]  # kept where they ran
        grids = [(gh // merge, gw // merge) for _, (_, gh, gw) in batch]
        return [(m, [d[i] for d in deep], g) for i, (m, g) in enumerate(zip(mains, grids))]

    out: list = []
    batch, tokens = [], 0
    for item in items:
        try:
            prepared = patchify(prepare(item))
        except (OSError, ValueError) as e:
            raise UserError(f"{item} is not a readable image ({e}); rebuild the corpus.") from None
        _, (t, gh, gw) = prepared
        n = t * gh * gw // merge**2
        if batch and tokens + n > cap:
            out += tower(batch)
            batch, tokens = [], 0
        batch.append(prepared)
        tokens += n
    return out + (tower(batch) if batch else [])


class Qwen3VLTeacher:
    """See the module docstring. `student_pieces(sample, counts)` is the pack's template in the
    engine's pieces (the student's): the teacher tokenizes them with its own vocabulary by the
    engine's rule (the engine feeds Qwen3-VL the ids it builds for the student) and refuses
    when the ids differ from the student's."""

    is_mock = False

    def __init__(
        self,
        model,
        tokenizer,
        device,
        mode: str,
        student_pieces: Callable,
        template: Template,
        report: SnapshotReport | None = None,
        prefix_tokens: int | None = None,
    ):
        import torch

        self.model, self.tokenizer, self.mode = model, tokenizer, mode
        self.text = model.language_model
        self.visual = model.visual
        self.device = torch.device(device) if mode != "cpu" else torch.device("cpu")
        self.dtype = next(self.visual.parameters()).dtype
        self.student_pieces, self.template = student_pieces, template
        self.prefix_tokens = prefix_tokens  # the edit prefix as the tokenizer counts it
        self.report = report
        self.identity = {"teacher": "qwen3_vl", "tap": "final_norm"}
        self._table = self.text.embed_tokens.weight  # offload: the plain RAM module place() kept
        vc = model.config.vision_config
        self.merge = int(vc.spatial_merge_size)
        self.vis_dim = int(getattr(vc, "out_hidden_size", model.config.text_config.hidden_size))
        self.out_dim = int(model.config.text_config.hidden_size)

    # -- vision tower -------------------------------------------------------------------------

    def vision(self, images: Sequence) -> list[torch.Tensor]:
        """Raw merger rows (n_i, vis_dim) float32 on the CPU for each vision input (an image
        path, or what the family's `prepare` takes), in order: the engine's preprocessing, the
        tower by run_tower, `pooler_output` only (deepstack is not used by ggk here)."""
        from gguf_trainer.engine.qwen_vl_images import preprocess_image, target_size

        size = self.template.image_size or target_size  # the family's size rule
        prepare = self.template.prepare or (lambda path: preprocess_image(path, size))
        return run_tower(self.visual, images, prepare, self.device, self.dtype)

    def embed_table(self) -> torch.Tensor:
        """The token embedding table as float32 on the CPU (the vision_proj fit)."""
        return self._table.detach().float().cpu()

    # -- text stack ---------------------------------------------------------------------------

    def lengths(self, samples: Sequence, student_ids: Sequence[Sequence[int]]) -> list[int]:
        return [len(ids) for ids in student_ids]

    def _ids(self, sample, student_ids: Sequence[int], counts: list[int]) -> list[int]:
        """The teacher's own ids of the sample's template; UserError when they differ from the
        student's or the image runs are not where the engine splices them."""
        ids = engine_ids(engine_bpe(self.tokenizer).encode, self.student_pieces(sample, counts))
        if list(ids) != list(student_ids):
            raise UserError(
                "the teacher's and the student's tokenizers give different ids for the same "
                "template; use the pig_clip tokenizer folder with the Qwen3-VL snapshot (both "
                "are the Qwen vocabulary)."
            )
        if counts:
            check_splices(ids, counts, self.template, self.prefix_tokens)
        return list(ids)

    def targets(self, samples: Sequence, student_ids: Sequence[Sequence[int]], vision=None) -> list:
        """Final-norm rows of every token (L, hidden) per sample, images spliced."""
        import torch

        from .base import TargetRows

        vision = vision or [[] for _ in samples]
        ids = [
            self._ids(s, sid, [seg.rows.shape[0] for seg in segs])
            for s, sid, segs in zip(samples, student_ids, vision)
        ]
        width = max(len(x) for x in ids)
        table_dev = self._table.device
        embeds = torch.zeros(len(ids), width, self.out_dim, dtype=self.dtype, device=self.device)
        mask = torch.zeros(len(ids), width, dtype=torch.long, device=self.device)
        for b, (row_ids, segs) in enumerate(zip(ids, vision)):
            e = self._table[torch.tensor(row_ids, dtype=torch.long, device=table_dev)]
            e = e.to(self.device, self.dtype).clone()
            for seg in segs:  # raw merger rows over the <|image_pad|> run, as the engine splices
                e[seg.start : seg.start + seg.rows.shape[0]] = seg.rows.to(self.device, self.dtype)
            embeds[b, : len(row_ids)] = e
            mask[b, : len(row_ids)] = 1
        with torch.inference_mode():
            # position_ids None: every M-RoPE axis gets arange(L), i.e. plain 1-D rope, as ggk
            # runs MageFlow's text stack; no deepstack embeds are passed.
            h = self.text(
                inputs_embeds=embeds, attention_mask=mask, use_cache=False
            ).last_hidden_state
        h = h.float().cpu()
        return [
            TargetRows(rows=h[b, : len(x)].clone(), sup_start=sup_start(bool(segs), self.template))
            for b, (x, segs) in enumerate(zip(ids, vision))
        ]

    def close(self) -> None:
        import torch

        self.model = self.text = self.visual = self._table = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def load_qwen3vl_teacher(
    root: Path,
    device,
    mode: str,
    student_pieces: Callable,
    template: Template,
    ram_limit_gib: float = 0.0,
) -> Qwen3VLTeacher:
    """Check the snapshot from its headers and the templates against its tokenizer (both fail
    in seconds, before any weight loads), then load `Qwen3VLModel` placed for `mode`."""
    from transformers import Qwen3VLModel

    from gguf_trainer.model.student import load_tokenizer

    from .t5 import _quiet_progress

    device = teacher_device(mode, device)
    report = check_snapshot(root)
    need = report.gib(mode)
    if mode in ("offload", "cpu") and ram_limit_gib and need > ram_limit_gib:
        raise UserError(
            f"the Qwen3-VL teacher needs {need:.1f} GiB of RAM in teacher mode {mode} but only "
            f"{ram_limit_gib:.1f} GiB is available; use a CUDA card, raise "
            "precompute.cpu_mem_gib, or close other programs."
        )
    tokenizer = load_tokenizer(root)
    counts = check_templates(tokenizer, template)
    log.info(
        "teacher: %s; mode %s; templates %d/%d tokens, image header %d",
        report.summary(),
        mode,
        counts["edit prefix"],
        counts["text-to-image prefix"],
        counts["image 1 header"],
    )
    with _quiet_progress():
        model = Qwen3VLModel.from_pretrained(str(root), dtype=weights_dtype(mode, device))
    model.eval().requires_grad_(False)
    _check_rotary(model.language_model)
    place(model.language_model, model.visual, device, mode)
    return Qwen3VLTeacher(
        model,
        tokenizer,
        device,
        mode,
        student_pieces,
        template,
        report,
        prefix_tokens=counts["edit prefix"],
    )


def place(text, tower, device, mode: str) -> None:
    """Put a loaded (CPU) Qwen text stack and its vision tower (None: a text-only teacher)
    where `mode` says: gpu = both on `device`; offload = the tower on `device` (small, and it
    runs once per picture), the text stack streamed through the card (offload.stream_offload,
    the embedding table kept a plain RAM module: callers gather its rows on the CPU and pass
    `inputs_embeds`); cpu = left as is. One placement for both Qwen teachers (qwen_taps too)."""
    if mode == "cpu":
        return
    if tower is not None:
        tower.to(device)
    if mode == "gpu":
        text.to(device)
    else:
        stream_offload(text, device, keep=("embed_tokens",))
