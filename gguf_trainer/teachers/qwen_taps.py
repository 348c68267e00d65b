"""The layerwise packs' teacher: the text stack of a transformers Qwen3 (`Qwen3Model`) or
Qwen3-VL (`Qwen3VLModel.language_model`) snapshot, run as ggk's LLMEmbedder runs the full
teacher for a family that conditions on a stack of layers (engine-families §1, §2 rows 6, 13-18).

Owns: the family's template ids built by the engine's rule (the pack's pieces, template_ids.py,
then the family's pads, template_padding.py) and refused unless they are the student's; the
attention (causal, the pads masked as keys, conditioner.hpp 2649-2663) and rope positions
(0..L-1; FLUX.3's pads at 1 on every axis, 2698-2712; every M-RoPE axis equal for text, as the
engine runs a text-only prompt); the taps: tap k is the RAW output of decoder layer k (1-based),
so k = num_layers is taken before the final norm, and no taps means the final norm (llm.hpp
1779-1815); the rows are the taps concatenated in ascending order along the features, one row
per template id, pads included (the DiT reads them: the adapter must produce them). Capture is
by forward hooks on the decoder layers, never `output_hidden_states` (whose last entry is the
final norm in transformers, not layer num_layers' raw output). Must not: know packs, projects
or settings.

Reference images (a layout with `image_preprocess`, Fibo 2.0 edits): the teacher keeps the
snapshot's vision tower and runs the FULL Qwen3-VL path the engine runs without an adapter
(fibo2.hpp 281-332, llm.hpp 2336-2365 and 2439-2469): each picture preprocessed by the family's
rule, the tower's main merger rows spliced over its `<|image_pad|>` run, its deepstack rows
added after decoder layers 1, 2, ... at those rows, and M-RoPE image positions (t = the
block's start, h / w = start + row / col; the text after resumes at start + max(gh, gw)). A tap
is taken where the engine takes it: after the deepstack addition of its layer, i.e. the input
of the next layer (of the final norm for k = num_layers). `vision(paths)` returns the main
merger rows alone: what the engine hands the student (vision_proj) and the adapter (vis_in).

Placement: the planner's mode, as the Qwen3-VL and T5 teachers take it (offload.py, and
qwen3vl.place): gpu resident in bf16, offload the text stack streamed through the card from
RAM (the tower resident, the embedding table indexed in RAM), cpu in fp32.

    layout = TapLayout(taps=(9, 18, 27), start=0, padding=Padding(min_length=512))
    teacher = load_tap_teacher(root, device, student_pieces=pack.student_pieces, layout=layout,
                               mode=plan.mode, ram_limit_gib=plan.cpu_gib)
    out = teacher.targets(samples, student_ids)    # [TargetRows(rows [L, n * hidden])]
    rows = teacher.vision([path, ...])             # image layouts: [n_i, hidden] per picture
    out = teacher.targets(samples, student_ids, segments)   # images spliced, deepstack, M-RoPE
"""

from __future__ import annotations

import gc
import json
import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING

from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.qwen_bpe import engine_bpe
from gguf_trainer.engine.qwen_ids import IMAGE_PAD_ID, PAD_ID
from gguf_trainer.engine.template_ids import Piece
from gguf_trainer.engine.template_ids import student_ids as engine_ids
from gguf_trainer.engine.template_padding import Padding

from .offload import teacher_device, weights_dtype
from .qwen3vl import mrope_positions, place, run_tower
from .snapshot_files import weight_files

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)

ARCHITECTURES = {"qwen3": "Qwen3", "qwen3_vl": "Qwen3-VL"}


@dataclass(frozen=True)
class TapLayout:
    """What the pack's family does with the teacher: its taps (1-based decoder layers,
    ascending; () = the final norm), the first template row the DiT reads (`start`, the token
    count of `start_prefix`, checked with the teacher's tokenizer at load) and its pads."""

    taps: tuple[int, ...]
    start: int = 0
    start_prefix: str = ""
    padding: Padding = field(default_factory=Padding)
    # The family's reference-image preprocessing, path -> (3, h̄, w̄) float32 as the engine hands
    # it to the tower; None: a text-only family (the tower is dropped at load).
    image_preprocess: Callable | None = None
    # sample -> what image_preprocess takes for each of its pictures; None: its image paths (a
    # family that sizes a picture by more than its file hands its own: Qwen Image 2.1's render)
    vision_inputs: Callable | None = None


def read_config(root: Path) -> dict:
    """The snapshot's config.json, refused unless it is a Qwen3 or Qwen3-VL config."""
    root = Path(root)
    path = root / "config.json"
    if not root.is_dir():
        raise UserError(f"the teacher snapshot {root} does not exist; download it or set "
                        "materials.teacher.path.")
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(f"{path} is missing; download the teacher snapshot again.") from None
    except ValueError:
        raise UserError(f"{path} is not valid JSON; download the teacher snapshot again.") from None
    if config.get("model_type") not in ARCHITECTURES:
        raise UserError(f"{path} is a {config.get('model_type')!r} config, not Qwen3 or Qwen3-VL; "
                        "point materials.teacher.path at the family's text encoder snapshot.")
    return config


