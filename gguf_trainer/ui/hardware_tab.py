"""Hardware tab: GPUs (NVML), torch/CUDA facts (a one-shot subprocess), RAM, disk, versions.

The GUI process never imports torch: torch's view of the machine comes from
hardware.torch_facts(), a cached subprocess started on first use.
"""

from __future__ import annotations

from dataclasses import dataclass

import gradio as gr

from gguf_trainer.ui import common, hardware

POLL_S = 2.0  # while torch's facts are being asked, the tab re-renders itself this often


@dataclass
class HardwareParts:
    refresh: gr.Button
    text: gr.Markdown
    poll: gr.Timer


def build() -> HardwareParts:
    refresh = gr.Button("Refresh", scale=0, elem_id="hw-refresh")
    text = gr.Markdown("Reading the machine…", elem_id="hw-text")
    poll = gr.Timer(POLL_S, active=False)
    return HardwareParts(refresh, text, poll)


def render(project: str | None, env: dict) -> str:
    m = hardware.machine(project)
    out = ["### Machine", common.md_table(["", ""], [
        ["OS", env["os"]], ["Host", env["host"]],
        ["CPU", f"{m['cpu_count']} threads, {m['cpu_percent']:.0f}% busy"],
        ["RAM", f"{m['ram_used_gib']:.1f} / {m['ram_total_gib']:.1f} GiB used"],
        ["Disk free", "—" if not m["disk"] else
         f"{m['disk']['free_gib']:.1f} of {m['disk']['total_gib']:.1f} GiB at {m['disk']['path']}"],
    ])]
    out.append("### GPUs (NVML)")
    if m["gpus"] is None:
        out.append(hardware.NO_NVIDIA)
    elif not m["gpus"]:
        out.append("NVML found no GPU.")
    else:
        out.append(common.md_table(
            ["#", "name", "VRAM used / total", "util", "temperature", "power"],
            [[g["index"], g["name"], f"{g['vram_used_gib']:.1f} / {g['vram_total_gib']:.1f} GiB",
              f"{common.fmt(g.get('util_percent'))}%", f"{common.fmt(g.get('temperature_c'))} °C",
              f"{common.fmt(g.get('power_w'))} W"] for g in m["gpus"]]))
    out.append("### torch")
    facts = env["torch_facts"]
    if facts is None:
        out.append("asking torch in a subprocess… (shown here when it answers)")
    elif facts.get("error"):
        out.append(f"torch could not be asked: {facts['error']}")
    else:
        out.append(
            f"torch {facts['torch']} (CUDA build {facts.get('cuda_build') or 'none'}); "
            "CUDA available: "
            f"{common.fmt(facts['cuda_available'])}"
        )
        if facts["devices"]:
            out.append(
                common.md_table(
                    ["#", "name", "memory", "capability"],
                    [
                        [d["index"], d["name"], f"{d['total_gib']} GiB", d["capability"]]
                        for d in facts["devices"]
                    ],
                )
            )
    out.append("### Versions")
    out.append(
        common.md_table(
            ["package", "version"],
            [
                [k, env[k]]
                for k in (
                    "python",
                    "torch",
                    "transformers",
                    "gradio",
                    "gguf",
                    "huggingface_hub",
                    "datasets",
                    "accelerate",
                    "safetensors",
                )
            ],
        )
    )
    return "\n\n".join(out)


def render_and_poll(project: str | None) -> tuple:
    """(the tab's text, the poll timer): polling only while torch's facts are on their way,
    so they appear without pressing Refresh. One reading decides both: facts that arrive
    between two readings would stop the timer under a text that still says "asking"."""
    env = hardware.environment()
    return render(project, env), gr.Timer(active=env["torch_facts"] is None)


def wire(p: HardwareParts, project: gr.State, tab: gr.Tab) -> None:
    outs = [p.text, p.poll]
    p.refresh.click(render_and_poll, [project], outs, api_visibility="private")
    tab.select(render_and_poll, [project], outs, api_visibility="private")
    p.poll.tick(render_and_poll, [project], outs, api_visibility="private")
