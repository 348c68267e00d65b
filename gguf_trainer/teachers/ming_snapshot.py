"""The Ming-Image teacher as precompute drives it: a snapshot read into teachers/ming.py's
MingTextEncoder, the Ling slot ids of each prompt (engine/ling_bpe.py over the snapshot's own
mllm/tokenizer.json, the vocabulary the adapter GGUF then carries), and one TargetRows per sample
in the engine's output layout: the 256 caption rows zero-padded to the direct width, then one
direct row per Ling token (ming_image_te.hpp 725-726, llm_adapter.hpp 594-598), so row j of the
targets is row j of what the adapter emits.

Snapshot layouts:
  * gguf-trainer's own (tiny/ming.py, the demo and the tests): `ming_config.json` (MingConfig's
    fields), `ming_te.safetensors` (the module's state dict, the engine's names) and
    `mllm/tokenizer.json`;
  * the released inclusionAI/Ming-Image-0.1-Design (mllm/, connector/, mlp/): its three
    config.json give the MingConfig and its shards are mapped onto the engine's names
    (teachers/ming_release.py); it runs in the dtype it is stored in (bf16 for the release).

    teacher = load_ming_teacher(root, device, max_slots=1280)
    rows = teacher.targets(samples, student_ids)       # [TargetRows(rows [256 + P, D], seed_ids)]
"""

from __future__ import annotations

import json
import logging
from dataclasses import fields
from pathlib import Path

from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.ling_bpe import EngineLingBPE, ming_prompt_ids

log = logging.getLogger(__name__)

CONFIG_FILE = "ming_config.json"
WEIGHTS_FILE = "ming_te.safetensors"
TOKENIZER_FILE = "mllm/tokenizer.json"
PAD_SLOT = -1  # seed_ids past a sample's slots (slot_resampler.PAD_SLOT)


def read_tokenizer(root: Path) -> str:
    path = Path(root) / TOKENIZER_FILE
    try:
        text = path.read_text(encoding="utf-8")
        json.loads(text)["model"]["vocab"]
    except FileNotFoundError:
        raise UserError(f"{path} is missing; download the teacher snapshot again.") from None
    except (ValueError, KeyError, TypeError):
        raise UserError(f"{path} is not a BPE tokenizer.json; download the teacher snapshot "
                        "again.") from None
    return text


def read_config(root: Path):
    """MingConfig of either layout; one sentence for anything else."""
    from gguf_trainer.teachers.ming import MingConfig
    from gguf_trainer.teachers.ming_release import is_released, released_config

    root = Path(root)
    path = root / CONFIG_FILE
    if not path.is_file():
        if is_released(root):
            return released_config(root)
        raise UserError(f"{root} holds no Ming-Image teacher ({CONFIG_FILE} or "
                        "mllm/config.json); download it or set materials.teacher.path.")
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
        known = {f.name for f in fields(MingConfig)}
        cfg = MingConfig(**{k: tuple(v) if isinstance(v, list) else v
                            for k, v in data.items() if k in known})
    except (ValueError, TypeError):
        raise UserError(f"{path} is not a Ming-Image config; download the teacher "
                        "again.") from None
    return cfg


