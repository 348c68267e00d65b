"""The Xet half of the local Hub (hub_server.py): what huggingface_hub 2.4 + hf_xet 1.8 call when
Xet is on (no HF_HUB_DISABLE_XET and a `XetStore` set as the server's `xet`): the write token
and the CAS the token names (this same server).

    GET  /api/{models|datasets}/{repo}/xet-write-token/{rev}   {"casUrl", "accessToken", "exp"}
    GET  /v1/chunks/default/{hash}                             global dedup: 404, none known
    POST /v1/xorbs/default/{hash}                              a xorb (chunk headers + bytes)
    POST /v2/shards                                            404: the client falls back to v1
    POST /v1/shards                                            the shard naming each file's
                                                               sha256 and its xorb chunk ranges
    POST /v1/telemetry                                         accepted, ignored

A shard's files are rebuilt from the stored xorbs (a shard naming a xorb the CAS lacks is
refused, as the CAS does) and kept by sha256, so the commit's `lfsFile` entries resolve as LFS
objects do and `repo.files` holds the real bytes. Xorbs stay stored whether or not a shard or a
commit names them, as on the Hub. Limits of this fake: chunks must be stored uncompressed
(the tests set HF_XET_XORB_COMPRESSION_POLICY=none; hf_xet's LZ4 and byte-grouping are not
decoded), no upload grants (hf_xet falls back to the direct xorb upload), no global dedup.

Test controls: `hold_xorb(n)`: the n-th xorb POST waits until `release_xorbs()`, then ends
unstored (a body cut off by a kill); `xorb_posts` every xorb POST's hash in order, whole or not.
"""

from __future__ import annotations

import hashlib
import re
import secrets
import struct
import threading
import time
from urllib.parse import urlsplit

TOKEN_ROUTE = re.compile(r"^/api/(models|datasets)/(.+?)/xet-write-token/([^/]+)$")
XORB_ROUTE = re.compile(r"^/v1/xorbs/default/([0-9a-f]{64})$")
BOOKEND = b"\xff" * 32
HAS_VERIFICATION, HAS_METADATA_EXT = 0x80000000, 0x40000000  # a file header's flags
RECORD = 48  # every shard record (header, entry, verification, metadata ext, bookend)


def xet_hex(raw: bytes) -> str:
    """A 32-byte hash as Xet writes it in hex: four little-endian u64 words, each printed."""
    return "".join(raw[i:i + 8][::-1].hex() for i in range(0, 32, 8))


def xorb_chunks(data: bytes) -> list[bytes]:
    """A xorb's chunks: 8-byte headers (version, compressed size u24, scheme, size u24), each
    followed by its bytes. ValueError for anything but whole uncompressed chunks."""
    out, pos = [], 0
    while pos < len(data):
        if pos + 8 > len(data):
            raise ValueError("a torn chunk header")
        size = int.from_bytes(data[pos + 1:pos + 4], "little")
        scheme, plain = data[pos + 4], int.from_bytes(data[pos + 5:pos + 8], "little")
        if scheme != 0 or size != plain:
            raise ValueError(f"compression scheme {scheme} is not spoken by this fake")
        out.append(data[pos + 8:pos + 8 + size])
        pos += 8 + size
        if len(out[-1]) != size:
            raise ValueError("a torn chunk")
    return out


def shard_files(data: bytes) -> list[tuple[str | None, list[tuple[str, int, int]]]]:
    """The file section of an uploaded shard: [(sha256 hex, [(xorb hash, first chunk,
    end chunk)])] (the 48-byte header, then per file a header, its entries, their verification
    records and the metadata ext holding the sha256; a bookend closes the section)."""
    files, pos = [], RECORD
    while data[pos:pos + 32] != BOOKEND:
        flags, n = struct.unpack_from("<II", data, pos + 32)
        pos += RECORD
        entries = []
        for _ in range(n):
            _cas_flags, _size, first, end = struct.unpack_from("<IIII", data, pos + 32)
            entries.append((xet_hex(data[pos:pos + 32]), first, end))
            pos += RECORD
        if flags & HAS_VERIFICATION:
            pos += RECORD * n
        sha = None
        if flags & HAS_METADATA_EXT:
            sha = xet_hex(data[pos:pos + 32])
            pos += RECORD
        files.append((sha, entries))
    return files


