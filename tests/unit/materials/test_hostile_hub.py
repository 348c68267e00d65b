"""A hostile Hub (tests/hub_server.py posing as one): listings that would write outside the
destination, files whose bytes are not the listed ones, bodies longer than declared, and
HTML where the API speaks JSON. Each is refused with one sentence; nothing lands outside.
Everything goes through the real huggingface_hub client.
"""

from __future__ import annotations

import hashlib

import pytest

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials import hub

PATTERN = ("default/train/*",)


def test_a_listing_entry_with_dotdot_is_refused_naming_the_repo_and_entry(hub_server, tmp_path):
    evil = "default/train/../../../../victim.parquet"
    hub_server.add_repo("org/ds", {"default/train/0.parquet": b"ok", evil: b"pwned"},
                        repo_type="dataset")
    dest = tmp_path / "a" / "b" / "c" / "dest"
    with pytest.raises(UserError) as e:
        listing = hub.list_remote("org/ds", "dataset", PATTERN)
        hub.fetch_listing(listing, dest)  # what the old code went on to do
    assert "org/ds" in str(e.value) and "victim.parquet" in str(e.value)
    assert not list(tmp_path.rglob("victim.parquet"))


@pytest.mark.parametrize("bad", ["/etc/x", "a\\..\\b", "a/./b", "a//b", "a/b\0c", "", ".."])
def test_every_path_that_could_leave_the_destination_is_refused(bad):
    with pytest.raises(UserError, match="org/m lists a file named"):
        hub.check_remote_path("org/m", bad)
    assert hub.check_remote_path("org/m", "sub/dir/model-00001.safetensors") == \
        "sub/dir/model-00001.safetensors"


def test_a_fetch_never_joins_an_unchecked_path(tmp_path):
    """A listing built by hand (or read back from a tampered listing.json) is checked too."""
    f = hub.RemoteFile("../outside.bin", 3, None, "0" * 40)
    listing = hub.Listing("org/m", "model", "main", "c" * 40, {f.path: f})
    with pytest.raises(UserError, match="outside"):
        hub.fetch_file(listing, f, tmp_path / "dest")
    assert not (tmp_path / "outside.bin").exists()


def test_small_file_with_other_bytes_of_the_same_size_is_refused(hub_server, tmp_path):
    right = b'{"d_model": 8}'
    hub_server.add_repo("org/m", {"config.json": right})
    hub_server.lie("config.json", b'{"d_model": 9}')  # same size, not the listed blob
    listing = hub.list_remote("org/m", "model", ("config.json",))
    with pytest.raises(UserError, match="config.json does not match its git blob id"):
        hub.fetch_listing(listing, tmp_path / "dest")
    assert not (tmp_path / "dest" / "config.json").exists()


def test_a_file_already_there_with_other_bytes_is_fetched_again(hub_server, tmp_path):
    right = b'{"d_model": 8}'
    hub_server.add_repo("org/m", {"config.json": right})
    dest = tmp_path / "dest"
    dest.mkdir()
    (dest / "config.json").write_bytes(b'{"d_model": 7}')  # same size, stale or tampered
    hub.fetch_listing(hub.list_remote("org/m", "model", ("config.json",)), dest)
    assert (dest / "config.json").read_bytes() == right
    assert hub.git_blob_id(dest / "config.json") == \
        hashlib.sha1(b"blob %d\0" % len(right) + right).hexdigest()


def test_a_body_longer_than_declared_stops_at_the_size(hub_server, tmp_path):
    data = bytes(range(256)) * 4096  # 1 MiB, an LFS file
    hub_server.add_repo("org/m", {"w.bin": data})
    hub_server.overflow("w.bin", 8 << 20)
    listing = hub.list_remote("org/m", "model", ("w.bin",))
    with pytest.raises(UserError, match="the server sent more than the 1048576 bytes"):
        hub.fetch_listing(listing, tmp_path / "dest")
    written = sum(p.stat().st_size for p in (tmp_path / "dest").rglob("*") if p.is_file())
    assert written < 64 << 10  # the listing.json, no partial kept, never the 8 MiB extra
    assert len(hub_server.get_requests("/w.bin")) == 1  # not asked again: it would repeat


