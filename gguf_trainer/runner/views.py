"""What the control API returns: plain dataclasses (`asdict()` gives the JSON a GUI API
returns). runner/control/ fills them; the CLI and the GUI read them."""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from gguf_trainer.base.errors import quote


@dataclass
class ProjectView:
    """What `open_project` sees. `ok` is False when project.json is broken: `errors` then
    says what to fix (one sentence each) and `settings` is the raw JSON if it parsed."""

    root: str
    ok: bool
    settings: dict | None
    version: str | None
    pack: dict | None
    errors: list[str] = field(default_factory=list)
    status: dict | None = None

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class SettingsRead:
    """project.json as read: `values` (nested, every key, defaults filled) and `version`, an
    opaque token of the file's bytes; pass this object (or its `values`) back to
    `update_settings` so fields changed on disk in between are not overwritten."""

    values: dict
    version: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class UpdateResult:
    """What `update_settings` did.

    applied    {dotted field: new value} written to project.json
    conflicts  {dotted field: {"read": value the caller saw, "disk": value on disk now,
               "yours": the requested value}}: changed on disk since the read; NOT written
    refused    {dotted field: sentence}: a live run would be invalidated by the change
    errors     {dotted field: sentence}: the value is invalid (then NOTHING is written)
    version    the token of project.json after the call
    """

    applied: dict = field(default_factory=dict)
    conflicts: dict = field(default_factory=dict)
    refused: dict = field(default_factory=dict)
    errors: dict = field(default_factory=dict)
    version: str | None = None

    @property
    def ok(self) -> bool:
        return not (self.conflicts or self.refused or self.errors)

    def message(self) -> str:
        """One line per problem, or "saved"; what the CLI prints."""
        lines = list(self.errors.values())  # each sentence names its field
        lines += [f"{k}: {v}" for k, v in self.refused.items()]
        lines += [f"{k}: changed on disk to {quote(c['disk'])} since it was read; not overwritten "
                  "(reload and try again)" for k, c in self.conflicts.items()]
        return "\n".join(lines) or "saved"

    def as_dict(self) -> dict:
        return {**asdict(self), "ok": self.ok, "message": self.message()}


@dataclass
class RunPlan:
    """What `preflight_run` checked and resolved for a run: the planned steps to store (None:
    unchanged), the launch (runner.launch.Launch), a line per material it linked."""

    steps: int | None
    launch: object
    linked: list[str] = field(default_factory=list)


@dataclass
class StepsResult:
    """`set_steps`: the stored count, whether a live run picks it up, and one sentence."""

    steps: int
    live: bool
    picked_up: bool
    message: str

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ResetPlan:
    """Exactly what `reset(root, target)` deletes (`delete`), and what it would leave alone
    with the reason (`keep`: [{"path", "reason"}]), e.g. a recorded export whose hash changed."""

    target: str
    delete: list[str]
    keep: list[dict]
    blocked: str | None = None  # why reset is refused right now (a run or a job is live)

    def as_dict(self) -> dict:
        return asdict(self)


@dataclass
class ResetResult:
    target: str
    deleted: list[str]
    kept: list[dict]

    def as_dict(self) -> dict:
        return asdict(self)
