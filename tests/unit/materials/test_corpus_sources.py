"""Public prompt datasets and image corpora: each reader on a small file of the real schema,
served by the local Hub (tests/hub_server.py) and fetched with the real client."""

from __future__ import annotations

import io
import json
import random
import zipfile
from collections import Counter

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from PIL import Image

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials import hub, image_sources, prompt_presets
from gguf_trainer.materials.prompt_presets import PRESETS

PROMPTS = [f"a photo of a {w} in the snow, detailed" for w in ("cat", "dog", "fox", "owl", "elk")]


def _parquet(columns: dict, row_group_size: int | None = None) -> bytes:
    buf = io.BytesIO()
    pq.write_table(pa.table(columns), buf, row_group_size=row_group_size)
    return buf.getvalue()


def _preset_repo_files(preset) -> dict[str, bytes]:
    """A small file of the preset's real schema, at the path its pattern expects."""
    rng = np.random.default_rng(0)
    if preset.fmt == "csv":  # VidProM_unique.csv: uuid, prompt, time, 6 NSFW scores
        rows = ["uuid,prompt,time,toxicity,obscene,identity_attack,insult,threat,sexual_explicit"]
        rows += [
            f'{i},"{p}",2023-09-0{i + 1},0.1,0.0,0.0,0.0,0.0,0.0' for i, p in enumerate(PROMPTS)
        ]
        return {"VidProM_unique.csv": ("\n".join(rows) + "\n").encode()}
    other = {
        preset.column: PROMPTS,  # DiffusionDB's metadata has many columns beside the prompt
        "image_name": [f"{i}.png" for i in range(5)],
        "seed": rng.integers(0, 2**31, 5).tolist(),
    }
    path = preset.patterns[0].replace("*", "0000")
    return {path: _parquet(other), "README.md": b"card"}


@pytest.mark.parametrize("pid", list(PRESETS))
def test_each_preset_reads_its_column_from_the_hub(pid, hub_server, tmp_path):
    preset = PRESETS[pid]
    hub_server.add_repo(
        preset.repo,
        _preset_repo_files(preset),
        repo_type="dataset",
        branches=("main", preset.revision),
    )
    listing = hub.list_remote(preset.repo, "dataset", preset.patterns, preset.revision)
    assert set(listing.files) == set(_preset_repo_files(preset)) - {"README.md"}
    hub.fetch_listing(listing, tmp_path / pid)
    tally = Counter()
    assert list(prompt_presets.read_preset(tmp_path / pid, preset, tally)) == PROMPTS
    fp = prompt_presets.fingerprint(tmp_path / pid, preset)
    assert (
        fp["repo"] == preset.repo and fp["commit"] == listing.commit and all(fp["files"].values())
    )


class _CountingFile(io.RawIOBase):
    def __init__(self, data: bytes):
        self.f, self.bytes_read = io.BytesIO(data), 0

    def readable(self):
        return True

    def seekable(self):
        return True

    def seek(self, pos, whence=0):
        return self.f.seek(pos, whence)

    def tell(self):
        return self.f.tell()

    def readinto(self, b):
        n = self.f.readinto(b)
        self.bytes_read += n
        return n


def test_parquet_reader_never_reads_the_other_columns():
    big = [np.random.default_rng(i).bytes(200_000) for i in range(20)]  # 4 MB of "images"
    data = _parquet({"prompt": [f"prompt {i}" for i in range(20)], "image": big})
    source = _CountingFile(data)
    got = list(prompt_presets.iter_column(source, "prompt", "parquet", Counter()))
    assert got == [f"prompt {i}" for i in range(20)]
    assert source.bytes_read < len(data) / 20, (source.bytes_read, len(data))


def test_malformed_csv_rows_and_empty_prompts_are_counted_and_skipped(tmp_path):
    path = tmp_path / "p.csv"
    path.write_text(
        'uuid,prompt,time\n1,"a good prompt",x\n2,"too",many,fields,here\n3,,x\n'
        '4,"another good one",x\n5\n',
        encoding="utf-8",
    )
    tally = Counter()
    got = list(prompt_presets.iter_column(path, "prompt", "csv", tally))
    assert got == ["a good prompt", "another good one"]
    assert tally == Counter(bad_row=2, empty=1)
    with pytest.raises(UserError, match="no column 'Prompt'"):
        list(
            prompt_presets.iter_column(
                io.BytesIO(_parquet({"text": ["x"]})), "Prompt", "parquet", Counter()
            )
        )