def text_config(config: dict) -> dict:
    return config["text_config"] if config["model_type"] == "qwen3_vl" else config


def check_layout(config: dict, layout: TapLayout, what: str = "the teacher") -> None:
    """Every tap must be a decoder layer of this teacher (UserError naming the deepest tap)."""
    layers = int(text_config(config)["num_hidden_layers"])
    if layout.taps and max(layout.taps) > layers:
        raise UserError(f"{what} has {layers} decoder layers but the family taps layer "
                        f"{max(layout.taps)}; use the family's own text encoder snapshot.")


class QwenTapTeacher:
    """See the module docstring. `student_pieces(sample, counts)` is the pack's template in the
    engine's pieces; the teacher builds its ids with its own tokenizer and the layout's pads and
    refuses ids that differ from the student's (the engine feeds both the same ids)."""

    is_mock = False

    def __init__(self, text, tokenizer, device, student_pieces: Callable, layout: TapLayout,
                 identity: dict, visual=None, mode: str | None = None):
        import torch

        self.text, self.tokenizer, self.visual = text, tokenizer, visual
        self.device = torch.device(device)
        # offload.TEACHER_MODES; None: resident where `device` is
        self.mode = mode or ("gpu" if self.device.type == "cuda" else "cpu")
        self.dtype = next(text.parameters()).dtype
        self.student_pieces, self.layout = student_pieces, layout
        self.identity = identity
        self.hidden = int(text.config.hidden_size)
        self.out_dim = self.hidden * max(1, len(layout.taps))
        self._encode = engine_bpe(tokenizer).encode

    def lengths(self, samples: Sequence, student_ids: Sequence[Sequence[int]]) -> list[int]:
        return [len(ids) for ids in student_ids]

    def template_ids(self, sample, counts: Sequence[int] = ()) -> list[int]:
        """The family's padded template ids for `sample` (its images of `counts` vision rows)
        with this teacher's tokenizer."""
        pieces = self.student_pieces(sample, tuple(counts))
        return self.layout.padding.apply(engine_ids(self._encode, pieces))

    def _ids(self, sample, student_ids: Sequence[int], counts: Sequence[int] = ()) -> list[int]:
        ids = self.template_ids(sample, counts)
        if list(ids) != list(student_ids):
            raise UserError(
                "the teacher's and the student's tokenizers give different ids for the same "
                "template; use the pig_clip tokenizer folder with a Qwen3 / Qwen3-VL teacher "
                "(both are the Qwen vocabulary)."
            )
        return ids

    def targets(self, samples: Sequence, student_ids: Sequence[Sequence[int]], vision=None) -> list:
        """Per sample the tap stack of every template row (L, n * hidden), pads included."""
        import torch

        from .base import TargetRows

        if vision and any(vision):
            if self.visual is None:
                raise UserError(
                    "this family's teacher is text-only; the corpus has reference images."
                )
            return self._image_targets(samples, student_ids, vision)
        ids = [self._ids(s, sid) for s, sid in zip(samples, student_ids)]
        width = max(len(x) for x in ids)
        pad = self.layout.padding
        input_ids = torch.full((len(ids), width), PAD_ID, dtype=torch.long)
        keep = torch.zeros(len(ids), width, dtype=torch.long)
        pos = torch.arange(width).repeat(len(ids), 1)
        for b, row in enumerate(ids):
            input_ids[b, : len(row)] = torch.tensor(row)
            keep[b, : pad.real_length(row)] = 1  # template pads and batch pads: masked keys
            at = pad.positions(row)
            if at is not None:
                pos[b, : len(at)] = torch.tensor(at)
        stack = self.run(input_ids, keep, pos)
        return [
            TargetRows(rows=stack[b, : len(row)].clone(), sup_start=self.layout.start)
            for b, row in enumerate(ids)
        ]

    def run(self, input_ids, keep, position_ids, **images) -> torch.Tensor:
        """(B, L) ids, key mask and positions -> (B, L, n * hidden) float32 on the CPU. With
        images (`_image_targets`): input_ids None and `inputs_embeds`, `visual_pos_masks`,
        `deepstack_visual_embeds` passed on to the text stack. Ids are embedded here (`_embed`),
        never by the stack: under offload its table is a RAM module outside the hooks."""
        import torch

        if input_ids is not None:
            images = {"inputs_embeds": self._embed(input_ids)}
        taps = self.layout.taps
        caught: dict[int, torch.Tensor] = {}
        hooks = []
        layers = self.text.layers
        for k in taps:
            # the input of the next layer (of the final norm after the last): layer k's output
            # with its deepstack rows added, where the engine takes tap k (llm.hpp 1779-1796)
            after = layers[k] if k < len(layers) else self.text.norm

            def hook(_module, args, kwargs, k=k):
                x = args[0] if args else kwargs["hidden_states"]
                caught[k] = x.float().cpu()

            hooks.append(after.register_forward_pre_hook(hook, with_kwargs=True))
        try:
            with torch.inference_mode():
                out = self.text(
                    attention_mask=keep.to(self.device),
                    position_ids=position_ids.to(self.device),
                    use_cache=False,
                    **images,
                )
        finally:
            for h in hooks:
                h.remove()
        if not taps:
            return out.last_hidden_state.float().cpu()
        return torch.cat([caught[k] for k in taps], dim=-1)  # ascending: the engine's stack order

    def _embed(self, ids) -> torch.Tensor:
        """Token ids -> their embedding rows on the compute device, gathered where the table
        sits: offload keeps it in RAM (offload.stream_offload), so only the rows travel."""
        table = self.text.embed_tokens.weight
        return table[ids.to(table.device)].to(self.device, self.dtype)

    # -- reference images (layouts with image_preprocess) -----------------------------------

    def vision(self, images: Sequence) -> list[torch.Tensor]:
        """The tower's main merger rows (n_i, hidden) float32 on the CPU per picture, in order:
        what the engine hands the student (through vision_proj) and the adapter (vis_in)."""
        return self._tower(images, full=False)

    def embed_table(self) -> torch.Tensor:
        """The token embedding table as float32 on the CPU (the vision_proj fit)."""
        return self.text.embed_tokens.weight.detach().float().cpu()

    def _tower(self, images: Sequence, full: bool = True) -> list:
        """Per picture its main rows, or (main rows, [deepstack rows per merger], (gh, gw))."""
        if self.visual is None:
            raise UserError("this family's teacher is text-only; the corpus has reference images.")
        return run_tower(self.visual, images, self.layout.image_preprocess, self.device,
                         self.dtype, full)

    def _image_targets(self, samples, student_ids, vision) -> list:
        """The image path of `targets`: per sample its pictures through the tower again (the
        deepstack rows are not kept between calls), spliced where the engine splices them."""
        import torch

        from .base import TargetRows

        ids, towers = [], []
        for sample, sid, segs in zip(samples, student_ids, vision):
            inputs = self.layout.vision_inputs(sample) if self.layout.vision_inputs else None
            tower = self._tower(sample.images if inputs is None else inputs) if segs else []
            counts = [seg.rows.shape[0] for seg in segs]
            if [t[0].shape[0] for t in tower] != counts:
                raise UserError(
                    "the teacher's vision rows do not match the stored image runs; rebuild the "
                    "shards (precompute) with this teacher."
                )
            ids.append(self._ids(sample, sid, counts))
            towers.append(tower)
        width = max(len(x) for x in ids)
        embeds = torch.zeros(len(ids), width, self.hidden, dtype=self.dtype, device=self.device)
        keep = torch.zeros(len(ids), width, dtype=torch.long)
        pos = torch.zeros(3, len(ids), width, dtype=torch.long)
        visual = torch.zeros(len(ids), width, dtype=torch.bool)
        n_deep = max((len(t[1]) for tower in towers for t in tower), default=0)
        deep: list[list] = [[] for _ in range(n_deep)]
        for b, (row, segs, tower) in enumerate(zip(ids, vision, towers)):
            e = self._embed(torch.tensor(row, dtype=torch.long))
            placed = []
            for seg, (main, ds, (gh, gw)) in zip(segs, tower):
                n = main.shape[0]
                if any(t != IMAGE_PAD_ID for t in row[seg.start : seg.start + n]):
                    raise UserError(
                        f"an image run of {n} rows is not at row {seg.start} of the template; "
                        "rebuild the shards (precompute)."
                    )
                e[seg.start : seg.start + n] = main.to(self.device, self.dtype)
                visual[b, seg.start : seg.start + n] = True
                for k, d in enumerate(ds):
                    deep[k].append(d)
                placed.append((seg.start, gh, gw))
            embeds[b, : len(row)] = e
            keep[b, : self.layout.padding.real_length(row)] = 1
            pos[:, b] = torch.tensor(mrope_positions(width, placed))
        images = {
            "inputs_embeds": embeds,
            "visual_pos_masks": visual.to(self.device),
            # rows in the order visual_pos_masks selects them: sample by sample, row by row
            "deepstack_visual_embeds": [
                torch.cat(d).to(self.device, self.dtype) for d in deep
            ] or None,
        }
        stack = self.run(None, keep, pos, **images)
        return [
            TargetRows(rows=stack[b, : len(row)].clone(), sup_start=self.layout.start)
            for b, row in enumerate(ids)
        ]

    def close(self) -> None:
        import torch

        self.text = self.visual = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def text_stack_params(root: Path, tower: bool = False) -> int:
    """Parameters of the snapshot's text stack (no LM head; the vision tower only with `tower`),
    from the weight headers alone; UserError naming a missing or broken shard."""
    from .t5 import _numel, read_safetensors_header

    root = Path(root)
    files = weight_files(root)
    n = 0
    for name in files:
        if not (root / name).is_file():
            raise UserError(
                f"{root / name} is missing (named by the weight index); run the download again."
            )
        for tensor, info in read_safetensors_header(root / name).items():
            skip = ("lm_head.",) if tower else ("lm_head.", "model.visual.", "visual.")
            if not tensor.startswith(skip):
                n += _numel(info["shape"])
    return n


