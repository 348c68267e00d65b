"""Shards: write/verify round-trip and corruption detection, train statistics against numpy,
the seeded resumable ShardStream, collate and iter_batches."""

from __future__ import annotations

import struct

import numpy as np
import pytest
import torch

from gguf_trainer.data.shards import (
    Shard,
    ShardStream,
    StreamPos,
    collate,
    dims,
    iter_batches,
    linear_fit,
    load_stats,
    shard_files,
    shard_name,
    verify_shard,
    write_shard,
)

IN_DIM, OUT_DIM, WINDOW = 8, 6, 5
SEED = 3
FP = "fingerprint-a"
SIZES = (7, 5, 9)  # uneven shards: batches never line up with shard ends
BATCH = 4


def shard_tensors(n: int, seed: int, kind: str = "resampler", first_index: int = 0,
                  const_dims: int = 0) -> dict[str, torch.Tensor]:
    """A shard laid out as precompute_shard.build_shard writes it, with random rows. `const_dims`
    target dims are constant (sigma 0: the floor applies)."""
    g = torch.Generator().manual_seed(seed)
    s_len = torch.randint(1, 6, (n,), generator=g, dtype=torch.int32)
    t_len = torch.randint(1, WINDOW + 1, (n,), generator=g, dtype=torch.int32)
    if kind == "token":
        t_len = s_len.clone()
    rows = 5.0 + 2.0 * torch.randn(int(t_len.sum()), OUT_DIM, generator=g)
    rows[:, :const_dims] = 1.5
    rows = rows.to(torch.bfloat16)
    stored = rows.double()
    t = {
        "student_rows": torch.randn(int(s_len.sum()), IN_DIM, generator=g).to(torch.bfloat16),
        "student_ids": torch.randint(0, 1000, (int(s_len.sum()),), generator=g, dtype=torch.int32),
        "student_len": s_len,
        "target_rows": rows,
        "target_len": t_len,
        "sample_index": torch.arange(first_index, first_index + n, dtype=torch.int64),
        "moment_sum": stored.sum(0),
        "moment_sq": (stored * stored).sum(0),
        "moment_n": torch.tensor([stored.shape[0]], dtype=torch.int64),
    }
    if kind == "seeded":
        t["seed_ids"] = torch.randint(0, 100, (n, WINDOW), generator=g, dtype=torch.int32)
    if kind == "token":
        t["sup_start"] = torch.randint(0, 3, (n,), generator=g, dtype=torch.int32)
    return t


def write_set(folder, sizes=SIZES, kind="resampler", const_dims=0):
    start, out = 0, []
    for k, n in enumerate(sizes):
        path = folder / shard_name("train", k)
        write_shard(path, shard_tensors(n, SEED + k, kind, start, const_dims), {"fingerprint": FP})
        out.append(path)
        start += n
    assert shard_files(folder) == out
    return out


@pytest.fixture
def files(tmp_path):
    return write_set(tmp_path)


# ----------------------------------------------------------------- write / verify


def test_write_verify_round_trip(tmp_path):
    tensors = shard_tensors(6, SEED, "seeded")
    path = tmp_path / shard_name("val", 0)
    assert path.name == "val-00000.safetensors"
    write_shard(path, tensors, {"fingerprint": FP, "pack": "t5xxl_pixart"})
    assert verify_shard(path, FP) is None
    shard = Shard(path)
    assert shard.n == 6 and set(shard.t) == set(tensors)
    for k, v in tensors.items():
        assert torch.equal(shard.t[k], v), k
    assert [p.name for p in tmp_path.iterdir()] == [path.name]  # no temp file left


def _data_start(path) -> int:
    (header_len,) = struct.unpack("<Q", path.read_bytes()[:8])
    return 8 + header_len