class MingTeacher:
    """`tower`: the release's Qwen2.5-VL tower + linear_proj (ming_vision.py) for an edit's
    reference, or None (a snapshot without one: text only)."""

    is_mock = False

    def __init__(self, model, bpe: EngineLingBPE, device, max_slots: int, identity: dict,
                 tower=None):
        self.model, self.bpe, self.device = model, bpe, device
        self.max_slots, self.identity = max_slots, identity
        self.tower = tower
        self.vis_dim = int(model.cfg.hidden) if tower is not None else 0

    def slot_ids(self, sample, n_image: int = 0) -> list[int]:
        return ming_prompt_ids(self.bpe, sample.text, n_image)[0]

    def lengths(self, samples, student_ids, vision=None) -> list[int]:
        vision = vision or [()] * len(samples)
        return [len(self.slot_ids(s, sum(g.rows.shape[0] for g in segs or ())))
                for s, segs in zip(samples, vision)]

    def vision(self, images) -> list:
        """The tower's unit rows (n_i, hidden) per reference path, `.grid` on each."""
        from .ming_vision import encode_paths

        if self.tower is None:
            raise UserError("this Ming-Image snapshot has no vision tower (mllm vision_config "
                            "and vision.* tensors); download the release again or build the "
                            "corpus without reference images.")
        return encode_paths(self.tower, images, next(self.tower.parameters()).device)

    def vision_segments(self, rows) -> list:
        """The first reference only, on its <imagePatch> run (the engine shows Ming's text
        encoder one reference and ignores the rest, conditioner.hpp 4059-4062)."""
        from .qwen35 import SlotSegment

        if not rows:
            return []
        start = ming_prompt_ids(self.bpe, "", rows[0].shape[0])[1]
        return [SlotSegment(start, rows[0], rows[0].grid)]

    def targets(self, samples, student_ids, vision=None) -> list:
        import torch

        from .base import TargetRows

        vision = vision or [()] * len(samples)
        ids = [self.slot_ids(s, sum(g.rows.shape[0] for g in segs or ()))
               for s, segs in zip(samples, vision)]
        if max(len(x) for x in ids) > self.max_slots:
            raise UserError(f"a prompt is over {self.max_slots} Ling tokens, more than the "
                            "adapter's slots; precompute drops such samples (max_len_teacher).")
        images = [(segs[0].rows, segs[0].start, *segs[0].grid) if segs else None
                  for segs in vision]
        with torch.inference_mode():
            out = self.model(ids, images=images if any(images) else None)
        cfg = self.model.cfg
        rows = []
        for b, row in enumerate(ids):
            cap = out.caption[b].float().cpu()
            cap = torch.nn.functional.pad(cap, (0, cfg.diffusion_dim - cfg.caption_dim))
            rows.append(TargetRows(rows=torch.cat([cap, out.direct[b].float().cpu()]),
                                   seed_ids=row + [PAD_SLOT] * (self.max_slots - len(row))))
        return rows

    def embed_table(self):
        return self.model.thinker.embed_tokens.weight.detach().float().cpu()

    def close(self) -> None:
        self.model = None


def _tower(root: Path, dtype, device):
    """The release's tower + linear_proj on `device` (~0.7 GB), or None when its mllm config
    has no vision_config (references then get one sentence)."""
    from gguf_trainer.teachers.ming_release import MLLM, _json

    if not isinstance(_json(Path(root) / MLLM / "config.json").get("vision_config"), dict):
        return None
    from .ming_vision import load_ming_vision

    return load_ming_vision(root, dtype).to(device)


def embed_table(root: Path):
    """The Ling embedding table of either layout (float32, for the seed PCA)."""
    from safetensors import safe_open

    from gguf_trainer.teachers.ming_release import is_released, released_embed_table

    root = Path(root)
    if is_released(root) and not (root / CONFIG_FILE).is_file():
        return released_embed_table(root).float()
    try:
        with safe_open(str(root / WEIGHTS_FILE), "pt") as f:
            return f.get_tensor("thinker.embed_tokens.weight").float()
    except FileNotFoundError:
        raise UserError(f"{root / WEIGHTS_FILE} is missing; download the teacher "
                        "again.") from None


def _own_state(root: Path):
    """gguf-trainer's own layout: the whole state in one file (engine names, fp32)."""
    from safetensors.torch import load_file

    try:
        return load_file(str(root / WEIGHTS_FILE))
    except FileNotFoundError:
        raise UserError(f"{root / WEIGHTS_FILE} is missing; download the teacher "
                        "again.") from None


def _check_shapes(wanted: dict, shapes: dict, source) -> None:
    missing = sorted(set(wanted) - set(shapes))
    if missing:
        raise UserError(f"{source} lacks {missing[0]} (and {len(missing) - 1} more); download "
                        "the teacher again.")
    wrong = [k for k, v in wanted.items() if tuple(shapes[k]) != tuple(v.shape)]
    if wrong:
        raise UserError(f"{source}: {wrong[0]} is {tuple(shapes[wrong[0]])}, not the "
                        f"config's {tuple(wanted[wrong[0]].shape)}; download the teacher again.")


