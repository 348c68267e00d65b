"""The Qwen3.5 bridge's FLUX.3 Klein bank targets: Qwen3-VL-4B's 8-tap stack (layers 4, 8, ...,
32, 20480 per row) of the prompt as FLUX.3's text encoder reads it, laid out as the engine lays
the adapter's bank (engine-families §2 row 21).

The engine (ggk 0.9.7 conditioner.hpp 4426-4448, Qwen35BridgeEmbedder, `want_bank` with
`bank_align`): the bank is FLUX.3's template `<|im_start|>user\\n` + prompt +
`<|im_end|>\\n<|im_start|>assistant\\n` over the STUDENT's own ids (the same Qwen BPE as the 4B):
prefix and suffix each encoded alone, the body the student's ids of the raw prompt (one piece,
no emphasis parsing; an empty prompt has no body), cut to n_bank - |prefix| - |suffix| ids; bank
row |prefix| + i reads the student's row i through `bank_in`, every other row a zero row; the DiT
gets the first min(n_bank, ⌈n_real/80⌉·80) rows. What the full 4B would hand the DiT there is
the FLUX.3 pack's stack (packs/qwen3vl_flux3.py): those ids padded to a multiple of 80, every
pad at rope position 1 masked as a key (conditioner.hpp 2610-2622, 2698-2712), so every pad
row carries the same state: a sample stores its real rows and ONE pad row (none when n_real is
a multiple of 80).

Owns: the bank ids (`bank_ids`), the 4B run over them (`BankTeacher`, the tap teacher of
qwen_taps.py) and the mock bank. Must not: know packs, projects or settings.

    bank = BankTeacher(tap_teacher, n_bank=240)
    rows = bank.rows(samples, student_ids)    # [BankRows(rows [n_real (+1), 20480], ...)]
"""

from __future__ import annotations

import zlib
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

from gguf_trainer.data.bank_rows import MULTIPLE, PREFIX_ROWS, dit_rows
from gguf_trainer.engine.qwen_ids import PAD_ID
from gguf_trainer.engine.template_padding import Padding

if TYPE_CHECKING:  # pragma: no cover
    import torch

TAPS = (4, 8, 12, 16, 20, 24, 28, 32)  # FLUX.3's out_layers (packs/qwen3vl_flux3.py)
PREFIX = "<|im_start|>user\n"  # conditioner.hpp 4427
SUFFIX = "<|im_end|>\n<|im_start|>assistant\n"  # conditioner.hpp 4428
PADDING = Padding(multiple=MULTIPLE, max_length=4096, pad_position=1)  # FLUX.3's (row 17)
# The student's ids of PREFIX and SUFFIX (Qwen2 BPE; the tier compares the engine's).
PREFIX_IDS = (151644, 872, 198)
SUFFIX_IDS = (151645, 198, 151644, 77091, 198)
assert len(PREFIX_IDS) == PREFIX_ROWS  # bank row PREFIX_ROWS + i reads student row i


@dataclass
class BankRows:
    """One sample's bank target: `rows` its n_real template rows and, when the DiT gets pads,
    the one pad row after them; `n_body` the student rows under the body (bank row
    len(PREFIX_IDS) + i reads student row i)."""

    rows: torch.Tensor
    n_real: int
    n_body: int


def bank_ids(student_ids: Sequence[int], text: str, n_bank: int) -> tuple[list[int], int]:
    """(the bank's template ids, n_body) of a prompt whose student ids are `student_ids`, as
    the engine builds them (see the module docstring)."""
    room = n_bank - len(PREFIX_IDS) - len(SUFFIX_IDS)
    if room < 0:
        raise ValueError(f"a bank of {n_bank} rows cannot hold FLUX.3's 8 template ids")
    n_body = 0 if not text else min(room, len(student_ids))
    return list(PREFIX_IDS) + list(student_ids[:n_body]) + list(SUFFIX_IDS), n_body


def check_n_bank(n_bank: int) -> None:
    if n_bank % MULTIPLE or n_bank < MULTIPLE:
        raise ValueError(f"train.bank_slots {n_bank} must be a multiple of {MULTIPLE} (the rows "
                         "FLUX.3 pads its template to), e.g. 240")


