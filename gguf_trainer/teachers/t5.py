"""The T5 packs' real teacher (PixArt, Chroma, Wan: packs/t5_seeded.py): the T5 v1.1 or UMT5
encoder (`last_hidden_state`) in the family's mask mode, and the T5 window ids that seed the
adapter's queries.

Owns: the seed ids (T5 sentencepiece ids + EOS 1, right-padded with PAD 0 to the caption
window, too long -> cut with the last id forced to EOS: the sequence ggk's
`PixArtT5Embedder` builds, engine contract §3.3), the header-only check of a snapshot
(tensor names and shapes from the safetensors headers, no weights read), loading the
encoder resident (`gpu`), streamed layer by layer from RAM (`offload`) or on the CPU
(`cpu`), and batched targets. Must not: know projects, settings or the planner (the pack's
hook passes the resolved snapshot folder and the mode the planner chose).

Tokenizer: the engine's own unigram encoder (t5_unigram.py, a port of ggk's
T5UniGramTokenizer) over the pieces and scores of the snapshot's `spiece.model`, applied to
each weight chunk of the prompt as PixArtT5Embedder does (template_ids.py). Not sentencepiece's
`EncodeAsIds`: that applies NFKC and merges runs of unknown characters, which the engine does
not (only runs of spaces are collapsed), so `…`, full-width text, CJK and the empty prompt
(engine: `▁` + EOS = [3, 1]) got other ids. The teacher runs T5 over exactly these ids.

    check_snapshot(root)                                  # SnapshotReport, or a UserError
    teacher = load_t5_teacher(root, device, mode="gpu")   # mode: gpu | offload | cpu
    rows = teacher.targets(["a red fox"])                 # [TargetRows(rows [n, d_model],
                                                          # seed_ids)]
    teacher.close()
"""

from __future__ import annotations

import contextlib
import gc
import json
import logging
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.t5_unigram import T5Unigram
from gguf_trainer.engine.template_ids import Piece, template_ids

from .offload import stream_offload, teacher_device, weights_dtype

if TYPE_CHECKING:  # pragma: no cover
    import torch

log = logging.getLogger(__name__)

PAD_ID = 0
EOS_ID = 1
T5_VOCAB = 32128  # rows of T5 v1.1's embedding table (32000 pieces + 100 sentinels, rounded up)
# caption_length = the DiT's caption_projection.y_embedding ne[1] (contract §3.3). The engine
# does not adapt the window to the adapter on PixArt: num_queries must equal it (contract §4).
CAPTION_LENGTHS = {120: "PixArt-α", 300: "PixArt-Σ"}
# T5CLIPEmbedder (Chroma, Wan): chunk_len 512 (conditioner.hpp:1199); with an adapter the engine
# takes its num_queries as the window and warns when they differ (conditioner.hpp:1240-1245).
T5CLIP_WINDOWS = {512: "Chroma / Wan (the T5CLIPEmbedder window)"}
ENCODER_TYPES = ("t5", "umt5")  # config.json model_type: T5EncoderModel / UMT5EncoderModel

SPIECE = "spiece.model"
CONFIG = "config.json"
SINGLE_WEIGHTS = "model.safetensors"
WEIGHTS_INDEX = "model.safetensors.index.json"


def check_window(window: int, lengths: Mapping[int, str] = CAPTION_LENGTHS) -> int:
    """The window the engine builds for the family (`lengths`: PixArt's caption lengths, or
    T5CLIP_WINDOWS for Chroma and Wan); anything else is refused."""
    if window not in lengths:
        known = ", ".join(f"{n} ({name})" for n, name in lengths.items())
        raise UserError(
            f"a T5 window of {window} slots is not one the engine builds: the DiT takes "
            f"exactly that many rows and the adapter's num_queries must equal it; "
            f"use {known}."
        )
    return window


# ---------------------------------------------------------------- seed ids


