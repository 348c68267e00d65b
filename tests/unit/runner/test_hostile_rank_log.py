"""A follower rank's log (ranks/rank-NNNNN.log) in a planted project: a link in the log's
place, or a ranks/ folder linked outside, gets nothing written; the rank stops with one
sentence on stderr (the launcher appends it to pipeline.log), as pipeline.log does."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from gguf_trainer.base.exit_codes import EXIT_OK, EXIT_USER
from gguf_trainer.base.paths import ProjectPaths
from gguf_trainer.runner import control, follower

PACK = "t5xxl_pixart"
LINE = "rank output that must stay in the project"


@pytest.fixture
def paths(tmp_path, monkeypatch) -> ProjectPaths:
    root = tmp_path / "proj"
    control.new_project(root, PACK, overrides={"export.output_dir": str(tmp_path / "out")})
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    return ProjectPaths(root)


@pytest.fixture
def followed(monkeypatch) -> list[int]:
    """The rank's work replaced by one log line (no process group in a unit test)."""
    ran: list[int] = []

    def fake_follow(paths, w):
        logging.getLogger("gguf_trainer.follower").info(LINE)
        ran.append(w.rank)
        return EXIT_OK

    monkeypatch.setattr(follower, "_follow", fake_follow)
    return ran


@pytest.fixture
def victim(tmp_path) -> Path:
    path = tmp_path / "home" / ".bashrc"
    path.parent.mkdir()
    path.write_text("# the user's own file\n")
    return path


def test_the_rank_log_is_written_in_the_project(paths, followed):
    assert follower.main(paths) == EXIT_OK and followed == [1]
    assert LINE in paths.rank_log(1).read_text()


def test_a_rank_log_linked_outside_gets_nothing(paths, followed, victim, capsys):
    paths.ranks.mkdir()
    paths.rank_log(1).symlink_to(victim)
    assert follower.main(paths) == EXIT_USER
    assert victim.read_text() == "# the user's own file\n"
    assert followed == []  # the rank did no work it could not log
    err = capsys.readouterr().err
    assert "symbolic link" in err and "Traceback" not in err


def test_a_ranks_folder_linked_outside_gets_no_log(paths, followed, victim, capsys):
    paths.ranks.symlink_to(victim.parent, target_is_directory=True)
    assert follower.main(paths) == EXIT_USER
    assert sorted(p.name for p in victim.parent.iterdir()) == [".bashrc"]
    assert "inside the project" in capsys.readouterr().err
