"""teachers/ming_stream.py: the released Ming-Image teacher with its layers read from the
shards one at a time (precompute's offload and cpu modes) gives the resident teacher's outputs
bit for bit, and holds the resident tensors plus one layer, not the whole model: measured by a
census of every live tensor in the process (gc), not by the streamer's own accounting."""

from __future__ import annotations

import gc
import warnings

import pytest
import torch

from gguf_trainer.base.errors import UserError

IDS = [[156893, 300, 301, 302, 156894], [156893, 5, 156894]]


@pytest.fixture(scope="module")
def tiny():
    from gguf_trainer.tiny.ming import build_tiny_ming

    return build_tiny_ming()


@pytest.fixture(scope="module")
def released(tiny, tmp_path_factory):
    from gguf_trainer.tiny.ming import write_released_snapshot

    return write_released_snapshot(tmp_path_factory.mktemp("ming") / "Ming-Image-0.1-Design", tiny)


@pytest.fixture
def card_is_cpu(monkeypatch):
    """The CPU stands in for the card: offload's device check passes on a machine without one
    (as test_tap_teacher_placement does), so the offload path itself runs."""
    from gguf_trainer.teachers import offload

    monkeypatch.setattr(offload, "teacher_device", lambda mode, device: torch.device("cpu"))


def _load(root, mode):
    from gguf_trainer.teachers.ming_snapshot import load_ming_teacher

    return load_ming_teacher(root, "cpu", 1280, mode=mode)


def _same(a, b) -> bool:
    return torch.equal(a.caption, b.caption) and all(
        torch.equal(x, y) for x, y in zip(a.direct, b.direct, strict=True))


def _on_meta(model) -> bool:
    layers = list(model.thinker.layers) + list(model.connector.layers)
    return all(p.device.type == "meta" for layer in layers for p in layer.parameters())


@pytest.mark.parametrize("mode", ["cpu", "offload"])
def test_streamed_layers_give_the_resident_teachers_outputs_bit_for_bit(
        tiny, released, mode, card_is_cpu):
    whole = _load(released, None)
    streamed = _load(released, mode)
    assert _on_meta(streamed.model) and not _on_meta(whole.model)
    want = tiny(IDS)
    got = streamed.model(IDS)
    assert _same(got, whole.model(IDS)) and _same(got, want)
    assert _on_meta(streamed.model)  # each layer went back to meta after its forward
    assert _same(streamed.model(IDS), want)  # and is read again for the next batch
    assert torch.equal(streamed.embed_table(), tiny.thinker.embed_tokens.weight)
    # precompute's own call (under inference_mode): the same target rows, twice
    from gguf_trainer.data.samples import Sample

    samples = [Sample("a sheep in sunglasses"), Sample("a red fox")]
    want = whole.targets(samples, None)
    for got in (streamed.targets(samples, None), streamed.targets(samples, None)):
        assert all(torch.equal(a.rows, b.rows) and a.seed_ids == b.seed_ids
                   for a, b in zip(got, want, strict=True))


def test_a_bf16_release_streams_bit_identically_in_bf16(tiny, tmp_path):
    from gguf_trainer.tiny.ming import write_released_snapshot

    root = write_released_snapshot(tmp_path / "bf16", tiny, dtype=torch.bfloat16)
    whole, streamed = _load(root, None), _load(root, "cpu")
    a, b = whole.model(IDS), streamed.model(IDS)
    assert b.caption.dtype == torch.bfloat16 and _same(a, b)


def _live_bytes() -> int:
    """Bytes of every distinct storage a live CPU tensor of this process holds."""
    seen = {}
    with warnings.catch_warnings():  # isinstance on torch.distributed's deprecated reduce_op
        warnings.simplefilter("ignore")
        for o in gc.get_objects():
            if isinstance(o, torch.Tensor) and o.device.type == "cpu":
                st = o.untyped_storage()
                seen[st.data_ptr()] = st.nbytes()
    return sum(seen.values())