def window_ids(pieces: Sequence[int], window: int) -> list[int]:
    """`pieces` + EOS, right-padded with PAD to `window`; too long -> the first window-1 pieces
    and EOS (the engine's pad_tokens: truncate, then force the last id to EOS)."""
    ids = list(pieces[: window - 1]) + [EOS_ID]
    return ids + [PAD_ID] * (window - len(ids))


def real_length(ids: Sequence[int]) -> int:
    """Real slots of a window (the pieces and EOS): the engine's DiT mask is `id != 0`."""
    return sum(1 for i in ids if i != PAD_ID)


def _load_spm(path: Path):
    import sentencepiece as spm

    if not path.is_file():
        raise UserError(
            f"{path} is missing: the T5 tokenizer model of the teacher snapshot; download "
            "the snapshot again (it ships spiece.model) or set materials.teacher.path to it."
        )
    proc = spm.SentencePieceProcessor()
    try:
        proc.Load(str(path))
    except (OSError, RuntimeError) as e:
        raise UserError(
            f"{path} is not a sentencepiece model ({e}); download the teacher snapshot again."
        ) from None
    if proc.pad_id() != PAD_ID or proc.eos_id() != EOS_ID:
        raise UserError(
            f"{path} is not a T5 tokenizer (pad id {proc.pad_id()}, eos id {proc.eos_id()}; "
            "T5 uses "
            f"pad {PAD_ID} and eos {EOS_ID}); point materials.teacher.path at a T5 v1.1 snapshot."
        )
    return proc


class SeedTokenizer:
    """T5 window ids for prompts, from the snapshot's `spiece.model`."""

    def __init__(
        self,
        spiece: Path,
        window: int = 120,
        vocab_limit: int = T5_VOCAB,
        windows: Mapping[int, str] = CAPTION_LENGTHS,
    ):
        self.window = check_window(window, windows)
        self.path = Path(spiece)
        self.sp = _load_spm(self.path)
        if self.sp.get_piece_size() > vocab_limit:
            raise UserError(
                f"{self.path} has {self.sp.get_piece_size()} pieces, more than the adapter's "
                f"{vocab_limit}-row seed table; use the T5 v1.1 tokenizer."
            )
        self.unigram = T5Unigram.from_spm(self.path)

    def pieces(self, text: str) -> list[int]:
        """The engine's T5 ids of the prompt's weight chunks, each encoded on its own."""
        return template_ids(self.unigram.encode, [Piece(text, prompt=True)])

    def seed_ids(self, text: str) -> list[int]:
        return window_ids(self.pieces(text), self.window)

    def is_truncated(self, text: str) -> bool:
        return len(self.pieces(text)) + 1 > self.window


# ---------------------------------------------------------------- snapshot check (headers only)


@dataclass
class SnapshotReport:
    """What a header-only check of a T5 encoder snapshot found."""

    root: Path
    config: dict
    weight_files: list[str]
    n_tensors: int  # encoder tensors checked
    n_params: int  # encoder parameters
    weight_bytes: int  # bytes of the encoder tensors as stored
    dtypes: list[str]
    spm_pieces: int
    notes: list[str] = field(default_factory=list)

    def summary(self) -> str:
        c = self.config
        params = (
            f"{self.n_params / 1e9:.2f}B" if self.n_params >= 1e8 else f"{self.n_params / 1e6:.2f}M"
        )
        return (
            f"T5 encoder: {c.get('num_layers')} blocks, d_model {c.get('d_model')}, "
            f"{params} parameters ({'/'.join(self.dtypes)}, "
            f"{self.weight_bytes / 1024**3:.2f} GiB) in {len(self.weight_files)} file(s); "
            f"tokenizer {self.spm_pieces} pieces"
        )


