"""A follower rank (rank > 0 of a launched run): no lock, no state.json. It waits for rank 0
to name each stage, does its part of the distributed ones (precompute shards k with
k mod N == rank, its slice of every training batch) and reports in ranks/rank-NNNNN.json;
its log is ranks/rank-NNNNN.log. See gguf_trainer.runner.ranks.
"""

from __future__ import annotations

import contextlib
import io
import logging
import signal
import sys

from gguf_trainer.base import project_file
from gguf_trainer.base.errors import UserError, as_user_error
from gguf_trainer.base.exit_codes import EXIT_INTERNAL, EXIT_OK, EXIT_USER
from gguf_trainer.machine import distributed
from gguf_trainer.runner import processes, ranks

log = logging.getLogger("gguf_trainer.follower")


def main(paths) -> int:
    w = distributed.world()
    try:  # like pipeline.log: never through a planted link, only inside the project
        project_file.make_dir(paths.root, paths.ranks)
        out = project_file.open_append(paths.root, paths.rank_log(w.rank))
    except UserError as e:  # the launcher appends this rank's stderr to pipeline.log
        print(str(e), file=sys.stderr)
        return EXIT_USER
    handler = logging.StreamHandler(io.TextIOWrapper(out, encoding="utf-8"))
    handler.setFormatter(logging.Formatter(processes.LOG_FORMAT))
    root = logging.getLogger()
    root.addHandler(handler)
    root.setLevel(logging.INFO)
    try:
        return _follow(paths, w)
    finally:
        root.removeHandler(handler)
        handler.close()
        handler.stream.close()  # StreamHandler.close leaves its stream open


def _follow(paths, w) -> int:
    from gguf_trainer.machine import hardware
    from gguf_trainer.runner.stages import RunContext, stage_objects
    from gguf_trainer.store.project import load_project

    distributed.init(cpu=distributed.wants_cpu(load_project(paths.root)))
    run_id = ranks.hello(paths, None)
    report = ranks.RankReport(paths, run_id)
    # Ctrl-C reaches every rank, and the launcher passes it on as SIGTERM: both stop after
    # the unit, as rank 0 does (it decides the step; a dead rank 0 fails our collectives).
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, lambda *_: report.request_stop())
    log.info("rank %d of %d joined run %s", w.rank, w.size, run_id)
    objs = {s.name: s for s in stage_objects()}
    run = RunContext()
    try:
        while True:
            msg = distributed.broadcast_object(None)
            if "end" in msg:
                log.info("rank 0 ended the run (%s)", msg["end"])
                report.close(msg["end"])
                return EXIT_OK
            name = msg["stage"]
            stage = objs[name]
            if not stage.distributed:
                continue
            ranks.stage_groups(name)
            project = load_project(paths.root)  # rank 0 may have recorded run settings
            hardware.pin_threads(distributed.rank_threads(project.settings.train.threads))
            run.release(keep=set(stage.shares))  # e.g. the teacher, once no stage needs it
            if stage.own_ranks_only and w.rank >= distributed.stage_ranks(project, name):
                continue
            run.fingerprint = msg["fingerprint"]
            report.begin_stage(name)
            outcome = stage.run(project, report, run)
            report.end_stage(name, outcome)
    except Exception as e:  # the rank's sentence goes to its file; rank 0 ends the run
        user = e if isinstance(e, UserError) else as_user_error(e, fallback=paths.root)
        if user is not None:
            log.error("%s", user)
            report.fail(str(user))
            return EXIT_USER
        log.exception("rank %d failed", w.rank)
        log_name = paths.rank_log(w.rank).relative_to(paths.root)
        report.fail(f"internal error ({type(e).__name__}: {e}); the traceback is in {log_name}")
        return EXIT_INTERNAL
    finally:
        with contextlib.suppress(Exception):
            run.release(keep=set())
