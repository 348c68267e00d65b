"""The control API's materials: their statuses, downloads started, a copy linked, the teacher
code trusted, the Hugging Face token stored. Torch-free, like all of runner.control."""

from __future__ import annotations

from pathlib import Path

from gguf_trainer.runner.control.helpers import PathLike, _paths, _root


# ---- materials, downloads, teacher code trust, the Hugging Face token -------------------
# The CLI and the GUI reach these through here only (the GUI never looks modules up by name).
def material_statuses(root: PathLike, online: bool = False) -> list[dict]:
    """Each material's status: [{id, title, state (missing|partial|downloading|ready|failed),
    bytes_done, bytes_total, rate_bps, eta_s, path, required, error, ...}]."""
    from gguf_trainer.runner import downloads

    return downloads.material_statuses(_root(root), online=online)


def start_download(root: PathLike, ids: list[str] | None = None) -> list[dict]:
    """Detached downloads of the missing materials (or of `ids`); one already downloading is
    reported, never started twice: [{id, action, pid, message}]."""
    from gguf_trainer.runner import downloads

    return downloads.start_download(_root(root), list(ids) if ids else None)


def link_material(root: PathLike, material_id: str, path: PathLike) -> dict:
    """Use a complete copy at `path` for a material (checked first; a GGUF for the student):
    the material's status row after."""
    from gguf_trainer.runner import downloads

    return downloads.link_material(_root(root), material_id, path)


def untrusted_code(root: PathLike) -> list[dict]:
    """The project's ready snapshots whose own Python code is not trusted (yet, or since it
    changed): trust_status of each with its material `title`."""
    from gguf_trainer.teachers import trust

    out = []
    for m in material_statuses(root):
        path = m.get("path")
        if (
            m.get("kind") == "hf_snapshot"
            and m.get("state") == "ready"
            and path
            and Path(path).is_dir()
        ):
            st = trust.trust_status(path)
            if not st["trusted"]:
                out.append({**st, "title": m.get("title") or m["id"]})
    return out


def trust_code(root: PathLike) -> list[str]:
    """The user trusts every untrusted snapshot's code of the project as it is now (the GUI's
    button); the folders trusted."""
    from gguf_trainer.teachers import trust

    return [trust.confirm_trust(it["path"])["path"] for it in untrusted_code(root)]


def token_status() -> str:
    """One line on the Hugging Face token (stored, HF_TOKEN, or none); never the token."""
    from gguf_trainer.materials import hub

    return hub.token_status()


def store_token(token: str) -> str:
    """Store a Hugging Face token where huggingface_hub reads it (0600); the status line."""
    from gguf_trainer.materials import hub

    return hub.store_token(token)


def confirm_trust(root: PathLike) -> str:
    """`--trust-remote-code` on run/start/download: confirm the project's teacher code as it
    is now and say what was trusted, in one line (torch-free: the CLI calls it)."""
    from gguf_trainer.materials import materials
    from gguf_trainer.store import project

    proj = project.load_project(_paths(root).root)
    st = materials.confirm_project_trust(proj)
    if st is None:
        return (
            f"--trust-remote-code: nothing to trust ({proj.pack.title} runs no teacher code "
            "of its own here, or its teacher is not downloaded yet)"
        )
    return (
        f"trusted the teacher code in {st['path']} ({len(st['files'])} .py files, sha256 "
        f"{st['code_hash'][:12]}); a change to it will ask again"
    )
