"""Trusting a teacher snapshot's own Python code (`trust_remote_code`): a decision made once.

Owns: the trust records (`<GGUF_TRAINER_HOME>/trusted_code.json`, default ~/.gguf-trainer):
one per snapshot folder, holding its resolved path and the sha256 over its `*.py` files. A
snapshot whose code changed since it was confirmed needs confirming again. Must not: import
torch or transformers (the CLI and the GUI call it), or load any model.

    status = trust_status(root)        # {"trusted": bool, "reason": ..., "code_hash": ..., ...}
    confirm_trust(root)                # the user said yes (CLI --trust-remote-code, GUI button)
    require_trust(root)                # before loading: UserError with how to confirm

The CLI (`--trust-remote-code` on run/start/download) and the GUI go through the project-level
functions at the end: project_trust_status, confirm_project_trust, require_project_trust.
"""

from __future__ import annotations

import hashlib
import os
import time
from pathlib import Path

from gguf_trainer.base import atomic
from gguf_trainer.base.errors import UserError

HOME_ENV = "GGUF_TRAINER_HOME"  # the same home the supervisor uses for its settings
DEFAULT_HOME = "~/.gguf-trainer"
TRUST_JSON = "trusted_code.json"
SKIP_DIRS = (".cache", "__pycache__")  # huggingface_hub's download state, bytecode


def trust_store() -> Path:
    return Path(os.environ.get(HOME_ENV) or DEFAULT_HOME).expanduser() / TRUST_JSON


def code_files(root) -> list[Path]:
    """The snapshot's Python files, sorted by relative path."""
    root = Path(root)
    return sorted((p for p in root.rglob("*.py")
                   if p.is_file() and not any(s in p.relative_to(root).parts for s in SKIP_DIRS)),
                  key=lambda p: p.relative_to(root).as_posix())


def code_hash(root) -> str:
    """sha256 over (relative path, bytes) of every `*.py` in the snapshot; part of the
    teacher's identity, so changed code also means new targets."""
    root = Path(root)
    h = hashlib.sha256()
    for p in code_files(root):
        rel = p.relative_to(root).as_posix().encode()
        data = p.read_bytes()
        h.update(len(rel).to_bytes(8, "little") + rel + len(data).to_bytes(8, "little") + data)
    return h.hexdigest()


def _records() -> dict:
    try:
        data = atomic.read_json(trust_store(), {})
    except ValueError:  # hand-edited into invalid JSON: trust nothing until confirmed again
        return {}
    return data.get("snapshots", {}) if isinstance(data, dict) else {}


def _key(root) -> str:
    return str(Path(root).expanduser().resolve())


def trust_status(root) -> dict:
    """Whether the snapshot's current code is trusted. reason: None (trusted), "never"
    (no record), "changed" (a record for other code), "no_code" (nothing to trust)."""
    key = _key(root)
    files = [p.relative_to(key).as_posix() for p in code_files(key)]
    digest = code_hash(key)
    rec = _records().get(key)
    if not files:
        reason = "no_code"
    elif rec is None:
        reason = "never"
    elif rec.get("code_hash") != digest:
        reason = "changed"
    else:
        reason = None
    return {"path": key, "trusted": reason in (None, "no_code"), "reason": reason,
            "code_hash": digest, "files": files, "confirmed_at": (rec or {}).get("time")}


def confirm_trust(root) -> dict:
    """Record that the user trusts the snapshot's code as it is now; returns trust_status."""
    key = _key(root)
    if not Path(key).is_dir():
        raise UserError(f"{key} is not a folder; download the teacher first, then confirm.")
    store = trust_store()
    store.parent.mkdir(parents=True, exist_ok=True)
    records = _records()
    records[key] = {"code_hash": code_hash(key), "files": [p.relative_to(key).as_posix()
                                                          for p in code_files(key)],
                    "time": time.time()}
    atomic.write_json(store, {"snapshots": records})
    return trust_status(key)


def revoke_trust(root) -> None:
    records = _records()
    if records.pop(_key(root), None) is not None:
        atomic.write_json(trust_store(), {"snapshots": records})


def require_trust(root, project_dir=None) -> str:
    """The code hash when the snapshot's code is trusted; otherwise UserError with one
    sentence saying how to confirm (before anything of the snapshot is imported)."""
    st = trust_status(root)
    if st["trusted"]:
        return st["code_hash"]
    where = f"--project {project_dir}" if project_dir else "--project DIR"
    files = ", ".join(st["files"][:3]) + (" …" if len(st["files"]) > 3 else "")
    what = ("its Python code changed since you confirmed it" if st["reason"] == "changed"
            else "it runs its own Python code")
    raise UserError(
        f"the teacher snapshot {st['path']} is not trusted yet: {what} ({files}); "
        f"read it, then confirm once with `gguf-trainer run {where} --trust-remote-code` "
        "(or Trust remote code under Setup → Materials)."
    )
