"""Image + caption corpora for image packs: Flickr30k, COCO captions, local image folders.

An entry is one picture and its captions, read lazily: nothing is decoded until the corpus
stores it. Storing checks that the image decodes (a corrupt, truncated or non-image file is
skipped and counted) and writes it once under a name made from its content hash, so two
different pictures never share a file name (two `cat.jpg` in different subfolders stay two
files) and one picture seen twice is one file. The split puts every picture in val or in
train, never both, even when two sources hold the same picture.

Sources:
* Flickr30k (`nlphuji/flickr30k`): `flickr_annotations_30k.csv` (columns `filename`, `raw` =
  a JSON list of 5 captions) + `flickr30k-images.zip` (members found by base name);
* COCO captions (`Multimodal-Fatima/COCO_captions_train`): `data/*.parquet` with an `image`
  struct (bytes) and `sentences_raw` (list of captions); captions are read without touching
  the image column, images one row group at a time;
* a local folder: every .jpg/.jpeg/.png/.webp/.bmp below it; `<stem>.txt` beside an image
  gives its captions (one a line, optional).
Rows without captions (datasets) are skipped and counted; a folder image without a caption
file is kept with no caption (counted), since captions there are optional.

Library code: it knows folders, not projects (corpus_sources.py connects settings).
"""

from __future__ import annotations

import hashlib
import io
import json
import random
import zipfile
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError
from gguf_trainer.engine.prompt_syntax import training_text
from gguf_trainer.materials.prompt_presets import HubDataset

IMAGE_SUFFIXES = (".jpg", ".jpeg", ".png", ".webp", ".bmp")
FORMAT_SUFFIX = {"JPEG": ".jpg", "PNG": ".png", "WEBP": ".webp", "BMP": ".bmp"}

IMAGE_PRESETS: dict[str, HubDataset] = {
    "flickr30k": HubDataset(
        id="images_flickr30k", title="Images: Flickr30k (31k images, 5 captions each)",
        kind="hf_snapshot", repo="nlphuji/flickr30k", repo_type="dataset",
        patterns=("flickr30k-images.zip", "flickr_annotations_30k.csv"),
        subdir="datasets/flickr30k", required=False, size_gb=4.4, fmt="flickr_zip",
        column="raw", rows=31_014, hint="nlphuji/flickr30k: images zip + captions CSV"),
    "coco_captions": HubDataset(
        id="images_coco_captions", title="Images: COCO captions, train 2014 (~83k images)",
        kind="hf_snapshot", repo="Multimodal-Fatima/COCO_captions_train", repo_type="dataset",
        patterns=("data/*.parquet",), subdir="datasets/COCO_captions_train", required=False,
        size_gb=13.5, fmt="parquet", column="sentences_raw", rows=82_783,
        hint="Multimodal-Fatima/COCO_captions_train: parquet with images"),
}


@dataclass(frozen=True)
class ImageEntry:
    """One picture of a source, loaded on demand."""

    source: str
    key: str  # unique within the source (relative path, zip member, file:row group:row)
    captions: tuple[str, ...]
    load: Callable[[], bytes]


@dataclass(frozen=True)
class StoredImage:
    """A picture copied into the corpus: `path` is `<images_dir>/<sha256[:24]><suffix>`."""

    path: Path
    sha256: str
    captions: tuple[str, ...]
    source: str
    key: str


def _clean_captions(values, tally: Counter) -> tuple[str, ...]:
    """Whitespace collapsed, weight syntax kept (a caption the engine's parser throws on is
    skipped), like every corpus prompt (prompt_syntax.training_text)."""
    caps = tuple(training_text(" ".join(c.split()), tally) for c in values
                 if isinstance(c, str) and c.strip())
    caps = tuple(c for c in caps if c)
    if not caps:
        tally["no_caption"] += 1
    return caps


# ---- readers ----------------------------------------------------------------------------
def flickr_entries(folder: Path, tally: Counter) -> Iterator[ImageEntry]:
    from pyarrow import csv

    folder = Path(folder)
    table = csv.read_csv(folder / "flickr_annotations_30k.csv",
                         convert_options=csv.ConvertOptions(include_columns=["filename", "raw"]))
    zf = zipfile.ZipFile(folder / "flickr30k-images.zip")
    members = {Path(i.filename).name: i for i in zf.infolist()
               if not i.is_dir() and i.filename.lower().endswith(IMAGE_SUFFIXES)}
    for name, raw in zip(table.column("filename").to_pylist(), table.column("raw").to_pylist()):
        try:
            caps = _clean_captions(json.loads(raw), tally) if raw else ()
        except (ValueError, TypeError):
            caps = ()
            tally["bad_caption"] += 1
        if not caps:
            continue
        info = members.get(Path(str(name)).name)
        if info is None:
            tally["missing_image"] += 1
            continue
        yield ImageEntry("flickr30k", info.filename, caps,
                         lambda info=info: zf.read(info))


