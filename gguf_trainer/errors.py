"""Errors a user can cause. Raise `UserError` with one sentence that names the thing and the fix.

Only the edges (cli.main, the pipeline process, the UI) catch it; they show the sentence,
never a traceback. Programmer errors are ordinary exceptions and propagate.
"""


class UserError(Exception):
    """Something the user can fix: a bad path, a wrong file, a bad setting, a held lock."""


class NoProjectError(UserError):
    """The folder is not a project (no project.json). The CLI exits 2 for it."""
