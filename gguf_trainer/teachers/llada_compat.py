"""What the released LLaDA2-MoE remote code needs from transformers 5, and its RoPE repair.

Owns: the `transformers.modeling_attn_mask_utils` stand-in (4.x semantics; transformers 5 no
longer ships the module and the remote code imports three functions from it), and the check
and repair of every rotary `inv_freq` table after a load or a dtype/device move
(llada-remote-code.md, traps 1 and 2). Must not: load models or know about projects.

    install_attn_mask_utils()          # before AutoModel.from_pretrained(...,
                                       # trust_remote_code=True)
    repair_rotary_tables(model)        # after every load or .to(): raises UserError if unrepairable
"""

from __future__ import annotations

import logging
import sys
import types

import torch

from gguf_trainer.base.errors import UserError

log = logging.getLogger(__name__)
MODULE_NAME = "transformers.modeling_attn_mask_utils"
INV_FREQ_RTOL = 1e-5


def _expand_mask(
    mask: torch.Tensor, dtype: torch.dtype, tgt_len: int | None = None
) -> torch.Tensor:
    """(B, S) 1 = keep -> additive (B, 1, T, S) with finfo.min at dropped keys (4.x)."""
    b, s = mask.shape
    t = tgt_len if tgt_len is not None else s
    expanded = mask[:, None, None, :].expand(b, 1, t, s).to(dtype)
    return (1.0 - expanded).masked_fill((1.0 - expanded).to(torch.bool), torch.finfo(dtype).min)


def _prepare_4d_attention_mask(mask, dtype, tgt_len=None):
    return _expand_mask(mask, dtype, tgt_len)


def _causal_4d(b, t, past, dtype, device):
    causal = torch.full((t, t + past), torch.finfo(dtype).min, dtype=dtype, device=device)
    causal = torch.triu(causal, diagonal=1 + past)
    return causal[None, None].expand(b, 1, t, t + past)


def _prepare_4d_causal_attention_mask(
    attention_mask, input_shape, inputs_embeds, past_key_values_length, sliding_window=None
):
    b, t = input_shape[0], input_shape[-1]
    dtype, device = inputs_embeds.dtype, inputs_embeds.device
    causal = _causal_4d(b, t, past_key_values_length, dtype, device)
    if attention_mask is None:
        return causal
    if attention_mask.dim() == 4:
        return attention_mask
    pad = _expand_mask(attention_mask.to(device), dtype, t)
    return causal.masked_fill(pad.to(torch.bool), torch.finfo(dtype).min)


def _prepare_4d_causal_attention_mask_for_sdpa(
    attention_mask, input_shape, inputs_embeds, past_key_values_length, sliding_window=None
):
    """4.x: None when the 2-D mask keeps everything (SDPA then runs its own causal path),
    otherwise the causal + padding additive mask."""
    if attention_mask is not None and attention_mask.dim() == 2 and bool(attention_mask.all()):
        return None
    return _prepare_4d_causal_attention_mask(
        attention_mask, input_shape, inputs_embeds, past_key_values_length, sliding_window
    )


def install_attn_mask_utils() -> None:
    """Make `import transformers.modeling_attn_mask_utils` work; a no-op where transformers
    still ships it (4.x)."""
    try:
        __import__(MODULE_NAME)
        return
    except ModuleNotFoundError:
        pass  # transformers 5: provide the 4.x functions the remote code imports
    mod = types.ModuleType(MODULE_NAME)
    mod.__doc__ = "gguf-trainer's stand-in for the transformers 4.x module (remote code imports it)"
    for fn in (
        _prepare_4d_attention_mask,
        _prepare_4d_causal_attention_mask,
        _prepare_4d_causal_attention_mask_for_sdpa,
    ):
        setattr(mod, fn.__name__, fn)
    sys.modules[MODULE_NAME] = mod
    import transformers

    transformers.modeling_attn_mask_utils = mod


def rotary_modules(model: torch.nn.Module) -> list[tuple[str, torch.nn.Module]]:
    """Every module that owns an `inv_freq` buffer."""
    return [
        (n, m)
        for n, m in model.named_modules()
        if "inv_freq" in dict(m.named_buffers(recurse=False))
    ]


def expected_inv_freq(module: torch.nn.Module, device) -> torch.Tensor | None:
    """The table the module's own config says it must hold, or None if it cannot say."""
    init = getattr(module, "rope_init_fn", None)
    config = getattr(module, "config", None)
    if init is None or config is None:
        return None
    try:
        inv, _ = init(config, device)
    except (TypeError, ValueError, KeyError, AttributeError) as e:  # a config it cannot read
        log.warning("rope_init_fn failed: %s", e)
        return None
    return inv.to(device=device, dtype=torch.float32)


def table_problem(table: torch.Tensor, want: torch.Tensor | None) -> str | None:
    """Why `table` is not a usable RoPE table (None = fine)."""
    if table.device.type == "meta":
        return "it is on the meta device"
    t = table.detach().float().cpu()
    if t.numel() == 0 or not bool(torch.isfinite(t).all()):
        return "it holds non-finite values"
    if (
        abs(float(t[0]) - 1.0) > 1e-4
        or not bool((t > 0).all())
        or not bool((t[1:] <= t[:-1]).all())
    ):
        return "it is not a decreasing table starting at 1"
    if want is not None:
        w = want.detach().float().cpu()
        if w.shape != t.shape or not torch.allclose(t, w, rtol=INV_FREQ_RTOL, atol=0.0):
            return "it differs from 1/theta^(2i/d) of its config"
    return None


def repair_rotary_tables(model: torch.nn.Module) -> list[str]:
    """Check every rotary table against its config and recompute it where it is wrong
    (float32, non-persistent). Returns the names repaired. UserError when a table cannot be
    repaired, or when the model has none (the teacher must never run with a scrambled RoPE)."""
    mods = rotary_modules(model)
    if not mods:
        raise UserError(
            "the teacher backbone has no rotary table (inv_freq) to check; this "
            "text_encoder is not the LLaDA2-MoE code gguf-trainer supports."
        )
    repaired = []
    for name, mod in mods:
        device = mod.inv_freq.device if mod.inv_freq.device.type != "meta" else torch.device("cpu")
        want = expected_inv_freq(mod, device)
        if table_problem(mod.inv_freq, want) is None:
            continue
        if want is not None and table_problem(want, None) is None:
            mod.register_buffer("inv_freq", want.clone(), persistent=False)
            mod.original_inv_freq = mod.inv_freq
            repaired.append(name or "<root>")
        problem = table_problem(mod.inv_freq, want)
        if problem is not None:
            raise UserError(
                f"the teacher's RoPE table {name}.inv_freq is unusable ({problem}) and "
                "cannot be rebuilt from its config; the teacher refuses to run with a "
                "scrambled position signal: update gguf-trainer or the teacher snapshot."
            )
    if repaired:
        log.info(
            "teacher: repaired %d RoPE table(s) left uninitialised by the loader: %s",
            len(repaired),
            ", ".join(repaired),
        )
    return repaired
