"""The command line that runs the pipeline on several processes or machines: accelerate's own
launcher (`python -m accelerate.commands.launch`, i.e. `accelerate launch`) in front of
`python -m gguf_trainer.runner.pipeline`. One process needs no launcher.

    Launch(processes=2).argv(pipeline_argv)          two ranks on this machine
    Launch(processes=4, num_machines=2, machine_rank=1, main_process_ip="10.0.0.1")
    Launch(config_file="acc.yaml")                   an `accelerate config` file, as it is

Several machines share the project folder; machine rank 0 holds the lock and owns the state
(gguf_trainer.machine.distributed). Torch-free: the CLI and the supervisor build it.
"""

from __future__ import annotations

import os
import socket
import sys
from dataclasses import dataclass

from gguf_trainer.base.errors import UserError

ACCELERATE = [sys.executable, "-m", "accelerate.commands.launch"]
PIPELINE_MODULE = "gguf_trainer.runner.pipeline"


@dataclass
class Launch:
    processes: int | None = None  # per machine; None: from the project's settings
    num_machines: int = 1
    machine_rank: int = 0
    main_process_ip: str | None = None
    main_process_port: int | None = None
    config_file: str | None = None
    per_stage: bool = False  # the count came from the settings: each stage uses its own

    @property
    def several_machines(self) -> bool:
        return self.num_machines > 1 or self.config_file is not None

    @property
    def is_main_machine(self) -> bool:
        return self.machine_rank == 0

    def check(self) -> None:
        if self.processes is not None and self.processes < 1:
            raise UserError(
                f"--processes {self.processes} is not a count of processes; give 1 or more."
            )
        if self.num_machines < 1 or not 0 <= self.machine_rank < self.num_machines:
            raise UserError(
                f"--machine-rank {self.machine_rank} is not one of the "
                f"{self.num_machines} machines (0..{self.num_machines - 1})."
            )
        if self.num_machines > 1 and not self.main_process_ip:
            raise UserError(
                "several machines need --main-process-ip (the address of machine "
                "rank 0, reachable from every machine)."
            )
        if self.config_file is not None and not os.path.isfile(self.config_file):
            raise UserError(
                f"--accelerate-config {self.config_file} is not a file; make one "
                "with `accelerate config --config_file FILE`."
            )

    def resolved(self, project_settings=None) -> Launch:
        """The processes per machine: the flag, else the larger of the project's
        precompute.processes and train.processes."""
        if self.processes is not None or project_settings is None:
            return self
        n = max(project_settings.precompute.processes, project_settings.train.processes)
        return Launch(
            n,
            self.num_machines,
            self.machine_rank,
            self.main_process_ip,
            self.main_process_port,
            self.config_file,
            per_stage=True,
        )

    def needed(self) -> bool:
        return (self.processes or 1) > 1 or self.several_machines

    def argv(self, pipeline_args: list[str]) -> list[str]:
        """`pipeline_args` are the pipeline module's own arguments (--project DIR ...)."""
        if not self.needed():
            return [sys.executable, "-m", PIPELINE_MODULE, *pipeline_args]
        cmd = list(ACCELERATE)
        if self.config_file is not None:
            cmd += ["--config_file", self.config_file]
        else:
            n = self.processes or 1
            port = self.main_process_port or (free_port() if self.num_machines == 1 else 29500)
            # --multi_gpu is accelerate's torchrun launcher; on a machine without CUDA the
            # ranks use gloo (machine.distributed.init). --num_processes counts all machines.
            cmd += [
                "--multi_gpu",
                "--num_processes",
                str(n * self.num_machines),
                "--num_machines",
                str(self.num_machines),
                "--machine_rank",
                str(self.machine_rank),
                "--main_process_port",
                str(port),
                "--mixed_precision",
                "no",
                "--dynamo_backend",
                "no",
                "--monitor_interval",
                "0.5",
            ]
            if self.main_process_ip:
                cmd += ["--main_process_ip", self.main_process_ip]
        return cmd + ["-m", PIPELINE_MODULE, *pipeline_args]

    def env(self) -> dict[str, str]:
        """Environment for the launched ranks: with a flag (not per-stage settings) every
        stage uses every rank."""
        env = dict(os.environ)
        if self.needed() and (self.several_machines or not self.per_stage):
            env["GGUF_TRAINER_PROCESSES_ALL"] = "1"
        return env


def free_port() -> int:
    """A TCP port nobody listens on now (the rendezvous of a one-machine launch)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]