def _load_released(model, root: Path, cfg, device, stream: bool):
    """The release into `model` (built on meta) in its stored dtype: the resident parts on
    `device`, then every layer read onto `device` one at a time (whole), or left on meta and
    read for each forward (stream: teachers/ming_stream.py). Shapes come from the headers
    first, so a broken snapshot is one sentence before any layer loads."""
    from gguf_trainer.teachers.ming_release import ReleasedWeights, stored_dtype
    from gguf_trainer.teachers.ming_stream import STACKS, stream_layers

    dtype = stored_dtype(root)
    weights = ReleasedWeights(root, cfg)
    resident = weights.resident(dtype, device)
    shapes = {k: tuple(v.shape) for k, v in resident.items()}
    for stack in STACKS:
        for i in range(len(getattr(model, stack).layers)):
            shapes.update({f"{stack}.layers.{i}.{k}": v
                           for k, v in weights.layer_shapes(stack, i).items()})
    wanted = model.state_dict()
    _check_shapes(wanted, shapes, root)
    model.load_state_dict({k: resident[k] for k in wanted if k in resident}, strict=False,
                          assign=True)
    del resident
    if stream:
        stream_layers(model, weights, dtype, device)
        return dtype
    for stack in STACKS:
        for i, layer in enumerate(getattr(model, stack).layers):
            layer.load_state_dict(weights.layer(stack, i, dtype, device), assign=True)
    return dtype


def load_ming_teacher(root: Path, device, max_slots: int, *, mode: str | None = None,
                      is_mock: bool = False):
    """Check config and vocabulary, then load the text encoder: gguf-trainer's layout in fp32,
    the release in the dtype it is stored in. `mode`, the planner's (teachers/offload.py):
    gpu = resident on the card; offload and cpu = the release's layers streamed from its
    shards through `device` (the card, or the CPU), one at a time (ming_stream.py); None =
    resident on `device`. gguf-trainer's own layout (a tiny teacher) is always resident."""
    import torch

    from gguf_trainer.teachers.ming import MingTextEncoder, check_config
    from gguf_trainer.teachers.offload import teacher_device

    root = Path(root)
    cfg = read_config(root)
    problems = check_config(cfg)
    if problems:
        raise UserError(f"{root}: {problems[0]}.")
    bpe = EngineLingBPE(read_tokenizer(root))
    if mode is not None:
        device = teacher_device(mode, device)
    released = not (root / CONFIG_FILE).is_file()  # read_config accepted it: the release
    stream = released and mode in ("offload", "cpu")
    with torch.device("meta"):
        model = MingTextEncoder(cfg)
    if released:
        dtype = _load_released(model, root, cfg, device, stream)
    else:
        state, dtype = _own_state(root), torch.float32
        wanted = model.state_dict()
        _check_shapes(wanted, {k: v.shape for k, v in state.items()}, root / WEIGHTS_FILE)
        model.load_state_dict({k: state[k].to(dtype) for k in wanted}, assign=True)
        del state
        model = model.to(device)
    model = model.eval().requires_grad_(False)
    identity = {"teacher": "ming_image", "layers": cfg.layers, "hidden": cfg.hidden,
                "rows": "caption+directvlm", "max_slots": max_slots}
    log.info("teacher: Ming-Image text encoder, %d Bailing layers (%d experts), connector %d x "
             "%d; caption %d + direct %d wide, %s on %s%s", cfg.layers, cfg.experts,
             cfg.conn_layers, cfg.conn_hidden, cfg.caption_dim, cfg.diffusion_dim,
             str(dtype).removeprefix("torch."), device,
             "; layers streamed from the shards, one at a time" if stream else "")
    tower = _tower(root, dtype, device) if released else None
    teacher = MingTeacher(model, bpe, torch.device(device), max_slots, identity, tower)
    teacher.is_mock = is_mock
    return teacher
