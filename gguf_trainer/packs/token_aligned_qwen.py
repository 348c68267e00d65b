"""What the token-aligned Qwen family packs share: pig_clip + a token-aligned adapter (one output
row per template id, no layer_map) replaces a Qwen3 / Qwen3-VL text encoder whose DiT reads ONE
hidden state per token: a single raw decoder layer or the final norm (engine-families §2 rows
4, 5, 9-12).

It is the n = 1 case of the layerwise packs (layerwise.py): the same template declaration
(`prefix` + the prompt range + `suffix`, or one piece where the engine parses no prompt range),
the same tap teacher (teachers/qwen_taps.py) and tiny teacher (tiny/qwen_taps.py), but the
adapter is the plain token-aligned kind: its `taps` stay empty (no `layer_map`, which the engine
counts as one layer, conditioner.hpp 2798-2840) while `teacher_taps` names what the teacher
hands the DiT: (k,) = the raw output of decoder layer k, () = the final norm (llm.hpp 1779-1815),
`tap_last_layer` = the snapshot's last layer before the norm (Qwen Image 2.1, conditioner.hpp
3083). Targets cover every template row (the adapter runs over all of them, no mask, 2727-2735);
the loss reads rows from `start` on, the rows the DiT gets (2900-2926): these packs' recipe
stores `train.prefix_rows` "out", which weighs every row before `start` 0 in `compute_loss`
(data/recipe.py row_weights; a project written before the recipe keys keeps them in), and with
`train.stats_rows` "loss" nothing reads them, so the shards store none of those target rows
(data/recipe.py stores_from_start; every row's student state stays). Eval's lead figures
(`tokens`, `pads`) read rows from `start` on too.

Eval: no published pig_clip + token-aligned run exists for these families, so there is no
healthy floor (`verdict` None, the health line "n/a"); judge by cos_slice against the mean
baseline.
"""

from __future__ import annotations

from .layerwise import LayerwisePack


class QwenTokenAlignedPack(LayerwisePack):
    """Base of the token-aligned Qwen family packs (not registered itself)."""

    adapter_kind = "token_aligned"  # text-only: no vision_proj / vis_in in the export
    taps = ()  # the adapter's layer_map: none (one layer to the engine)
    teacher_taps: tuple[int, ...] = ()  # the teacher's out_layers; () = its final norm
    tap_last_layer = False  # out_layers = {num_layers} of the linked snapshot
    # The text whose token count is `start` (checked on the teacher's tokenizer at load); "" when
    # the engine hard-codes a start that is not a prefix's length (Ovis: 28 of a 29-token prefix).
    start_prefix = ""
    tiny_layers = 2  # decoder layers of the demo's tiny teacher when no tap fixes the depth
    typical_rows = 80
    na_keys = ("cos_slice", "cos")  # the n/a health line's figure: the rows the DiT reads
    na_note = ""

    @property
    def out_dim(self) -> int:  # type: ignore[override]
        return self.teacher_hidden

    def teacher_tap_text(self) -> str:
        if self.tap_last_layer:
            return "the last decoder layer (raw, before the final norm)"
        if self.teacher_taps:
            return f"layer {', '.join(map(str, self.teacher_taps))} (raw, before the final norm)"
        return "the final norm"

    def tap_layout(self, num_layers: int = 0):
        from ..teachers.qwen_taps import TapLayout

        if self.tap_last_layer and not num_layers:  # never silently the final norm
            raise ValueError(f"{self.id}: tap_layout needs the snapshot's num_layers")
        taps = (num_layers,) if self.tap_last_layer else tuple(self.teacher_taps)
        return TapLayout(taps=taps, start=self.start, start_prefix=self.start_prefix,
                         padding=self.padding)

    def _layout_for(self, root):
        from ..teachers.qwen_taps import read_config, text_config

        layers = (
            int(text_config(read_config(root))["num_hidden_layers"]) if self.tap_last_layer else 0
        )
        return self.tap_layout(layers)

    def load_teacher(self, materials, plan, device):
        """The tap teacher over the snapshot's text stack, placed as the planner says (gpu,
        offload: streamed through the card from RAM, cpu in fp32)."""
        from ..teachers.qwen_taps import load_tap_teacher

        return load_tap_teacher(
            materials["teacher"],
            device,
            student_pieces=self.student_pieces,
            layout=self._layout_for(materials["teacher"]),
            family=self.family,
            mode=plan.mode,
            ram_limit_gib=plan.cpu_gib,
        )

    def check_teacher(self, materials) -> str:
        """config.json only: a Qwen3 / Qwen3-VL deep enough for the tap, and its width."""
        from ..teachers.qwen_taps import ARCHITECTURES, check_layout, read_config, text_config

        config = read_config(materials["teacher"])
        check_layout(config, self._layout_for(materials["teacher"]), f"the {self.family} teacher")
        tc = text_config(config)
        return (
            f"{ARCHITECTURES[config['model_type']]}: {tc['num_hidden_layers']} layers, hidden "
            f"{tc['hidden_size']}; the DiT reads {self.teacher_tap_text()}, "
            f"{int(tc['hidden_size'])} features per row"
        )

    def teacher_gib(self, materials, device) -> float:
        """The snapshot's weights as they load (the pre-flight's need): their bytes on a card
        (bf16, as released), twice that on a CPU (fp32); the pack's reference figure while the
        folder holds no weights. A linked copy of another size (a tiny or a truncated teacher)
        is judged by its own files, never by the family's reference figure."""
        from pathlib import Path

        import torch

        root = Path(materials["teacher"])
        files = sorted(root.glob("*.safetensors")) if root.is_dir() else []
        if not files:
            return self.teacher_memory_gib
        gib = sum(f.stat().st_size for f in files) / 2**30
        return gib if torch.device(device).type == "cuda" else 2 * gib

    def demo_materials(self, folder):
        """A tiny real teacher of the family's architecture, one layer deeper than its tap."""
        from ..tiny.qwen_taps import write_tiny_tap_teacher

        layers = max(self.tiny_layers, max(self.teacher_taps, default=0))
        return {
            "teacher": write_tiny_tap_teacher(
                folder / f"{self.id}-teacher-tiny", self.teacher_arch, layers
            )
        }

    def describe(self) -> dict:
        return {**super().describe(), "teacher_tap": self.teacher_tap_text(), "start": self.start}
