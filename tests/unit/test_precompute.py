"""materials.file_sha256: the persistent hash cache of big input files."""

import hashlib
import json
import os

from gguf_trainer.materials import file_sha256


def test_sha256_is_cached_by_path_size_and_mtime(tmp_path):
    data, cache = tmp_path / "student.gguf", tmp_path / "hashes.json"
    data.write_bytes(b"GGUF" + b"x" * 1000)
    first = file_sha256(data, cache)
    assert first == hashlib.sha256(data.read_bytes()).hexdigest()
    key = next(iter(json.loads(cache.read_text())))
    # A cached entry is trusted while size and mtime hold (proof: a doctored entry is returned).
    cache.write_text(json.dumps({key: "cached"}))
    assert file_sha256(data, cache) == "cached"
    data.write_bytes(b"GGUF" + b"y" * 1000)  # same size, new content and mtime
    os.utime(data, ns=(1, 2))
    assert file_sha256(data, cache) == hashlib.sha256(data.read_bytes()).hexdigest()
    assert len(json.loads(cache.read_text())) == 2