def test_mix_pools_follows_weights_and_redistributes_a_short_pool():
    pools = {
        "files": [f"f{i}" for i in range(100)],
        "gustavosta": [f"g{i}" for i in range(100)],
        "vidprom": [f"v{i}" for i in range(5)],
    }
    out = prompt_presets.mix_pools(
        pools, {"files": 3, "gustavosta": 1, "vidprom": 1}, 80, random.Random(0)
    )
    counts = Counter(p[0] for p in out)
    assert len(out) == len(set(out)) == 80
    assert counts["v"] == 5 and counts["f"] > 2.5 * counts["g"]  # vidprom gave all it had
    assert prompt_presets.mix_pools(pools, {}, 10**6, random.Random(0)).__len__() == 205
    with pytest.raises(UserError, match="not a selected source"):
        prompt_presets.mix_pools(pools, {"midjourney": 1}, 10, random.Random(0))


# ---- images ---------------------------------------------------------------------------
def _img(color, fmt="PNG", size=(24, 16)) -> bytes:
    buf = io.BytesIO()
    Image.new("RGB", size, color).save(buf, format=fmt)
    return buf.getvalue()


def _csv_captions(i: int) -> str:
    """The CSV cell of Flickr30k's `raw` column: a JSON list of captions, quoted."""
    return '"' + json.dumps([f"caption {i} a", f"caption {i} b"]).replace('"', '""') + '"'


def test_flickr_zip_and_csv_from_the_hub(hub_server, tmp_path):
    preset = image_sources.IMAGE_PRESETS["flickr30k"]
    zbuf = io.BytesIO()
    with zipfile.ZipFile(zbuf, "w") as zf:
        for i, color in enumerate(["red", "green", "blue", "white"]):
            zf.writestr(f"flickr30k-images/{i}.jpg", _img(color, "JPEG"))
        zf.writestr("flickr30k-images/4.jpg", b"\xff\xd8\xff\xe0 not really a jpeg")
    csv_rows = ["raw,sentids,split,filename,img_id"]
    csv_rows += [f"{_csv_captions(i)},x,train,{i}.jpg,{i}" for i in range(5)]
    csv_rows += ['"[]",x,train,5.jpg,5', f"{_csv_captions(6)},x,train,6.jpg,6"]  # 6.jpg: not in zip
    hub_server.add_repo(
        preset.repo,
        {
            "flickr30k-images.zip": zbuf.getvalue(),
            "flickr_annotations_30k.csv": "\n".join(csv_rows).encode(),
            "flickr30k.py": b"# loader script",
        },
        repo_type="dataset",
    )
    listing = hub.list_remote(preset.repo, "dataset", preset.patterns)
    hub.fetch_listing(listing, tmp_path / "flickr")
    tally = Counter()
    entries = list(image_sources.flickr_entries(tmp_path / "flickr", tally))
    assert [e.key for e in entries] == [f"flickr30k-images/{i}.jpg" for i in range(5)]
    assert entries[0].captions == ("caption 0 a", "caption 0 b")
    assert tally == Counter(no_caption=1, missing_image=1)
    val, train = image_sources.split_and_store(entries, 2, tmp_path / "images", 0, tally)
    assert len(val) == 2 and len(train) == 2 and tally["corrupt"] == 1
    assert {v.path for v in val}.isdisjoint(t.path for t in train)
    assert all(v.path.suffix == ".jpg" and v.path.is_file() for v in val + train)


def test_coco_parquet_reads_captions_without_images_until_stored(tmp_path):
    images = [{"bytes": _img(c), "path": f"{c}.png"} for c in ("red", "green", "blue")]
    images.append({"bytes": b"garbage", "path": "bad.png"})
    data = _parquet(
        {
            "image": images,
            "sentences_raw": [["a red square"], ["a green square", "green"], [], ["bad"]],
        },
        row_group_size=2,
    )
    (tmp_path / "coco" / "data").mkdir(parents=True)
    (tmp_path / "coco" / "data" / "train-00000.parquet").write_bytes(data)
    tally = Counter()
    entries = list(image_sources.coco_entries(tmp_path / "coco", tally))
    assert [e.key for e in entries] == ["train-00000:0:0", "train-00000:0:1", "train-00000:1:1"]
    assert tally["no_caption"] == 1
    stored = [image_sources.store_image(e, tmp_path / "img", tally) for e in entries]
    assert stored[2] is None and tally["corrupt"] == 1
    assert Image.open(stored[0].path).getpixel((0, 0)) == (255, 0, 0)