def test_an_html_page_where_the_api_answers_json_is_a_sentence(hub_server):
    hub_server.add_repo("org/m", {"config.json": b"{}"})
    hub_server.html_api = True
    with pytest.raises(UserError) as e:
        hub.list_remote("org/m", "model", ("config.json",))
    msg = str(e.value)
    assert f"{hub_server.url}/api/models/org/m/revision/main" in msg and "not JSON" in msg


@pytest.mark.parametrize("field,value", [("sha256", "/../../../../../"), ("blob_id", "../" * 14)])
def test_a_listed_hash_that_is_not_hex_is_refused_before_any_byte_moves(
    hub_server, tmp_path, field, value
):
    """The partial file's name carries the listed hash (`<path>.<hash[:16]>.part`), so a hash
    like `/../../../../../` would put that file (appended to, truncated) outside the
    destination: a listing entry's hashes must be hex of their length."""
    data = bytes(range(256)) * 64  # 16 KiB: an LFS file, listed with a sha256
    repo = hub_server.add_repo("org/m", {"w.bin": data, "config.json": b"{}"})
    real = repo.tree_entry

    def hostile(path):
        entry = real(path)
        if field == "sha256" and "lfs" in entry:
            entry["lfs"] = {**entry["lfs"], "oid": value}
        elif field == "blob_id" and "lfs" not in entry:
            entry["oid"] = value
        return entry

    repo.tree_entry = hostile
    dest = tmp_path / "a" / "b" / "c" / "dest"
    with pytest.raises(UserError, match="org/m lists '.*' with a .* not a valid listing entry"):
        hub.fetch_listing(hub.list_remote("org/m", "model", ("*",)), dest)
    assert not hub_server.get_requests("/w.bin") and not hub_server.get_requests("/config.json")
    assert [p for p in tmp_path.rglob("*") if p.is_file() and dest not in p.parents] == []


@pytest.mark.parametrize("bad", [{"sha256": "/../../../../../"}, {"blob_id": "x" * 40},
                                 {"size": -5}, {"size": "3"}], ids=repr)
def test_a_hand_built_or_tampered_listing_entry_is_checked_at_fetch(tmp_path, bad):
    f = hub.RemoteFile(**{"path": "w.bin", "size": 3, "sha256": None, "blob_id": "0" * 40, **bad})
    listing = hub.Listing("org/m", "model", "main", "c" * 40, {f.path: f})
    with pytest.raises(UserError, match="not a valid listing entry"):
        hub.fetch_file(listing, f, tmp_path / "a" / "dest")
    assert not list(tmp_path.rglob("*.part")) and not (tmp_path / "a").exists()


def test_a_folder_in_the_destination_linked_outside_never_receives_the_download(
    hub_server, tmp_path
):
    """A link planted inside the download folder (`text_encoder -> ~/somewhere`) would take
    the listed file, and its partial, out of the destination: refused before a byte moves."""
    outside = tmp_path / "home" / "docs"
    outside.mkdir(parents=True)
    dest = tmp_path / "materials" / "teacher"
    dest.mkdir(parents=True)
    (dest / "text_encoder").symlink_to(outside, target_is_directory=True)
    hub_server.add_repo("org/m", {"text_encoder/config.json": b"{}", "config.json": b"{}"})
    listing = hub.list_remote("org/m", "model", ("*config.json",))
    with pytest.raises(UserError, match="outside its download folder .*remove that link"):
        hub.fetch_listing(listing, dest)
    assert not list(outside.iterdir())
    assert not hub_server.get_requests("/text_encoder/config.json")
    linked = tmp_path / "big-disk" / "teacher"  # the destination itself may be a link
    linked.mkdir(parents=True)
    (tmp_path / "materials" / "t2").symlink_to(linked, target_is_directory=True)
    hub.fetch_listing(hub.list_remote("org/m", "model", ("config.json",)),
                      tmp_path / "materials" / "t2")
    assert (linked / "config.json").read_bytes() == b"{}"
