"""The control API's publishing: what `publish` would send (or why it refuses, with no request
made) and the publish itself (runner/publish.py). Torch-free; runs in the caller's process
(an adapter and its card are a few hundred MB at most, and the client shows its progress)."""

from __future__ import annotations

from gguf_trainer.base.errors import UserError
from gguf_trainer.runner.control.helpers import PathLike, _root


def publish_plan(root: PathLike) -> dict:
    """{"files": names publish sends by default (README.md last), "refused": the sentence it
    would refuse with, or None, "logged_in": whether a token is there}. No request is made."""
    from gguf_trainer.materials.hub import has_token
    from gguf_trainer.runner import publish as publish_mod

    try:
        _project, adapters, companions = publish_mod.prepare(_root(root))
    except UserError as e:
        return {"files": [], "refused": str(e), "logged_in": has_token()}
    names = [f["name"] for f in [*adapters, *companions]] + ["README.md"]
    return {"files": names, "refused": None, "logged_in": has_token()}


def publish(root: PathLike, repo: str, private: bool = False, files: list[str] | None = None,
            license_id: str | None = None) -> dict:
    """Publish the project's adapter(s) and model card to `repo` in one commit; see
    runner.publish.publish (UserError, one sentence, for anything refused or failed)."""
    from gguf_trainer.runner import publish as publish_mod

    return publish_mod.publish(_root(root), repo, private, files, license_id)