class BankTeacher:
    """The 4B (a qwen_taps.QwenTapTeacher with FLUX.3's taps) over the bank ids."""

    def __init__(self, taps_teacher, n_bank: int):
        check_n_bank(n_bank)
        self.taps, self.n_bank = taps_teacher, n_bank
        self.identity = {**taps_teacher.identity, "bank": n_bank, "bank_template": "flux3"}

    def check_template(self) -> None:
        """The 4B's own tokenizer must give the engine's prefix and suffix ids (the engine
        encodes them with the student's; both are the Qwen vocabulary)."""
        from gguf_trainer.base.errors import UserError

        enc = self.taps._encode
        if tuple(enc(PREFIX)) != PREFIX_IDS or tuple(enc(SUFFIX)) != SUFFIX_IDS:
            raise UserError("the bank teacher's tokenizer does not give Qwen's ids for FLUX.3's "
                            "template; link Qwen/Qwen3-VL-4B-Instruct as bank_teacher.")

    def rows(self, samples: Sequence, student_ids: Sequence[Sequence[int]]) -> list[BankRows]:
        import torch

        laid = [bank_ids(sid, s.text, self.n_bank) for s, sid in zip(samples, student_ids)]
        padded = [PADDING.apply(ids) for ids, _ in laid]
        width = max(len(p) for p in padded)
        input_ids = torch.full((len(padded), width), PAD_ID, dtype=torch.long)
        keep = torch.zeros(len(padded), width, dtype=torch.long)
        pos = torch.arange(width).repeat(len(padded), 1)
        for b, row in enumerate(padded):
            input_ids[b, : len(row)] = torch.tensor(row)
            keep[b, : PADDING.real_length(row)] = 1  # the pads: masked keys, as the engine
            pos[b, : len(row)] = torch.tensor(PADDING.positions(row))
        stack = self.taps.run(input_ids, keep, pos)
        out = []
        for b, ((ids, n_body), row) in enumerate(zip(laid, padded)):
            n = len(ids) + (1 if len(row) > len(ids) else 0)
            out.append(BankRows(stack[b, :n].clone(), len(ids), n_body))
        return out

    def close(self) -> None:
        self.taps.close()


class MockBank:
    """Bank rows without the 4B: from each template id, its position and a causal running
    mean (like a decoder's states); every pad row the state after the real rows."""

    def __init__(self, n_bank: int, dim: int, seed: int = 8080):
        import torch

        check_n_bank(n_bank)
        self.identity = {"bank": "mock", "n_bank": n_bank, "dim": dim}
        g = torch.Generator().manual_seed(seed)
        self.n_bank = n_bank
        self.feat = torch.randn(257, 24, generator=g)
        self.proj = torch.randn(24, dim, generator=g) / 24**0.5

    def rows(self, samples: Sequence, student_ids: Sequence[Sequence[int]]) -> list[BankRows]:
        import torch

        out = []
        for s, sid in zip(samples, student_ids):
            ids, n_body = bank_ids(sid, s.text, self.n_bank)
            base = self.feat[torch.tensor([zlib.crc32(str(i).encode()) % 257 for i in ids])]
            run = torch.cumsum(base, 0) / torch.arange(1, len(ids) + 1)[:, None]
            rows = (0.5 * base + 0.5 * run) @ self.proj
            if dit_rows(len(ids), self.n_bank) > len(ids):
                rows = torch.cat([rows, run[-1:] @ self.proj])
            out.append(BankRows(rows, len(ids), n_body))
        return out


@dataclass
class BridgeTargetRows:
    """teachers.base.TargetRows of the slot head plus the sample's bank (BankRows)."""

    rows: torch.Tensor
    seed_ids: list[int] | None = None
    sup_start: int = 0
    bank: BankRows | None = None


class WithBank:
    """The bridge's slot teacher (teachers/qwen35.py or the pack's mock) with a bank (BankTeacher
    or MockBank): each sample's TargetRows carries its bank rows too."""

    def __init__(self, slots, bank):
        self.slots, self.bank = slots, bank
        self.is_mock = slots.is_mock
        self.identity = {**slots.identity, "bank": bank.identity}

    def lengths(self, samples, student_ids, vision=None):
        return self.slots.lengths(samples, student_ids, vision)

    @property
    def vis_dim(self) -> int:
        return self.slots.vis_dim

    def vision(self, images) -> list:  # references: the slot teacher's tower (the bank is text)
        return self.slots.vision(images)

    def vision_segments(self, rows) -> list:
        return self.slots.vision_segments(rows)

    def targets(self, samples, student_ids, vision=None) -> list:
        out = self.slots.targets(samples, student_ids, vision)
        banks = self.bank.rows(samples, student_ids)
        return [BridgeTargetRows(o.rows, o.seed_ids, o.sup_start, b) for o, b in zip(out, banks)]

    def embed_table(self):
        return self.slots.embed_table()

    def close(self) -> None:
        self.slots.close()
        close = getattr(self.bank, "close", None)
        if close is not None:
            close()