def expected_encoder_tensors(config: Mapping[str, Any]) -> dict[str, tuple[int, ...]]:
    """Name -> shape of every tensor `T5EncoderModel` loads, from config.json alone.
    `shared.weight` (the embedding) may be stored as `encoder.embed_tokens.weight` instead."""
    d, heads, d_kv, d_ff = (int(config[k]) for k in ("d_model", "num_heads", "d_kv", "d_ff"))
    inner, n_layers = heads * d_kv, int(config["num_layers"])
    gated = str(config.get("feed_forward_proj", "relu")).startswith("gated-")
    out: dict[str, tuple[int, ...]] = {
        "shared.weight": (int(config["vocab_size"]), d),
        "encoder.final_layer_norm.weight": (d,),
    }
    buckets = int(config.get("relative_attention_num_buckets", 32))
    for i in range(n_layers if config.get("model_type") == "umt5" else 1):  # UMT5: one per block
        out[f"encoder.block.{i}.layer.0.SelfAttention.relative_attention_bias.weight"] = (
            buckets,
            heads,
        )
    for i in range(n_layers):
        b = f"encoder.block.{i}.layer"
        for proj in "qkv":
            out[f"{b}.0.SelfAttention.{proj}.weight"] = (inner, d)
        out[f"{b}.0.SelfAttention.o.weight"] = (d, inner)
        out[f"{b}.0.layer_norm.weight"] = (d,)
        for name in ("wi_0", "wi_1") if gated else ("wi",):
            out[f"{b}.1.DenseReluDense.{name}.weight"] = (d_ff, d)
        out[f"{b}.1.DenseReluDense.wo.weight"] = (d, d_ff)
        out[f"{b}.1.layer_norm.weight"] = (d,)
    return out


def read_safetensors_header(path: Path) -> dict[str, dict]:
    """The tensor table of a .safetensors file (8-byte length + JSON), checking that the file
    holds every byte the table points at (a cut download fails here, in milliseconds)."""
    size = path.stat().st_size
    with open(path, "rb") as f:
        head = f.read(8)
        n = struct.unpack("<Q", head)[0] if len(head) == 8 else -1
        if n < 2 or 8 + n > size:
            raise UserError(
                f"{path} is not a complete safetensors file ({size} bytes); download it again."
            )
        try:
            table = json.loads(f.read(n))
        except (UnicodeDecodeError, json.JSONDecodeError):
            raise UserError(
                f"{path} has an unreadable safetensors header; download it again."
            ) from None
    table.pop("__metadata__", None)
    end = max((int(t["data_offsets"][1]) for t in table.values()), default=0)
    if 8 + n + end > size:
        raise UserError(
            f"{path} is cut short ({size} of {8 + n + end} bytes): the download did not finish; "
            "run the download again (it resumes)."
        )
    return table


def _weight_files(root: Path) -> list[str]:
    index = root / WEIGHTS_INDEX
    if index.is_file():
        try:
            names = sorted(
                set(json.loads(index.read_text(encoding="utf-8"))["weight_map"].values())
            )
        except (ValueError, KeyError, AttributeError):
            raise UserError(
                f"{index} is not a weight index (no weight_map); download the snapshot again."
            ) from None
        for name in names:
            if not (root / name).is_file():
                raise UserError(
                    f"{root / name} is missing: {WEIGHTS_INDEX} names it as a "
                    "shard of the T5 weights; "
                    "run the download again (it resumes) or copy the shard there."
                )
        return names
    if (root / SINGLE_WEIGHTS).is_file():
        return [SINGLE_WEIGHTS]
    raise UserError(
        f"{root} has no {SINGLE_WEIGHTS} (nor {WEIGHTS_INDEX}): the T5 weights are missing; "
        "run the download again or set materials.teacher.path to the snapshot folder."
    )


def read_config(root: Path) -> dict:
    path = root / CONFIG
    try:
        config = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise UserError(
            f"{path} is missing: the T5 snapshot needs its config.json; download it again."
        ) from None
    except ValueError:
        raise UserError(f"{path} is not valid JSON; download the T5 snapshot again.") from None
    missing = [
        k
        for k in ("d_model", "num_heads", "d_kv", "d_ff", "num_layers", "vocab_size")
        if k not in config
    ]
    if config.get("model_type") not in ENCODER_TYPES or missing:
        raise UserError(
            f"{path} does not describe a T5 encoder (model_type {config.get('model_type')!r}"
            f"{', missing ' + ', '.join(missing) if missing else ''}); point "
            "materials.teacher.path "
            "at the callgg/t5-v1_1-xxl-encoder-bf16 snapshot."
        )
    return config