def test_truncated_shard_detected(tmp_path):
    path = tmp_path / "a.safetensors"
    write_shard(path, shard_tensors(6, SEED), {"fingerprint": FP})
    data = path.read_bytes()
    for cut in (len(data) - 1, len(data) // 2, _data_start(path), 20, 0):
        path.write_bytes(data[:cut])
        assert verify_shard(path, FP) == "unreadable or truncated", cut


def test_flipped_byte_in_tensor_data_detected(tmp_path):
    path = tmp_path / "a.safetensors"
    write_shard(path, shard_tensors(6, SEED), {"fingerprint": FP})
    data = bytearray(path.read_bytes())
    start = _data_start(path)
    for offset in (start, (start + len(data)) // 2, len(data) - 1):
        flipped = bytearray(data)
        flipped[offset] ^= 0x01
        path.write_bytes(bytes(flipped))
        assert verify_shard(path, FP) == "checksum mismatch (corrupted)", offset


def test_other_fingerprint_and_foreign_files(tmp_path):
    path = tmp_path / "a.safetensors"
    write_shard(path, shard_tensors(6, SEED), {"fingerprint": FP})
    assert verify_shard(path, "fingerprint-b") == "made from other inputs"
    junk = tmp_path / "junk.safetensors"
    junk.write_bytes(b"\x00" * 64)
    assert verify_shard(junk, FP) == "unreadable or truncated"
    assert verify_shard(tmp_path / "missing.safetensors", FP) == "unreadable or truncated"
    from safetensors.torch import save_file  # a valid safetensors file that is no shard

    plain = tmp_path / "plain.safetensors"
    save_file({"x": torch.zeros(3)}, str(plain), metadata={"fingerprint": FP})
    assert verify_shard(plain, FP) == "unreadable or truncated"


# ----------------------------------------------------------------- statistics


def test_load_stats_equals_numpy(tmp_path):
    floor = 0.03
    files = write_set(tmp_path, const_dims=2)
    rows = np.concatenate([Shard(f).t["target_rows"].float().numpy().astype(np.float64)
                           for f in files])
    stats = load_stats(files, floor)
    assert stats.n == rows.shape[0] == sum(int(Shard(f).t["target_len"].sum()) for f in files)
    np.testing.assert_allclose(stats.mu.numpy(), rows.mean(0), rtol=1e-6)
    np.testing.assert_allclose(stats.sigma.numpy(), rows.std(0), rtol=1e-5, atol=1e-6)
    np.testing.assert_allclose(
        stats.sigma_f.numpy(), np.maximum(rows.std(0), floor), rtol=1e-5, atol=1e-6
    )
    assert stats.sigma[:2].max() < floor and torch.all(stats.sigma_f[:2] == torch.tensor(floor))
    assert stats.n_floored == 2
    assert stats.mu.dtype == stats.sigma.dtype == stats.sigma_f.dtype == torch.float32


# ----------------------------------------------------------------- ShardStream


def _ids(batch) -> list[tuple[int, int]]:
    return list(batch.samples)


def run_stream(files, n, seed=SEED, pos=None):
    stream = ShardStream(files, seed, BATCH, pos=pos)
    return [_ids(stream.next_batch()) for _ in range(n)], stream


BATCHES_PER_EPOCH = sum(-(-n // BATCH) for n in SIZES)  # 2 + 2 + 3


def test_stream_same_seed_same_sequence(files):
    a, _ = run_stream(files, 2 * BATCHES_PER_EPOCH)
    b, _ = run_stream(files, 2 * BATCHES_PER_EPOCH)
    c, _ = run_stream(files, 2 * BATCHES_PER_EPOCH, seed=SEED + 1)
    assert a == b and a != c


def test_stream_every_sample_once_per_epoch(files):
    stream = ShardStream(files, SEED, BATCH)
    all_ids = {(f, r) for f, n in enumerate(SIZES) for r in range(n)}
    epochs = []
    for epoch in range(3):
        seen = []
        for _ in range(BATCHES_PER_EPOCH):
            seen += _ids(stream.next_batch())
        assert sorted(seen) == sorted(all_ids)  # each exactly once
        epochs.append(seen)
        # the epoch holds exactly BATCHES_PER_EPOCH batches: the next one starts a new epoch
        nxt = ShardStream(files, SEED, BATCH, pos=StreamPos(**stream.pos.as_dict()))
        nxt.next_batch()
        assert nxt.pos.epoch == epoch + 1 and stream.pos.epoch == epoch
    assert epochs[0] != epochs[1] != epochs[2]  # reshuffled every epoch


@pytest.mark.parametrize(
    "cut", [1, 2, 3, 6, BATCHES_PER_EPOCH, BATCHES_PER_EPOCH + 4, 2 * BATCHES_PER_EPOCH - 1]
)
def test_stream_resume_from_pos_is_exact(files, cut):
    total = 2 * BATCHES_PER_EPOCH + 3
    whole, _ = run_stream(files, total)
    head, stream = run_stream(files, cut)
    saved = StreamPos(**stream.pos.as_dict())  # as a checkpoint stores it
    tail, _ = run_stream(files, total - cut, pos=saved)
    assert head + tail == whole


def test_stream_resume_gives_identical_tensors(files):
    s1 = ShardStream(files, SEED, BATCH)
    for _ in range(4):
        s1.next_batch()
    s2 = ShardStream(files, SEED, BATCH, pos=StreamPos(**s1.pos.as_dict()))
    for _ in range(BATCHES_PER_EPOCH):
        a, b = s1.next_batch(), s2.next_batch()
        assert torch.equal(a.hidden, b.hidden) and torch.equal(a.target, b.target)
        assert torch.equal(a.mask, b.mask) and torch.equal(a.row_mask, b.row_mask)


# ----------------------------------------------------------------- collate / iter_batches


def _expected_padded(pieces: list[torch.Tensor], length: int):
    width = pieces[0].shape[1]
    out = np.zeros((len(pieces), length, width), np.float32)
    mask = np.zeros((len(pieces), length), bool)
    for b, p in enumerate(pieces):
        out[b, : p.shape[0]] = p.float().numpy()
        mask[b, : p.shape[0]] = True
    return out, mask


@pytest.mark.parametrize("kind", ["resampler", "seeded", "token"])
def test_collate_pads_correctly(tmp_path, kind):
    tensors = shard_tensors(6, SEED, kind)
    path = tmp_path / "s.safetensors"
    write_shard(path, tensors, {"fingerprint": FP})
    shard = Shard(path)
    rows = [4, 0, 2]
    s_off = np.concatenate([[0], np.cumsum(tensors["student_len"].numpy())])
    t_off = np.concatenate([[0], np.cumsum(tensors["target_len"].numpy())])
    students = [tensors["student_rows"][s_off[i] : s_off[i + 1]] for i in rows]
    targets = [tensors["target_rows"][t_off[i] : t_off[i + 1]] for i in rows]
    fixed = WINDOW + 2 if kind == "seeded" else 0
    batch = collate(shard, rows, file_index=9, fixed_rows=fixed)
    s_len = max(int(tensors["student_len"][i]) for i in rows)
    t_len = max(fixed, max(int(tensors["target_len"][i]) for i in rows))
    hid, mask = _expected_padded(students, s_len)
    tgt, row_mask = _expected_padded(targets, t_len)
    assert batch.hidden.dtype == batch.target.dtype == torch.float32
    np.testing.assert_array_equal(batch.hidden.numpy(), hid)
    np.testing.assert_array_equal(batch.mask.numpy(), mask)
    np.testing.assert_array_equal(batch.target.numpy(), tgt)
    np.testing.assert_array_equal(batch.row_mask.numpy(), row_mask)
    assert batch.samples == [(9, 4), (9, 0), (9, 2)]
    if kind == "seeded":
        assert batch.target.shape[1] == WINDOW + 2 and not batch.row_mask[:, WINDOW:].any()
        assert batch.seed_ids.dtype == torch.long
        assert torch.equal(batch.seed_ids, tensors["seed_ids"][rows].long())
    else:
        assert batch.seed_ids is None
    if kind == "token":
        assert torch.equal(batch.sup_start, tensors["sup_start"][rows].long())
        assert torch.equal(batch.mask, batch.row_mask)
    else:
        assert batch.sup_start is None


def test_fixed_rows_never_shortens(tmp_path):
    path = tmp_path / "s.safetensors"
    write_shard(path, shard_tensors(6, SEED, "seeded"), {"fingerprint": FP})
    batch = collate(Shard(path), [0, 1, 2, 3, 4, 5], 0, fixed_rows=1)
    assert batch.target.shape[1] == int(Shard(path).t["target_len"].max())


def test_iter_batches_visits_every_sample_once_in_order(files):
    batches = list(iter_batches(files, 3))
    expected = [(f, r) for f, n in enumerate(SIZES) for r in range(n)]
    assert [s for b in batches for s in b.samples] == expected
    assert [len(b.samples) for b in batches] == [3, 3, 1, 3, 2, 3, 3, 3]  # never across shards
    first = Shard(files[0])
    np.testing.assert_array_equal(
        batches[0].target[0, : int(first.t["target_len"][0])].numpy(),
        first.target(0).float().numpy(),
    )


# ----------------------------------------------------------------- vision rows

VIS_DIM = 7


def vision_shard(
    n: int, seed: int
) -> tuple[dict[str, torch.Tensor], list[list[tuple[int, torch.Tensor]]]]:
    """A token-aligned shard with images: sample k has k % 3 images (0 = text-only), each a
    run of raw rows at increasing positions. Returns the tensors and, per sample, (pos, row)."""
    t = shard_tensors(n, seed, "token")
    g = torch.Generator().manual_seed(seed + 100)
    rows, pos, lens, truth = [], [], [], []
    for k, length in enumerate(t["student_len"].tolist()):
        take = list(range(0, length, 2))[: k % 3]  # a few positions of this sample
        r = torch.randn(len(take), VIS_DIM, generator=g).to(torch.bfloat16)
        rows.append(r)
        pos += take
        lens.append(len(take))
        truth.append(list(zip(take, r)))
    t["vis_rows"] = torch.cat(rows)
    t["vis_pos"] = torch.tensor(pos, dtype=torch.int32)
    t["vis_len"] = torch.tensor(lens, dtype=torch.int32)
    return t, truth


def test_vision_rows_collate_to_dense_vis_and_mask(tmp_path):
    tensors, truth = vision_shard(9, SEED)
    path = tmp_path / "v.safetensors"
    write_shard(path, tensors, {"fingerprint": FP})
    assert verify_shard(path, FP) is None
    assert dims(path) == {"in_dim": IN_DIM, "out_dim": OUT_DIM, "vis_dim": VIS_DIM}
    shard = Shard(path)
    rows = [5, 0, 4, 3]  # 2, 0, 1, 0 images
    batch = collate(shard, rows, 0)
    assert (
        batch.vis.shape == (4, batch.hidden.shape[1], VIS_DIM) and batch.vis.dtype == torch.float32
    )
    want = torch.zeros_like(batch.vis)
    mask = torch.zeros(batch.vis.shape[:2], dtype=torch.bool)
    for b, i in enumerate(rows):
        for p, r in truth[i]:
            want[b, p], mask[b, p] = r.float(), True
    assert torch.equal(batch.vis, want) and torch.equal(batch.vis_mask, mask)
    assert (
        mask.sum() == sum(len(truth[i]) for i in rows) > 0
        and not (batch.vis_mask & ~batch.mask).any()
    )
    moved = batch.to("cpu")
    assert torch.equal(moved.vis, batch.vis) and torch.equal(moved.vis_mask, batch.vis_mask)
    text_only = collate(shard, [0, 3, 6], 0)  # no image in the batch: vis None, mask all False
    assert text_only.vis is None and text_only.vis_mask.shape == text_only.mask.shape
    assert not text_only.vis_mask.any()


def test_text_shards_have_no_vision(tmp_path, files):
    assert dims(files[0]) == {"in_dim": IN_DIM, "out_dim": OUT_DIM, "vis_dim": 0}
    batch = collate(Shard(files[0]), [0, 1], 0)
    assert batch.vis is None and batch.vis_mask is None


def test_linear_fit_recovers_a_linear_teacher(tmp_path):
    g = torch.Generator().manual_seed(5)
    w, b = torch.randn(OUT_DIM, IN_DIM, generator=g), torch.randn(OUT_DIM, generator=g)
    paths = []
    for k in range(2):
        t = shard_tensors(40, SEED + k, "token")
        t["target_rows"] = (t["student_rows"].float() @ w.T + b).to(torch.bfloat16)
        paths.append(tmp_path / f"t{k}.safetensors")
        write_shard(paths[-1], t, {"fingerprint": FP})
    got_w, got_b = linear_fit(paths)
    assert torch.allclose(got_w, w, atol=0.05) and torch.allclose(got_b, b, atol=0.05)
    few_w, _ = linear_fit(paths, max_rows=30)  # capped: still a fit, from fewer rows
    assert few_w.shape == w.shape
    (tmp_path / "r").mkdir()
    with pytest.raises(ValueError, match="token-aligned"):
        linear_fit(write_set(tmp_path / "r"))
