"""The upsampler request (ggk 0.9.7's pup.py, ported) and the caption client: the body every
field of pup.py's, the i2i scaffold and references, BFL's prompts shipped unchanged; each way an
endpoint fails is one sentence (nothing listening, HTTP 500, a context error, not JSON, no
choices, an unknown model); data/captions.jsonl survives a torn last line and keys captions by
model, system prompt and token cap."""

from __future__ import annotations

import base64
import hashlib
import io
import json
import socket

import pytest
from caption_stand_in import stand_in
from PIL import Image

from gguf_trainer.base.errors import UserError
from gguf_trainer.materials import upsampler_request as pup
from gguf_trainer.materials.caption_client import (
    CaptionCache,
    CaptionClient,
    CaptionError,
    base_url,
    cache_key,
)

SHIPPED_SHA256 = "361bb6e081d50e54a3dee9abf26327436a9386c83465f881c7848989232028be"


def test_bfl_prompts_are_shipped_unchanged_with_their_notice():
    folder = pup.PROMPTS_FILE.parent
    assert hashlib.sha256(pup.PROMPTS_FILE.read_bytes()).hexdigest() == SHIPPED_SHA256
    notice = (folder / "NOTICE").read_text()
    assert SHIPPED_SHA256 in notice and "Apache License, Version 2.0" in notice
    assert "Apache License" in (folder / "LICENSE-Apache-2.0.txt").read_text()
    assert pup.system_prompt("t2i").startswith("Your name is FLUX 3")
    assert "image-editing model" in pup.system_prompt("i2i")
    assert pup.system_sha256("t2i") != pup.system_sha256("i2i")


def test_t2i_body_is_pup_py_s_request():
    body = pup.chat_body("a red fox", "qwen3.5-9b", max_tokens=300)
    assert body == {
        "model": "qwen3.5-9b",
        "messages": [{"role": "system", "content": pup.system_prompt("t2i")},
                     {"role": "user", "content": "a red fox"}],
        "stream": False,
        "stop": ["<|im_end|>", "<|endoftext|>"],
        "presence_penalty": 1.5,
        "chat_template_kwargs": {"enable_thinking": False},
        "temperature": 0.0, "top_p": 0.95, "top_k": 20, "min_p": 0.0,
        "max_tokens": 300,
    }
    assert pup.MAX_TOKENS == 3584 and pup.CONTEXT_SIZE == 20480


def test_i2i_body_sends_references_then_the_scaffold(tmp_path):
    a = tmp_path / "a.png"
    Image.new("RGBA", (2000, 1000), (10, 20, 30, 0)).save(a)  # transparent: over white
    body = pup.chat_body("make it night", "m", images=[a])
    assert body["presence_penalty"] == 0.0
    assert body["messages"][0]["content"] == pup.system_prompt("i2i")
    image, text = body["messages"][1]["content"]
    assert text == {"type": "text", "text": (
        "Reference images follow in order (the first image, the second image, ...).\n"
        "User request: make it night\nOutput the caption.")}
    url = image["image_url"]["url"]
    assert url.startswith("data:image/jpeg;base64,")
    sent = Image.open(io.BytesIO(base64.b64decode(url.split(",", 1)[1])))
    assert sent.format == "JPEG" and sent.size == pup.reference_size(2000, 1000, 1) == (1440, 704)
    assert min(sent.getpixel((5, 5))) > 245  # alpha composited over white


def test_reference_sizes_follow_the_budget_per_count():
    assert pup.reference_size(512, 512, 1) == (512, 512)
    w, h = pup.reference_size(4000, 3000, 2)
    assert w % 32 == h % 32 == 0 and w * h <= 724 * 724
    w, h = pup.reference_size(1000, 1000, 5)
    assert w * h <= 512 * 512
    with pytest.raises(ValueError, match="aspect ratio"):
        pup.reference_size(20100, 100, 1)


def test_think_blocks_are_stripped():
    assert pup.strip_think("<think>plan</think>\n A fox.") == "A fox."
    assert pup.strip_think("A fox.<think>never closed") == "A fox."
    assert pup.caption_of({"choices": [{"message": {"content": None}}]}) == ""
    with pytest.raises(ValueError):
        pup.caption_of({"choices": []})