def check_snapshot(
    root: Path, vocab_limit: int = T5_VOCAB, spiece: Path | None = None
) -> SnapshotReport:
    """Everything a load would trip over, found from headers in seconds: config.json, the
    tokenizer, every weight shard present and complete, every encoder tensor named with the
    shape the config implies. Reads no weights. A UserError names the file to fix."""
    root = Path(root)
    if not root.is_dir():
        raise UserError(
            f"the T5 teacher snapshot {root} does not exist; download it or set "
            "materials.teacher.path."
        )
    config = read_config(root)
    spiece = Path(spiece) if spiece else root / SPIECE
    sp = _load_spm(spiece)
    if sp.get_piece_size() > min(vocab_limit, int(config["vocab_size"])):
        raise UserError(
            f"{spiece} has {sp.get_piece_size()} pieces but the encoder embeds "
            f"{config['vocab_size']} (seed table {vocab_limit}); the tokenizer "
            "and weights do not match."
        )
    files = _weight_files(root)
    found: dict[str, tuple[tuple[int, ...], str, str]] = {}
    for name in files:
        for tensor, info in read_safetensors_header(root / name).items():
            found[tensor] = (tuple(info["shape"]), info["dtype"], name)
    expected = expected_encoder_tensors(config)
    if "shared.weight" not in found and "encoder.embed_tokens.weight" in found:
        found["shared.weight"] = found["encoder.embed_tokens.weight"]  # tied: either name loads
    missing = [n for n in expected if n not in found]
    if missing:
        raise UserError(
            f"the T5 weights in {root} lack {len(missing)} encoder tensor(s), e.g. {missing[0]}; "
            "the snapshot is incomplete or not a T5 encoder checkpoint: download it again."
        )
    wrong = [(n, found[n][0], s) for n, s in expected.items() if found[n][0] != s]
    if wrong:
        n, got, want = wrong[0]
        raise UserError(
            f"{root / found[n][2]}: {n} has shape {list(got)} but config.json implies "
            f"{list(want)}; "
            "the weights and config.json come from different models: download the snapshot again."
        )
    sizes = {"BF16": 2, "F16": 2, "F32": 4, "F64": 8}
    n_params = sum(_numel(found[n][0]) for n in expected)
    n_bytes = sum(_numel(found[n][0]) * sizes.get(found[n][1], 4) for n in expected)
    return SnapshotReport(
        root=root,
        config=config,
        weight_files=files,
        n_tensors=len(expected),
        n_params=n_params,
        weight_bytes=n_bytes,
        dtypes=sorted({found[n][1] for n in expected}),
        spm_pieces=sp.get_piece_size(),
    )


def _numel(shape: Sequence[int]) -> int:
    n = 1
    for s in shape:
        n *= int(s)
    return n


# ---------------------------------------------------------------- memory (pure numbers)


def encoder_gib(n_params: int, mode: str) -> float:
    """Memory the encoder's weights take in `mode`: bf16 on the card (gpu) or in RAM (offload),
    fp32 in RAM for cpu (bf16 matmul on CPUs is hundreds of times slower)."""
    return n_params * (4 if mode == "cpu" else 2) / 1024**3


# ---------------------------------------------------------------- the encoder


@contextlib.contextmanager
def _quiet_progress():
    from transformers.utils import logging as hf_logging

    was_on = hf_logging.is_progress_bar_enabled()
    hf_logging.disable_progress_bar()
    try:
        yield
    finally:
        if was_on:
            hf_logging.enable_progress_bar()