def check_start(tokenizer, layout: TapLayout, family: str) -> None:
    """The family's start row must be its prefix's token count (the engine hard-codes 34 for
    Krea2); UserError naming the family otherwise."""
    if not layout.start_prefix:
        return
    n = len(engine_ids(engine_bpe(tokenizer).encode, [Piece(layout.start_prefix)]))
    if n != layout.start:
        raise UserError(
            f"the {family} template prefix is {n} tokens with this tokenizer, but ggk drops "
            f"{layout.start} rows; use the Qwen tokenizer files of the family's teacher."
        )


def load_tap_teacher(
    root: Path, device, student_pieces: Callable, layout: TapLayout, family: str = "the family",
    mode: str | None = None, ram_limit_gib: float = 0.0,
) -> QwenTapTeacher:
    """Check the snapshot's config, the template start and, where `mode` keeps the weights in
    RAM (offload: bf16, cpu: fp32), that they fit `ram_limit_gib` (0 = no limit); then load the
    text stack (and the tower for an image layout) placed as the planner's `mode` says
    (offload.py: gpu resident, offload streamed through the card, cpu in fp32). `mode` None:
    resident where `device` is."""
    import torch
    from transformers import AutoModel

    from gguf_trainer.model.student import load_tokenizer

    from .t5 import _quiet_progress

    root = Path(root)
    config = read_config(root)
    check_layout(config, layout, f"the {family} teacher")
    mode = mode or ("gpu" if torch.device(device).type == "cuda" else "cpu")
    device = teacher_device(mode, device)
    if mode in ("offload", "cpu") and ram_limit_gib:
        tower = layout.image_preprocess is not None
        need = text_stack_params(root, tower) * (4 if mode == "cpu" else 2) / 1024**3
        if need > ram_limit_gib:
            raise UserError(
                f"the {family} teacher needs {need:.1f} GiB of RAM in teacher mode {mode} but "
                f"only {ram_limit_gib:.1f} GiB is available; use a CUDA card, raise "
                "precompute.cpu_mem_gib, or close other programs."
            )
    if not (root / "tokenizer.json").is_file():
        raise UserError(
            f"{root / 'tokenizer.json'} is missing; download the teacher snapshot again."
        )
    tokenizer = load_tokenizer(root)
    check_start(tokenizer, layout, family)
    dtype = weights_dtype(mode, device)
    with _quiet_progress():
        model = AutoModel.from_pretrained(str(root), dtype=dtype)
    text = getattr(model, "language_model", model)
    visual = getattr(model, "visual", None) if layout.image_preprocess is not None else None
    if text is not model and visual is None:
        model.visual = None  # text-only families: the tower never runs
    if layout.image_preprocess is not None and visual is None:
        raise UserError(f"{root} is a text-only snapshot, but {family} edits show the reference "
                        "images to Qwen3-VL's vision tower; use the family's Qwen3-VL snapshot.")
    text.eval().requires_grad_(False)
    if visual is not None:
        visual.eval().requires_grad_(False)
    # the forward pre-hooks of `run` go on after this: they see each layer's input whether the
    # stack is resident or streamed (accelerate wraps forward, torch calls hooks around it)
    place(text, visual, device, mode)
    identity = {
        "teacher": config["model_type"],
        "taps": list(layout.taps),
        "padding": [
            layout.padding.min_length,
            layout.padding.multiple,
            layout.padding.max_length,
            layout.padding.pad_position,
        ],
        **({"vision": "deepstack+mrope"} if visual is not None else {}),
    }
    log.info(
        "teacher: %s, %d layers, hidden %d; taps %s; mode %s on %s as %s",
        ARCHITECTURES[config["model_type"]],
        text.config.num_hidden_layers,
        text.config.hidden_size,
        list(layout.taps) or "final norm",
        mode,
        device,
        dtype,
    )
    return QwenTapTeacher(text, tokenizer, device, student_pieces, layout, identity, visual, mode)
