"""export.dtype q8_0 / bf16 through the real pipeline (in-process): the file name carries the
type, the Linears are Q8_0 where the engine keeps them so, the eval measures the file against
the f16 one of the same checkpoint, `inspect` shows the type and the printed command names
the file written."""

from __future__ import annotations

import io

import gguf
import numpy as np
import pytest
from pipeline_helpers import make_project, run_pipeline

from gguf_trainer.model.adapter_file import read_adapter, read_adapter_arrays
from gguf_trainer.model.adapter_report import inspect_main
from gguf_trainer.runner import control
from gguf_trainer.store.project import load_project, update_settings

PACK = "t5xxl_pixart"


@pytest.fixture(scope="module")
def quantized(tmp_path_factory, tiny_materials):
    root = tmp_path_factory.mktemp("quant") / "proj"
    make_project(root, PACK, tiny_materials, **{"export.dtype": "q8_0"})
    assert run_pipeline(root) == "done"
    return root


def test_a_q8_0_export_is_named_for_its_type_and_quantizes_the_linears(quantized):
    project = load_project(quantized)
    gguf_path = project.final_gguf
    assert gguf_path.name.endswith("-q8_0.gguf") and gguf_path.is_file()
    view = read_adapter(gguf_path)
    assert view.problems == [] and view.refusals == []
    for name, (ne, ty) in view.tensors.items():
        rest = name.removeprefix("adapter.")
        if len(ne) == 1 or rest in ("query",) or ".ln_" in name or name.startswith("adapter.ln_"):
            assert ty == "f32", name
        elif rest == "t5_embed.weight":
            assert ty == "f16", name  # an embedding table is read row by row: f16
        else:
            assert ty == ("q8_0" if ne[0] % 32 == 0 else "f16"), name
    assert view.metadata["adapter.dtype"] == "q8_0"


def test_the_eval_measures_the_q8_0_file_against_the_f16_one(quantized):
    ev = control.read_eval(quantized)
    q = ev["quantized"]
    assert q["dtype"] == "q8_0" and q["bytes"] < q["f16_bytes"]  # tiny: the f32 tensors weigh
    assert abs(q["cos_centered_drop"]) < 0.01 and q["cos_to_f16"] > 0.999
    # the tokens' centred cosine, each row set on its own mean: eval's lead figure of the file
    assert q["cos_centered"] == pytest.approx(ev["lead"]["sets"]["tokens"]["all"]["centred_cos"],
                                              abs=1e-9)


def test_the_q8_0_file_reads_back_as_the_quantizer_packed_it(quantized):
    """read_adapter_arrays (what load_gguf and `check` use) dequantizes each Q8_0 block the
    engine's way: the gguf library's own dequantizer over the raw blocks."""
    path = load_project(quantized).final_gguf
    arrays = read_adapter_arrays(path)
    reader = gguf.GGUFReader(path)
    t = next(t for t in reader.tensors if t.tensor_type == gguf.GGMLQuantizationType.Q8_0)
    want = gguf.quants.dequantize(np.asarray(t.data), t.tensor_type)
    assert np.array_equal(arrays[t.name.removeprefix("adapter.")], want.reshape(
        arrays[t.name.removeprefix("adapter.")].shape))


def test_inspect_shows_the_type_and_the_command_names_the_file(quantized):
    path = load_project(quantized).final_gguf
    buf = io.StringIO()
    assert inspect_main(str(path), False, buf) == 0
    assert "weight type    : q8_0" in buf.getvalue()
    res = control.results(quantized)
    assert res["gguf"] == str(path) and path.name in res["ggk"]


def test_bf16_is_its_own_file_and_the_f16_default_has_no_comparison(quantized):
    update_settings(quantized, {"export.dtype": "bf16"})
    assert run_pipeline(quantized, only=["export", "eval"]) == "done"
    project = load_project(quantized)
    assert project.final_gguf.name.endswith("-bf16.gguf")
    types = {ty for _, ty in read_adapter(project.final_gguf).tensors.values()}
    assert "bf16" in types and control.read_eval(quantized)["quantized"]["dtype"] == "bf16"
    update_settings(quantized, {"export.dtype": "f16"})
    assert run_pipeline(quantized, only=["export", "eval"]) == "done"
    assert control.read_eval(quantized)["quantized"] is None
    names = {p.name for p in project.output_dir.glob("*.gguf")}
    assert {n.rsplit("-", 1)[-1] for n in names} >= {"q8_0.gguf", "bf16.gguf", "f16.gguf"}