def _peak_while_running(teacher, base: int) -> int:
    """The largest census, less `base`, at the start of every part of every layer (attention,
    norms, MoE / MLP: where a layer's weights are all held) during one forward."""
    peak = [0]

    def census(module, args):
        peak[0] = max(peak[0], _live_bytes() - base)

    model = teacher.model
    hooks = [part.register_forward_pre_hook(census)
             for layer in list(model.thinker.layers) + list(model.connector.layers)
             for part in layer.children()]
    try:
        model(IDS)
    finally:
        for h in hooks:
            h.remove()
    return peak[0]


def _layer_bytes(root, cfg) -> list[int]:
    from gguf_trainer.teachers.ming_release import ReleasedWeights

    w = ReleasedWeights(root, cfg)
    return [sum(torch.Size(s).numel() * 4 for s in w.layer_shapes(stack, i).values())
            for stack, n in (("thinker", cfg.layers), ("connector", cfg.conn_layers))
            for i in range(n)]


def test_the_streamed_teacher_holds_its_resident_tensors_and_one_layer(tiny, released):
    from gguf_trainer.teachers.ming_stream import loaded_bytes

    layers = _layer_bytes(released, tiny.cfg)
    gc.collect()
    base = _live_bytes()
    teacher = _load(released, "cpu")
    resident = loaded_bytes(teacher.model)
    streamed = _peak_while_running(teacher, base)
    del teacher
    gc.collect()
    base = _live_bytes()
    teacher = _load(released, None)
    whole_params = loaded_bytes(teacher.model)
    whole = _peak_while_running(teacher, base)
    del teacher
    activations = whole - whole_params  # the same prompts: the same activations in both runs
    assert whole_params == resident + sum(layers)
    print(f"resident {resident / 2**20:.2f} MiB, layers {sum(layers) / 2**20:.2f} MiB "
          f"(largest {max(layers) / 2**20:.2f}); peak held: whole {whole / 2**20:.2f} MiB, "
          f"streamed {streamed / 2**20:.2f} MiB")
    assert streamed <= resident + max(layers) + activations + 64 * 1024
    assert whole - streamed >= sum(layers) - max(layers) - 64 * 1024


def test_a_broken_layer_is_one_sentence_before_any_layer_streams(released, tmp_path):
    import json
    import shutil

    root = tmp_path / "broken"
    shutil.copytree(released, root)
    index_path = root / "mllm" / "model.safetensors.index.json"
    index = json.loads(index_path.read_text())
    name = "model.model.layers.9.mlp.experts.3.down_proj.weight"
    del index["weight_map"][name]
    index_path.write_text(json.dumps(index))
    with pytest.raises(UserError, match=f"lacks {name}; ") as err:
        _load(root, "cpu")  # at load, before any forward streams that layer
    assert "\n" not in str(err.value)


def test_the_pack_streams_the_release_in_the_planners_cpu_mode(released):
    """precompute's planner picks cpu on a machine without a card: the ming_image pack hands
    that mode to the loader, so its released teacher streams (layers on meta between reads)."""
    from types import SimpleNamespace

    from gguf_trainer.packs import get_pack

    pack = get_pack("ming_image")
    teacher = pack.load_teacher({"teacher": released}, SimpleNamespace(mode="cpu"), "cpu")
    assert _on_meta(teacher.model)
    resident = pack.load_teacher({"teacher": released}, SimpleNamespace(mode=None), "cpu")
    assert not _on_meta(resident.model)


def test_the_packs_ram_figure_is_the_resident_tensors_and_the_largest_layer(tiny, released):
    """The pre-flight's RAM need for a streamed release (ming_image.teacher_streamed_gib), from
    the headers alone, equals the bytes of what the streamer keeps resident + its largest
    layer."""
    from gguf_trainer.packs import get_pack
    from gguf_trainer.teachers.ming_release import ReleasedWeights

    layers = _layer_bytes(released, tiny.cfg)  # fp32 as stored here: 4 bytes an element
    w = ReleasedWeights(released, tiny.cfg)
    resident = sum(t.numel() * t.element_size() for t in w.resident().values())
    got = get_pack("ming_image").teacher_streamed_gib({"teacher": released}) * 2**30
    assert got == resident + max(layers)
    stored = sum(f.stat().st_size for c in w.maps for f in (released / c).glob("*.safetensors"))
    assert got < 0.6 * stored  # the whole load's need, which the pre-flight asked before