def coco_entries(folder: Path, tally: Counter, image_col: str = "image",
                 caption_col: str = "sentences_raw") -> Iterator[ImageEntry]:
    import pyarrow.parquet as pq

    for path in sorted(Path(folder).glob("data/*.parquet")):
        pf = pq.ParquetFile(path)
        cache: dict[int, list] = {}

        def load(rg: int, row: int, pf=pf, cache=cache) -> bytes:
            if rg not in cache:  # one row group of images in memory at a time
                cache.clear()
                cache[rg] = pf.read_row_group(rg, columns=[image_col]).column(0).to_pylist()
            value = cache[rg][row]
            data = value.get("bytes") if isinstance(value, dict) else value
            if not isinstance(data, (bytes, bytearray)):
                raise OSError("no image bytes in this row")
            return bytes(data)

        for rg in range(pf.num_row_groups):
            caps_col = pf.read_row_group(rg, columns=[caption_col]).column(0).to_pylist()
            for row, caps in enumerate(caps_col):
                caps = _clean_captions([caps] if isinstance(caps, str) else caps or [], tally)
                if caps:
                    yield ImageEntry("coco_captions", f"{path.stem}:{rg}:{row}", caps,
                                     lambda rg=rg, row=row, load=load: load(rg, row))


def folder_entries(root: Path, tally: Counter) -> Iterator[ImageEntry]:
    root = Path(root)
    if not root.is_dir():
        raise UserError(f"image folder {root} does not exist; fix corpus.image_folders.")
    source = "folder:" + root.name
    for path in sorted(root.rglob("*")):
        if not (path.is_file() and path.suffix.lower() in IMAGE_SUFFIXES):
            continue
        side = path.with_suffix(".txt")
        caps: tuple[str, ...] = ()
        if side.is_file():
            try:
                caps = _clean_captions(side.read_text(encoding="utf-8").splitlines(), tally)
            except (UnicodeDecodeError, OSError):
                tally["bad_caption"] += 1
        else:
            tally["no_caption"] += 1
        yield ImageEntry(source, path.relative_to(root).as_posix(), caps, path.read_bytes)


# ---- storing and splitting ----------------------------------------------------------------
def check_image(data: bytes) -> str | None:
    """The file suffix for the image's real format, or None when it does not fully decode."""
    from PIL import Image, UnidentifiedImageError

    try:
        with Image.open(io.BytesIO(data)) as im:
            fmt = im.format
            if fmt == "JPEG":
                im.draft("RGB", (64, 64))  # decode at 1/8 scale: still reads every byte
            im.load()
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, Image.DecompressionBombError):
        return None
    return FORMAT_SUFFIX.get(fmt)


def store_image(entry: ImageEntry, images_dir: Path, tally: Counter) -> StoredImage | None:
    """Copy the picture into `images_dir` under its content hash; None (counted) when it
    cannot be read or is not an image."""
    try:
        data = entry.load()
    except (OSError, KeyError, zipfile.BadZipFile):  # a vanished file, a broken zip member
        tally["unreadable"] += 1
        return None
    suffix = check_image(data)
    if suffix is None:
        tally["corrupt"] += 1
        return None
    digest = hashlib.sha256(data).hexdigest()
    path = Path(images_dir) / f"{digest[:24]}{suffix}"
    if not (path.is_file() and path.stat().st_size == len(data)):
        atomic.write_bytes(path, data)
    return StoredImage(path, digest, entry.captions, entry.source, entry.key)


def split_and_store(entries: list[ImageEntry], n_val: int, images_dir: Path, seed: int,
                    tally: Counter, n_train: int | None = None,
                    ) -> tuple[list[StoredImage], list[StoredImage]]:
    """Shuffle (seeded), store val first, then train; a train picture whose content is a val
    picture is dropped (counted `same_as_val`), so val images never appear in train."""
    order = list(entries)
    random.Random(seed).shuffle(order)
    val: list[StoredImage] = []
    pos = 0
    while len(val) < n_val and pos < len(order):
        got = store_image(order[pos], images_dir, tally)
        pos += 1
        if got is not None and all(v.sha256 != got.sha256 for v in val):
            val.append(got)
    val_hashes = {v.sha256 for v in val}
    train: list[StoredImage] = []
    seen: set[str] = set()
    for entry in order[pos:]:
        if n_train is not None and len(train) >= n_train:
            break
        got = store_image(entry, images_dir, tally)
        if got is None:
            continue
        if got.sha256 in val_hashes:
            tally["same_as_val"] += 1
        elif got.sha256 in seen:
            tally["duplicate"] += 1
        else:
            seen.add(got.sha256)
            train.append(got)
    return val, train


def describe_tally(tally: Counter) -> str:
    words = {
        "no_caption": "without a caption",
        "bad_caption": "with unreadable captions",
        "missing_image": "listed but missing from the zip",
        "unreadable": "unreadable",
        "corrupt": "corrupt or not images",
        "same_as_val": "train copies of val images dropped",
        "duplicate": "duplicates dropped",
        "syntax_error": "captions with a weight the engine cannot read skipped",
    }
    return ", ".join(f"{n} {words.get(k, k)}" for k, n in sorted(tally.items()) if n) or "none"