def test_endpoint_address_forms():
    assert base_url("http://127.0.0.1:8080") == "http://127.0.0.1:8080/v1"
    assert base_url(" http://127.0.0.1:8080/v1/ ") == "http://127.0.0.1:8080/v1"
    assert base_url("https://example.org/openai/v1") == "https://example.org/openai/v1"
    with pytest.raises(UserError, match="not an http"):
        base_url("127.0.0.1:8080")


def test_a_caption_from_the_stand_in():
    with stand_in("qwen3.5-9b") as server:
        client = CaptionClient(server.url + "/")
        assert client.resolve_model() == "qwen3.5-9b"
        reply = client.caption("a red fox", "qwen3.5-9b", max_tokens=64)
        assert reply["caption"] == "detailed caption 1 of <a red fox>"
        assert reply["usage"]["completion_tokens"] == 7
        assert server.bodies[0]["max_tokens"] == 64 and server.bodies[0]["model"] == "qwen3.5-9b"


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _one_sentence(err: Exception) -> str:
    text = str(err)
    assert "\n" not in text and "Traceback" not in text and text.endswith(".")
    return text


def test_nothing_listening_is_one_sentence():
    url = f"http://127.0.0.1:{_free_port()}/v1"
    with pytest.raises(CaptionError) as e:
        CaptionClient(url).resolve_model()
    text = _one_sentence(e.value)
    assert f"the caption endpoint {url} cannot be reached" in text
    assert "corpus.caption_endpoint" in text


@pytest.mark.parametrize("mode, words", [
    ("500", "answered HTTP 500 to /chat/completions (the model crashed)"),
    ("context", "restart it with a context of 20480"),
    ("malformed", "something that is not JSON (<html>not json at all)"),
    ("shape", "did not answer with a chat completion (no choices[0].message.content"),
])
def test_server_failures_are_one_sentence(mode, words):
    with stand_in() as server:
        client = CaptionClient(server.url)
        model = client.resolve_model()
        server.mode = mode
        with pytest.raises(CaptionError) as e:
            client.caption("a red fox", model)
    assert words in _one_sentence(e.value)


def test_a_model_the_server_does_not_serve_is_named():
    with stand_in("served-one") as server, pytest.raises(CaptionError) as e:
        CaptionClient(server.url, model="other").resolve_model()
    assert "serves served-one, not corpus.caption_model 'other'" in _one_sentence(e.value)


def _record(prompt, model="m", sha="s", max_tokens=64, caption="c"):
    return {"prompt": prompt, "images": [], "model": model, "system_sha256": sha,
            "max_tokens": max_tokens, "caption": caption}


def test_cache_appends_reloads_and_cuts_a_torn_line(tmp_path):
    path = tmp_path / "data" / "captions.jsonl"
    path.parent.mkdir()
    cache = CaptionCache(tmp_path, path)
    for p in ("one", "two"):
        cache.add(cache_key(p, [], "m", "s", 64), _record(p, caption=f"cap {p}"))
    cache.close()
    with open(path, "ab") as f:  # a kill -9 in the middle of the third line
        f.write(b'{"prompt": "three", "images": [], "mod')
    again = CaptionCache(tmp_path, path)
    assert again.unreadable == 0 and len(again.entries) == 2
    assert again.get(cache_key("two", [], "m", "s", 64))["caption"] == "cap two"
    # another model, system prompt or token cap is another key
    for key in (cache_key("two", [], "other", "s", 64), cache_key("two", [], "m", "t", 64),
                cache_key("two", [], "m", "s", 65)):
        assert again.get(key) is None
    again.add(cache_key("three", [], "m", "s", 64), _record("three"))
    again.close()
    lines = path.read_bytes().decode().splitlines()
    assert len(lines) == 3 and [json.loads(x)["prompt"] for x in lines] == ["one", "two", "three"]
    assert len(CaptionCache(tmp_path, path).entries) == 3


def test_a_reference_past_200_to_1_is_not_sent(tmp_path):
    thin = tmp_path / "thin.png"
    Image.new("RGB", (4020, 20)).save(thin)
    with stand_in() as server:
        reply = CaptionClient(server.url).caption("make it red", "m", images=[thin])
        assert server.bodies == []  # ggk sends such a prompt as typed: no caption
    assert reply["caption"] == "" and "exceeds 200:1" in reply["skipped"]