def load_encoder(root: Path, device, mode: str):
    """`T5EncoderModel` from `root`, placed for `mode` and in eval mode:
    gpu      every weight resident on `device` (bf16);
    offload  weights in RAM (bf16), each module's weights copied to `device` just for its
             forward by accelerate hooks: ~0.25 GiB of VRAM for the XXL encoder;
    cpu      everything on the CPU in fp32."""
    from transformers import T5EncoderModel, UMT5EncoderModel

    device = teacher_device(mode, device)
    # bf16 on a card: what the snapshot stores and T5 v1.1 was trained in (fp16 overflows)
    dtype = weights_dtype(mode, device)
    kwargs = {"device_map": {"": str(device)}} if mode == "gpu" else {}
    with _quiet_progress():  # a tqdm bar per load would garble the pipeline log and CLI bars
        cls = UMT5EncoderModel if read_config(root)["model_type"] == "umt5" else T5EncoderModel
        model = cls.from_pretrained(str(root), dtype=dtype, **kwargs)
    model.eval().requires_grad_(False)
    if mode == "offload":
        stream_offload(model, device)
    return model


def encode_windows(
    model,
    windows: Sequence[Sequence[int]],
    device,
    trim: bool = True,
    masked: bool = True,
    pad_rows: int = 0,
) -> list[torch.Tensor]:
    """`last_hidden_state` at the real slots of each window, one [n_i, d_model] CPU tensor each.

    The batch runs right-padded with the attention mask; `trim` cuts it to the longest real
    length. Pads are masked keys (softmax weight exactly 0) and T5's position bias is relative,
    so real rows equal the per-prompt full-window run (`trim=False`, one window per call).
    `masked=False` is Chroma's default (chroma_use_t5_mask off): every slot of the whole window,
    pads included, is a key, so nothing is trimmed; `pad_rows` more rows after the real ones
    are returned (the pad slots the DiT still sees, chroma_t5_mask_pad)."""
    import torch

    if not masked:
        ids = torch.tensor([list(w) for w in windows], dtype=torch.long, device=device)
        with torch.inference_mode():
            hidden = model(input_ids=ids).last_hidden_state.cpu()
        return [
            hidden[i, : min(real_length(w) + pad_rows, len(w))].clone()
            for i, w in enumerate(windows)
        ]
    lens = [max(real_length(w), 1) for w in windows]
    width = max(lens) if trim else len(windows[0])
    ids = torch.tensor([list(w[:width]) for w in windows], dtype=torch.long, device=device)
    mask = (
        torch.arange(width, device=device)[None, :] < torch.tensor(lens, device=device)[:, None]
    ).long()
    with torch.inference_mode():
        hidden = model(input_ids=ids, attention_mask=mask).last_hidden_state
    hidden = hidden.cpu()
    return [hidden[i, :n].clone() for i, n in enumerate(lens)]


def _text(sample) -> str:
    """The prompt of a sample: a `samples.Sample` record (.text), a mapping with "text", or a
    plain string (tests, the benchmark)."""
    if isinstance(sample, str):
        return sample
    if isinstance(sample, Mapping):
        return sample["text"]
    return sample.text