class XetStore:
    """The CAS's state: xorbs by hash, files rebuilt from shards by sha256, holds."""

    def __init__(self):
        self.xorbs: dict[str, bytes] = {}
        self.files: dict[str, bytes] = {}
        self.xorb_posts: list[str] = []
        self.tokens: set[str] = set()
        self._lock = threading.Lock()
        self._hold_n: int | None = None
        self._held = threading.Event()
        self._released = threading.Event()

    def hold_xorb(self, n: int) -> None:
        self._hold_n = n

    def xorb_held(self) -> bool:
        return self._held.is_set()

    def release_xorbs(self) -> None:
        self._hold_n = None
        self._released.set()


class _XetRoutes:
    """The Xet routes (module docstring); mixed into the handler with the upload routes."""

    hub: object  # hub_server.HubServer, with `xet` a XetStore when Xet is spoken

    def _xet_get(self) -> bool:
        """Answer a Xet GET; False when the request is not one (the Hub's reads take it)."""
        xet = getattr(self.hub, "xet", None)
        raw = urlsplit(self.path).path
        if xet is None or not (TOKEN_ROUTE.match(raw) or raw.startswith("/v1/")):
            return False
        self.hub._record(self.command, raw, {k.lower(): v for k, v in self.headers.items()})
        if TOKEN_ROUTE.match(raw):
            if self._authorized():
                token = "xet_" + secrets.token_hex(8)
                xet.tokens.add(token)
                self._reply(200, {"casUrl": self.hub.url, "accessToken": token,
                                  "exp": int(time.time()) + 3600})
            return True
        self._error(404, "", "no chunk of this hash is known")  # global dedup: none
        return True

    def _xet_post(self, raw: str) -> bool:
        xet = getattr(self.hub, "xet", None)
        if xet is None or not raw.startswith(("/v1/", "/v2/")):
            return False
        if self.headers.get("Authorization", "")[7:] not in xet.tokens:
            self._body()
            self._error(401, "", "not a Xet token this CAS issued")
            return True
        m = XORB_ROUTE.match(raw)
        if m:
            self._xorb(xet, m.group(1))
        elif raw == "/v1/shards":
            self._shard(xet, self._body())
        else:  # /v2/shards (404: v1 instead), telemetry
            self._body()
            if raw == "/v1/telemetry":
                self._reply(200, {})
            else:
                self._error(404, "", "not spoken by this CAS")
        return True

    def _xorb(self, xet: XetStore, oid: str) -> None:
        with xet._lock:
            xet.xorb_posts.append(oid)
            held = len(xet.xorb_posts) == xet._hold_n
        if held:  # killed mid-upload: the client goes while this xorb is on its way
            xet._held.set()
            xet._released.wait()
            self.close_connection = True
            return
        data = self._body()
        try:
            xorb_chunks(data)
        except ValueError as e:
            self.close_connection = True
            return self._reply(400, {"error": str(e)})
        with xet._lock:
            was = oid in xet.xorbs
            xet.xorbs[oid] = data
        self._reply(200, {"was_inserted": not was})

    def _shard(self, xet: XetStore, data: bytes) -> None:
        rebuilt = {}
        for sha, entries in shard_files(data):
            parts = []
            for cas, first, end in entries:
                if cas not in xet.xorbs:
                    return self._reply(400, {"error": f"xorb {cas} was never uploaded"})
                parts += xorb_chunks(xet.xorbs[cas])[first:end]
            body = b"".join(parts)
            if sha is None or hashlib.sha256(body).hexdigest() != sha:
                return self._reply(400, {"error": "a file's chunks do not hash to its sha256"})
            rebuilt[sha] = body
        with xet._lock:
            xet.files.update(rebuilt)
        self._reply(200, {"result": 1})


def xet_object(hub, oid: str) -> bytes | None:
    """The file the CAS rebuilt for sha256 `oid`, for the commit's lfsFile, or None."""
    xet = getattr(hub, "xet", None)
    return None if xet is None else xet.files.get(oid)

