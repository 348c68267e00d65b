"""The released Ming-Image teacher with its layers streamed from the shards (precompute's
offload and cpu modes): the resident parts (the Ling table, the final norms, the 256 query
tokens, proj_in / proj_out / proj_directvlm) stay loaded on the compute device, and each of the
20 Bailing layers and 28 connector layers is read from the safetensors shards just before its
forward and dropped after it, so the weights held at any moment are the resident ones plus one
layer (~1.6 GB bf16 for a Bailing MoE layer, of ~32 GB in all). The price: every forward reads
the layers again (the OS page cache keeps them when RAM allows; a batch of prompts shares one
read). The layers read are ReleasedWeights' (ming_release.py), the same tensors the whole load
assembles, so the outputs are bit-identical to the resident teacher on the same device.

    stream_layers(model, ReleasedWeights(root, cfg), dtype, device)   # model: resident loaded,
                                                                      # its layers on meta
    loaded_bytes(model)                                               # what it holds now
"""

from __future__ import annotations

from functools import partial

STACKS = ("thinker", "connector")


def _stack(model, stack: str):
    return getattr(model, stack).layers


def stream_layers(model, weights, dtype, device) -> None:
    """Hook every thinker and connector layer of `model` (left on the meta device) to load its
    weights from `weights` (ming_release.ReleasedWeights) before its forward and go back to meta
    after it."""
    for stack in STACKS:
        for i, layer in enumerate(_stack(model, stack)):
            layer.register_forward_pre_hook(partial(_load, weights, stack, i, dtype, device))
            layer.register_forward_hook(_drop)


def _load(weights, stack, i, dtype, device, module, args):
    module.load_state_dict(weights.layer(stack, i, dtype, device), strict=True, assign=True)


def _drop(module, args, output):
    module.to("meta")  # frees the layer's tensors; the next forward reads them again


def meta_layers(model) -> None:
    """Every thinker and connector layer of `model` on the meta device (nothing held)."""
    for stack in STACKS:
        _stack(model, stack).to("meta")


def loaded_bytes(model) -> int:
    """Bytes of `model`'s parameters and buffers that hold data (meta ones hold none)."""
    return sum(t.numel() * t.element_size()
               for t in list(model.parameters()) + list(model.buffers())
               if t.device.type != "meta")
