"""Talking to the engine tier's tokenizer driver (probe.cpp): one process answering one line per
command, texts hex-encoded; shared by the tier's test modules."""

from __future__ import annotations

import subprocess
import time


class Driver:
    def __init__(self, path, env=None):
        self.path = path
        self.proc = subprocess.Popen([str(path)], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                                     stderr=subprocess.DEVNULL, text=True, encoding="utf-8",
                                     env=env)
        self.calls = 0
        self.seconds = 0.0

    def ask(self, *parts) -> str:
        t0 = time.perf_counter()
        self.proc.stdin.write(" ".join(str(p) for p in parts) + "\n")
        self.proc.stdin.flush()
        line = self.proc.stdout.readline().rstrip("\n")
        self.calls += 1
        self.seconds += time.perf_counter() - t0
        assert line and not line.startswith("error"), line
        return line

    def close(self):
        self.proc.stdin.close()
        self.proc.wait(timeout=60)


def hexs(text: str) -> str:
    return text.encode("utf-8").hex() or "-"  # the driver reads "-" as ""


def fields(line: str) -> list[str]:
    """The " | "-separated fields of a `tmpl` answer (an empty field is "")."""
    return [f.strip() for f in line.split("|")]


def ids(text: str) -> list[int]:
    return [int(x) for x in text.split()]


def template(line: str) -> dict:
    """A `tmpl` answer by name (probe.cpp answer()): start, ids, runs, sizes, real, layers, min,
    max, hsmin."""
    f = fields(line)
    named = {k: v for k, v in (x.split(" ", 1) if " " in x else (x, "") for x in f[4:])}
    return {
        "start": int(f[0].split()[1]), "ids": ids(f[1]), "runs": f[2], "sizes": f[3],
        "real": int(named["real"]), "layers": tuple(ids(named["layers"])),
        "min": int(named["min"]), "max": int(named["max"]), "hsmin": int(named["hsmin"]),
    }