def test_local_folder_same_names_in_subfolders_never_collide(tmp_path):
    root = tmp_path / "pics"
    for sub, color in (("a", "red"), ("b", "blue"), ("c", "red")):
        (root / sub).mkdir(parents=True)
        (root / sub / "cat.png").write_bytes(_img(color))
    (root / "a" / "cat.txt").write_text("a red cat\n\na cat\n", encoding="utf-8")
    (root / "b" / "broken.jpg").write_bytes(b"\xff\xd8 truncated")
    tally = Counter()
    entries = list(image_sources.folder_entries(root, tally))
    assert [e.key for e in entries] == ["a/cat.png", "b/broken.jpg", "b/cat.png", "c/cat.png"]
    assert entries[0].captions == ("a red cat", "a cat") and entries[2].captions == ()
    val, train = image_sources.split_and_store(entries, 1, tmp_path / "images", 3, tally)
    stored = val + train
    assert tally["corrupt"] == 1
    # red a/cat.png and red c/cat.png are one picture: one file, never in both splits
    assert len({s.path for s in stored}) == len(stored) == 2
    assert {Image.open(s.path).getpixel((0, 0)) for s in stored} == {(255, 0, 0), (0, 0, 255)}
    assert tally["same_as_val"] + tally["duplicate"] == 1
    with pytest.raises(UserError, match="does not exist"):
        list(image_sources.folder_entries(tmp_path / "nope", tally))


def test_corpus_mixes_a_downloaded_dataset_with_files_by_weight(hub_server, tmp_path, monkeypatch):
    from material_repos import VIDPROM_REPO, vidprom_files, vidprom_prompt

    from gguf_trainer.materials import corpus_sources
    from gguf_trainer.runner import downloads
    from gguf_trainer.stages import corpus, corpus_build
    from gguf_trainer.store.project import create_project, load_project

    monkeypatch.chdir(tmp_path)
    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    hub_server.add_repo(VIDPROM_REPO, vidprom_files(300), repo_type="dataset")
    mine = tmp_path / "mine.txt"
    mine.write_text("\n".join(f"my own prompt number {i}" for i in range(300)) + "\n", "utf-8")
    root = tmp_path / "projects" / "p"
    create_project(
        root,
        "t5xxl_pixart",
        overrides={
            "corpus.presets": ["vidprom"],
            "corpus.files": [str(mine)],
            "corpus.n_train": 200,
            "corpus.n_val": 40,
            "corpus.weights": {"files": 3, "vidprom": 1},
        },
    )
    with pytest.raises(
        UserError, match="not downloaded.*gguf-trainer download .* --id prompts_vidprom"
    ):
        corpus_sources.preset_pools(load_project(root))
    assert downloads.download_foreground(root, ["prompts_vidprom"], on_line=print) == 0
    project = load_project(root)
    pools = corpus_sources.preset_pools(project)
    assert (
        pools["vidprom"][:2] == [vidprom_prompt(0), vidprom_prompt(1)]
        and len(pools["vidprom"]) == 300
    )
    train, val = corpus_build.build_split(project.settings, preset_pools=pools)
    texts = [s.text for s in train + val if s.text]
    assert len(texts) == 240 and len(set(texts)) == 240
    from_files = sum(t.startswith("my own") for t in texts)
    assert from_files == 180  # 3 : 1
    fp = corpus.STAGE.inputs(project, None, None)
    assert fp["sources"]["presets"]["vidprom"]["repo"] == VIDPROM_REPO
    assert fp["sources"]["presets"]["vidprom"]["commit"]


def test_project_image_sources_need_their_downloads_and_folders(tmp_path, monkeypatch):
    from gguf_trainer.materials import corpus_sources
    from gguf_trainer.store.project import create_project, load_project, update_settings

    monkeypatch.setattr("gguf_trainer.base.paths.PROJECTS_ROOT", tmp_path / "projects")
    pics = tmp_path / "pics"
    (pics / "x").mkdir(parents=True)
    (pics / "x" / "a.png").write_bytes(_img("red"))
    root = tmp_path / "projects" / "mf"
    create_project(root, "qwen3vl_mageflow", overrides={"corpus.image_folders": [str(pics)]})
    entries = corpus_sources.image_entries(load_project(root))
    assert [(e.source, e.key) for e in entries] == [("folder:pics", "x/a.png")]
    before = corpus_sources.fingerprint(load_project(root))["image_folders"]
    (pics / "x" / "b.png").write_bytes(_img("blue"))
    assert corpus_sources.fingerprint(load_project(root))["image_folders"] != before
    update_settings(root, {"corpus.image_presets": ["coco_captions"]})
    with pytest.raises(
        UserError, match="COCO captions.* is not downloaded.*--id images_coco_captions"
    ):
        corpus_sources.image_entries(load_project(root))
