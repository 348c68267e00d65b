"""Hardware readings for the Train and Hardware tabs, without importing torch.

GPUs come from NVML (nvidia-ml-py): name, VRAM, utilisation, temperature, power, and the
memory each of the pipeline's processes holds. torch/CUDA facts come from one short
subprocess per GUI process, run in the background and cached (the GUI never imports
torch). CPU% of the pipeline needs two samples of the same process, so `psutil.Process`
handles are kept between calls, keyed by (pid, start time): a measurement cache, not job
state (what runs is always read from the project).

    machine()                    # {"cpu_percent", "ram_used_gib", "ram_total_gib", "gpus": [...],
                                 # ...}
    pipeline_process(pid)        # {"cpu_percent", "rss_gib" (incl. children), "gpu_mib", ...} |
                                 # None
    environment()                # versions; torch facts once the subprocess has answered
"""

from __future__ import annotations

import importlib.metadata
import json
import platform
import shutil
import subprocess
import sys
import threading
from pathlib import Path

import psutil

NO_NVIDIA = "no NVIDIA driver found (NVML unavailable): GPU rows are not available on this machine"
_procs: dict[tuple[int, float], psutil.Process] = {}
_torch_facts: dict | None = None
_torch_lock = threading.Lock()
_nvml_ok: bool | None = None

_TORCH_PROBE = r"""
import json, torch
out = {"torch": torch.__version__, "cuda_build": torch.version.cuda,
       "cuda_available": torch.cuda.is_available(), "devices": []}
if out["cuda_available"]:
    for i in range(torch.cuda.device_count()):
        p = torch.cuda.get_device_properties(i)
        out["devices"].append({"index": i, "name": p.name,
                               "total_gib": round(p.total_memory / 2**30, 2),
                               "capability": f"{p.major}.{p.minor}"})
print(json.dumps(out))
"""


def _nvml():
    """The pynvml module, initialised once; None without an NVIDIA driver."""
    global _nvml_ok
    try:
        import pynvml
    except ImportError:
        return None
    if _nvml_ok is None:
        try:
            pynvml.nvmlInit()
            _nvml_ok = True
        except pynvml.NVMLError:  # LibraryNotFound / DriverNotLoaded / ...: no NVIDIA here
            _nvml_ok = False
    return pynvml if _nvml_ok else None


def gpus() -> list[dict] | None:
    """One dict per NVIDIA GPU, or None when there is no NVIDIA driver."""
    nv = _nvml()
    if nv is None:
        return None
    out = []
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        mem = nv.nvmlDeviceGetMemoryInfo(h)
        row = {
            "index": i,
            "name": nv.nvmlDeviceGetName(h),
            "vram_used_gib": mem.used / 2**30,
            "vram_total_gib": mem.total / 2**30,
        }
        for key, fn, scale in (
            ("util_percent", lambda d: d.nvmlDeviceGetUtilizationRates, None),
            ("temperature_c", lambda d: d.nvmlDeviceGetTemperature, 0),
            ("power_w", lambda d: d.nvmlDeviceGetPowerUsage, 1000.0),
        ):
            row[key] = _nvml_read(nv, key, fn(nv), h, scale)
        out.append(row)
    return out


def _nvml_read(nv, key: str, fn, handle, arg):
    """One NVML reading, None when this board does not report it."""
    try:
        if key == "util_percent":
            return fn(handle).gpu
        if key == "temperature_c":
            return fn(handle, arg)
        return fn(handle) / arg
    except nv.NVMLError:
        return None


def _gpu_mib_of(pids: set[int]) -> float | None:
    nv = _nvml()
    if nv is None:
        return None
    total = 0.0
    for i in range(nv.nvmlDeviceGetCount()):
        h = nv.nvmlDeviceGetHandleByIndex(i)
        try:
            procs = nv.nvmlDeviceGetComputeRunningProcesses(h)
        except nv.NVMLError:  # not reported on this board: count nothing for it
            procs = []
        total += sum((p.usedGpuMemory or 0) for p in procs if p.pid in pids) / 2**20
    return total


def machine(disk_path: str | None = None) -> dict:
    vm = psutil.virtual_memory()
    out = {
        "cpu_percent": psutil.cpu_percent(interval=None),
        "cpu_count": psutil.cpu_count(),
        "ram_used_gib": (vm.total - vm.available) / 2**30,
        "ram_total_gib": vm.total / 2**30,
        "gpus": gpus(),
        "disk": None,
    }
    if disk_path:
        p = Path(disk_path)
        while not p.exists() and p != p.parent:
            p = p.parent
        du = shutil.disk_usage(p)
        out["disk"] = {"path": str(p), "free_gib": du.free / 2**30, "total_gib": du.total / 2**30}
    return out


def _handle(pid: int) -> psutil.Process | None:
    try:
        proc = psutil.Process(pid)
        key = (pid, proc.create_time())
    except psutil.Error:
        return None
    if key not in _procs:
        for old in [k for k in _procs if k[0] == pid]:
            del _procs[old]
        _procs[key] = proc
        proc.cpu_percent(None)  # the first call only arms the measurement
    return _procs[key]


def pipeline_process(pid: int | None) -> dict | None:
    """CPU% (since the previous call), RSS including children, threads, GPU memory."""
    if not pid:
        return None
    proc = _handle(pid)
    if proc is None:
        return None
    try:
        with proc.oneshot():
            cpu = proc.cpu_percent(None)
            rss = proc.memory_info().rss
            threads = proc.num_threads()
        kids = proc.children(recursive=True)
    except psutil.Error:
        return None
    pids = {pid}
    for kid in kids:
        try:
            rss += kid.memory_info().rss
            pids.add(kid.pid)
        except psutil.Error:
            pass
    return {
        "pid": pid,
        "cpu_percent": cpu,
        "rss_gib": rss / 2**30,
        "threads": threads,
        "children": len(kids),
        "gpu_mib": _gpu_mib_of(pids),
    }


def _probe_torch() -> None:
    global _torch_facts
    try:
        res = subprocess.run(
            [sys.executable, "-c", _TORCH_PROBE],
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )
        facts = (
            json.loads(res.stdout.strip().splitlines()[-1])
            if res.returncode == 0
            else {"error": (res.stderr.strip().splitlines() or ["torch failed to import"])[-1]}
        )
    except (OSError, subprocess.TimeoutExpired, ValueError, IndexError) as e:
        facts = {"error": f"torch probe failed: {e}"}
    _torch_facts = facts


def torch_facts(wait: bool = False) -> dict | None:
    """torch/CUDA facts from the one-shot subprocess; None while it still runs."""
    global _torch_thread
    with _torch_lock:
        if _torch_facts is None and _torch_thread is None:
            _torch_thread = threading.Thread(target=_probe_torch, name="torch-probe", daemon=True)
            _torch_thread.start()
        thread = _torch_thread
    if wait and thread is not None:
        thread.join()
    return _torch_facts


_torch_thread: threading.Thread | None = None


def _version(dist: str) -> str:
    try:
        return importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        return "not installed"


def environment() -> dict:
    out = {
        "python": platform.python_version(),
        "executable": sys.executable,
        "os": f"{platform.system()} {platform.release()}",
        "host": platform.node(),
    }
    for dist in (
        "torch",
        "transformers",
        "gradio",
        "gguf",
        "huggingface_hub",
        "datasets",
        "accelerate",
        "safetensors",
    ):
        out[dist] = _version(dist)
    out["torch_facts"] = torch_facts()
    return out
