"""The engine tier's adapter cases: ONE list of (GGUF, pack, expected). Each case is a file this
tool exports for a pack, fed to ggk 0.9.7's own loader and runner (adapter_probe.cpp:
ModelLoader::init_from_file with the `--llm-adapter` prefix, then the LLMAdapter runner ggk picks
from the file's tensors) on the template rows ggk builds for the case's prompt (the tier's
tokenizer driver, probe.cpp / t5clip_probe.cpp), and the runner's output must equal this tool's
forward of the same file. What the runner detects (in/out width, depth, queries, seed rows,
layer stack, vision tensors) must be what the pack declares.

How to add a case (a new export kind: a q8_0 file, a standardized per-tap export, a slot
resampler ...): write an exporter `def my_export(pack, cfg, state, path) -> Path` that writes
the GGUF your stage writes (the default, `f16_export`, is write_adapter_gguf), then append
`AdapterCase("my-id", "<pack id>", export=my_export)` to CASES (set `tol` if the file is lossy,
`expect` for a runner field the pack does not declare, `rows` when another embedder builds the
kind's ids). No C++ changes: adapter_probe.cpp loads whatever ggk would load and dispatches as
ggk does (plain / Qwen3.5 bridge / Ming runner, its first stdout line names it).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from gguf_trainer.packs import get_pack, pack_ids

# Words for prompts that reach a family's cut-off (about 1.3 student tokens a word).
LONG_WORDS = ("a", "red", "fox", "in", "the", "snow", "under", "a", "pale", "winter", "sky",
              "with", "pine", "trees,")


def long_prompt(tokens: int) -> str:
    """A prompt of at least `tokens` student tokens."""
    n = tokens  # each word is >= 1 token
    return " ".join(LONG_WORDS[i % len(LONG_WORDS)] for i in range(n))


def f16_export(pack, cfg, state, path: Path, seed_rank: int = 0) -> Path:
    """What `gguf-trainer export` writes: write_adapter_gguf (f16), the seed table factorized
    at `seed_rank` when set (train.seed_rank)."""
    from gguf_trainer.model.export import factorize_seed, write_adapter_gguf

    if seed_rank:
        state, cfg, _ = factorize_seed(state, cfg, seed_rank)
    write_adapter_gguf(path, state, cfg, metadata={"adapter.pack": pack.id})
    return path


def factorized_export(rank: int) -> Callable:
    def export(pack, cfg, state, path):
        return f16_export(pack, cfg, state, path, seed_rank=rank)

    export.rank = rank
    return export


def bridge_export(pack, cfg, state, path: Path) -> Path:
    """The Qwen3.5 bridge as its export writes it: f16 with the Qwen3.5 vocabulary as
    tokenizer.ggml.* (ggk's vocabulary provider reads it; the loader and runner do not)."""
    from gguf_trainer.model.export import write_adapter_gguf
    from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

    tokens, merges = qwen35_vocabulary()
    write_adapter_gguf(path, state, cfg, metadata={"adapter.pack": pack.id},
                       tokenizer={"tokens": tokens, "merges": merges, "pre": "qwen35"})
    return path


def bridge_bank_export(pack, cfg, state, path: Path) -> Path:
    """The Qwen3.5 bridge with its FLUX.3 bank (train.bank_slots) as the export stage writes it:
    bridge_export's file with the bank's standardization folded into out_bank (stages/export.py
    `bank_fold`: the bank rows' mu and floored sigma, here fixed random ones at 20480)."""
    import torch

    from gguf_trainer.model.export import write_adapter_gguf
    from gguf_trainer.tiny.qwen35 import qwen35_vocabulary

    g = torch.Generator().manual_seed(9)
    fold = (torch.randn(cfg.bank_dim, generator=g), torch.rand(cfg.bank_dim, generator=g) + 0.5)
    tokens, merges = qwen35_vocabulary()
    write_adapter_gguf(path, state, cfg, metadata={"adapter.pack": pack.id},
                       tokenizer={"tokens": tokens, "merges": merges, "pre": "qwen35"},
                       bank_fold=fold)
    return path


def bridge_rows(pack, prompt: str, drivers) -> tuple[list[int], list[int]]:
    """The student's MOSS template ids and the slot seeds (the Qwen3.5 ids of the same template;
    test_qwen35_bridge_engine.py proves them the engine's)."""
    from gguf_trainer.data.samples import Sample
    from gguf_trainer.engine.qwen_bpe import engine_bpe
    from gguf_trainer.model.student import load_tokenizer
    from gguf_trainer.tiny import qwen_tokenizer_dir

    encode = engine_bpe(load_tokenizer(qwen_tokenizer_dir())).encode
    return pack.student_ids(encode, Sample(prompt)), pack.slot_ids_for_text(prompt)


def ming_export(pack, cfg, state, path: Path) -> Path:
    """The Ming adapter as its export writes it: f16 with the Ling tokenizer.json as the
    `tokenizer_json` tensor (the tests' vocabulary, tiny/ming.py: none installs offline)."""
    from gguf_trainer.model.export import write_adapter_gguf
    from gguf_trainer.tiny.ming import ling_tokenizer_json

    write_adapter_gguf(path, state, cfg, metadata={"adapter.pack": pack.id},
                       tokenizer={"json": ling_tokenizer_json()})
    return path


def ming_rows(pack, prompt: str, drivers) -> tuple[list[int], list[int]]:
    """The student's raw prompt ids and the Ling slot ids of Ming's template
    (test_ming_adapter_engine.py proves them the engine's LingTokenizer's)."""
    return bridge_rows(pack, prompt, drivers)


@dataclass(frozen=True)
class AdapterCase:
    id: str
    pack: str
    export: Callable = f16_export
    prompt: str = "a sheep in sunglasses."
    # the rows the engine's template must reach for this prompt: ("max", n) = cut at n,
    # (">", n) = more than n (past a min_length pad), None = any
    reach: tuple | None = None
    # the template the rows come from: the pack's own (None) or a family it also serves
    # ("qwen3vl_krea2@VERSION_IRIS": Iris-3B's branch, its cut at 300 rows)
    template: str | None = None
    vision: bool = False  # raw vision rows at a run of the template (dense, zeros elsewhere)
    project: bool = False  # the file's vision_proj run on raw rows (the splice map)
    expect: dict = field(default_factory=dict)  # runner fields beyond the pack's declarations
    out_dim: int = 0  # the adapter's output width; 0 = the pack's
    # (pack, prompt, engine drivers) -> (student ids, seed ids or None): the rows of a kind
    # whose ids another embedder builds (a slot resampler's Qwen3.5 template and per-token
    # seeds); None = LLMEmbedder's template, or the T5 embedders' window
    rows: Callable | None = None
    # train settings over width 128, depth 2; `bank_slots` n > 0 configures the pack with its
    # FLUX.3 bank head of n rows (packs/qwen35_bridge.configured) and runs the runner's FLUX.3
    # pass (want_bank, the student rows laid under the bank as training lays them)
    train: dict = field(default_factory=dict)
    tol: float = 1e-5


def _shipped() -> list[str]:
    return [i for i in pack_ids()
            if type(get_pack(i)).__module__.startswith("gguf_trainer.packs.")]


# The kinds _cases() makes a case for by itself (the plain AdapterRunner's files); a pack of
# another kind (the slot resamplers) needs its case appended by hand, with the exporter, seeds
# and rows its kind takes (test_every_shipped_pack_has_a_case names the packs still lacking one).
PLAIN_KINDS = ("resampler", "seeded_resampler", "token_aligned", "token_aligned_vision",
               "layerwise")


def _cases() -> list[AdapterCase]:
    out = []
    for pid in _shipped():
        pack = get_pack(pid)
        if pack.adapter_kind not in PLAIN_KINDS:
            continue
        pad = pack.padding
        vision = bool(pack.vis_dim)
        if pad.max_length:  # FLUX.3, Fibo 2.0: the template cut at 4096 rows
            # at the pack's geometry on a short prompt (with the vision rows where it has them),
            # then at the cut with 32 features a tap (the full stack there is 0.3-0.6 GB a side)
            out.append(AdapterCase(pid, pid, vision=vision, project=vision))
            out.append(AdapterCase(f"{pid}-at-the-cut", pid,
                                   prompt=long_prompt(pad.max_length + 64),
                                   reach=("max", pad.max_length), out_dim=32 * len(pack.taps)))
        elif pad.min_length:  # FLUX.2 klein 512, Ovis 284 pads; SeFi past its 1024
            out.append(AdapterCase(pid, pid, vision=vision, project=vision,
                                   reach=(">=", pad.min_length)))
            out.append(AdapterCase(f"{pid}-past-pads", pid, prompt=long_prompt(pad.min_length + 8),
                                   reach=(">", pad.min_length)))
        elif pack.seed_vocab > 32128:  # Wan: the 256,384-row UMT5 seed table, ids past T5's
            out.append(AdapterCase(pid, pid,
                                   prompt="一只戴墨镜的羊, a sheep in sunglasses; 猫が好き",
                                   expect={"t5_vocab": pack.seed_vocab}))
        else:
            out.append(AdapterCase(pid, pid, vision=vision, project=vision))
    # the seeded resampler once more with its seed table factorized at export (train.seed_rank)
    out.append(AdapterCase("t5xxl_pixart-seed-rank-8", "t5xxl_pixart", export=factorized_export(8),
                           expect={"embed_rank": 8}))
    if "qwen35_bridge" in _shipped():  # the slot kind: the MOSS template, one seed a token
        out.append(AdapterCase("qwen35_bridge", "qwen35_bridge", export=bridge_export,
                               rows=bridge_rows, train={"seed_rank": 16}))
        # its FLUX.3 bank (train.bank_slots 80: 3 prefix rows, the body cut at 72, 5 suffix
        # rows) on a prompt past the cut, with out_bank at FLUX.3's 20480
        out.append(AdapterCase("qwen35_bridge-bank", "qwen35_bridge", export=bridge_bank_export,
                               rows=bridge_rows, prompt=long_prompt(100),
                               train={"seed_rank": 16, "bank_slots": 80},
                               expect={"n_bank": 80, "bank_dim": 20480, "bank_align": 1}))
    if "ming_image" in _shipped():  # the Ming kind: 256 caption rows + one Ling slot a token
        out.append(AdapterCase("ming_image", "ming_image", export=ming_export, rows=ming_rows,
                               train={"seed_rank": 16},
                               expect={"runner": "ming", "max_slots": 1280,
                                       "seed_vocab": 157184, "seed_rank": 16, "vis_dim": 2048}))
    # Krea2's file serves Iris-3B (its branch: the body cut at 300 rows, conditioner.hpp)
    out.append(AdapterCase("qwen3vl_krea2-iris-cut", "qwen3vl_krea2",
                           template="qwen3vl_krea2@VERSION_IRIS", prompt=long_prompt(400),
                           reach=("max", None)))
    return out


CASES = _cases()