class T5Teacher:
    """The real teacher of the T5 packs (see the module docstring)."""

    is_mock = False

    def __init__(
        self,
        model,
        tokenizer: SeedTokenizer,
        device,
        mode: str,
        identity: dict | None = None,
        masked: bool = True,
        pad_rows: int = 0,
    ):
        import torch

        self.model, self.tokenizer, self.mode = model, tokenizer, mode
        self.masked, self.pad_rows = masked, pad_rows  # encode_windows: Chroma's unmasked window
        self.device = torch.device(device) if mode != "cpu" else torch.device("cpu")
        self.window = tokenizer.window
        self.identity = identity or {"teacher": "t5_encoder", "window": self.window}
        self.n_truncated = 0
        self._ids: dict[str, tuple[list[int], bool]] = {}  # lengths() tokenizes, targets() reuses

    def _window(self, text: str) -> tuple[list[int], bool]:
        """(window ids, whether the prompt was cut to fit), cached between lengths and targets."""
        hit = self._ids.get(text)
        if hit is None:
            if len(self._ids) > 65536:
                self._ids.clear()
            pieces = self.tokenizer.pieces(text)
            hit = self._ids[text] = (window_ids(pieces, self.window), len(pieces) >= self.window)
        return hit

    def seed_ids(self, text: str) -> list[int]:
        return self._window(text)[0]

    def lengths(self, samples: Sequence, student_ids=None) -> list[int]:
        """Real T5 slots of each sample (its cost in a trimmed batch; unmasked: the window)."""
        if not self.masked:
            return [self.window] * len(samples)
        return [real_length(self.seed_ids(_text(s))) for s in samples]

    def targets(self, samples: Sequence, student_ids=None, vision=None) -> list:
        """One TargetRows per sample: the real rows (pieces + EOS) and the window ids. T5 reads
        text only; `vision` is part of the protocol for image-aware teachers."""
        from .base import TargetRows

        found = [self._window(_text(s)) for s in samples]
        windows, cut = [w for w, _ in found], sum(1 for _, was_cut in found if was_cut)
        if cut:
            if not self.n_truncated:
                log.info(
                    "prompts longer than the %d-slot T5 window are cut to it with EOS last, "
                    "as the engine cuts them (the student still reads the whole prompt)",
                    self.window,
                )
            self.n_truncated += cut
        rows = encode_windows(
            self.model, windows, self.device, masked=self.masked, pad_rows=self.pad_rows
        )
        return [TargetRows(rows=r, seed_ids=list(w)) for r, w in zip(rows, windows)]

    def close(self) -> None:
        """Free the encoder (the stage that opened the teacher calls this when it is done)."""
        import torch

        if self.n_truncated:
            log.info(
                "teacher: %d prompt(s) were longer than the %d-slot T5 window and were cut to it",
                self.n_truncated,
                self.window,
            )
        self.model = None
        gc.collect()
        if torch.cuda.is_available():
            torch.cuda.empty_cache()


def load_t5_teacher(
    root: Path,
    device,
    mode: str,
    window: int = 120,
    identity: dict | None = None,
    vocab_limit: int = T5_VOCAB,
    ram_limit_gib: float = 0.0,
    windows: Mapping[int, str] = CAPTION_LENGTHS,
    masked: bool = True,
    pad_rows: int = 0,
    spiece: Path | None = None,
) -> T5Teacher:
    """Check the snapshot from its headers (fails in seconds, before any weight loads), check
    that the weights fit `ram_limit_gib` in RAM when `mode` keeps them there (offload: bf16,
    cpu: fp32 — twice the snapshot; 0 = no limit), then load the tokenizer and the encoder.
    `windows`, `masked`, `pad_rows`: the family's window and mask mode (encode_windows);
    `spiece`: the tokenizer when it is not root/spiece.model (a diffusers layout)."""
    report = check_snapshot(Path(root), vocab_limit, spiece)
    need = encoder_gib(report.n_params, mode)
    if mode in ("offload", "cpu") and ram_limit_gib and need > ram_limit_gib:
        how = "fp32 on the CPU" if mode == "cpu" else "bf16, streamed to the card"
        raise UserError(
            f"the T5 encoder needs {need:.1f} GiB of RAM in teacher mode {mode} ({how}) but only "
            f"{ram_limit_gib:.1f} GiB is available; use a CUDA card (teacher_mode gpu or offload), "
            "raise precompute.cpu_mem_gib, or close other programs."
        )
    tokenizer = SeedTokenizer(spiece or Path(root) / SPIECE, window, vocab_limit, windows)
    log.info("teacher: %s; mode %s", report.summary(), mode)
    model = load_encoder(Path(root), device, mode)
    return T5Teacher(model, tokenizer, device, mode, identity, masked, pad_rows)
