"""The chat server's `image_url` parts on a tiny random Qwen2.5-VL folder (with a chat tokenizer)
the test writes: greedy answers equal the static VL sampler's for the same images, any image size
resized to 448 x 448; a URL that is not a data URL, an undecodable, too large or oversized image,
a malformed part and images for a text-only model: 400 naming the field; the server keeps
serving."""

import base64
import re

import jax
import numpy as np
import pytest

from apex_jax.judges import InProcessChat, serving
from apex_jax.judges.protocol import ChatLimits
from apex_jax.tools import images as images_lib
from apex_jax.tools.server import running
from morse_jax.llm import GREEDY, GenerationSettings, vision, vl, vl_sampling
from tests import tiny_models
from tests.apex.judges.test_server import MSG, model, post  # noqa: F401 -- a fixture
from tests.test_generate_vl import huge_png_header

LIMITS = ChatLimits(max_tokens=16, max_batch=2, step_tokens=4, cache_tokens=2048)
MAX_TOKENS = 5


@pytest.fixture(scope="module")
def vl_folder_chat(tmp_path_factory):
  return tiny_models.save_hf_vl_chat_model(str(tmp_path_factory.mktemp("vlchat")))


@pytest.fixture(scope="module")
def vl_model(vl_folder_chat):
  return vl.load(vl_folder_chat)


@pytest.fixture(scope="module")
def server(vl_model):
  srv = serving.make_server(InProcessChat(vl_model), "tiny-vl", port=0, limits=LIMITS,
                            default_max_tokens=MAX_TOKENS)
  with running(srv):
    yield srv


def rgb(seed, height, width):
  return np.random.RandomState(seed).randint(0, 256, (height, width, 3)).astype(np.uint8)


def png_url(image):
  """A PNG data URL of any uint8 [h, w, 3] (`images.to_data_url` takes square ones)."""
  import io

  from PIL import Image

  buffer = io.BytesIO()
  Image.fromarray(image).save(buffer, "PNG")
  return "data:image/png;base64," + base64.b64encode(buffer.getvalue()).decode()


def image_part(url):
  return {"type": "image_url", "image_url": {"url": url}}


def chat_body(*parts):
  return {"messages": [{"role": "system", "content": "Look."},
                       {"role": "user", "content": list(parts)}],
          "max_tokens": MAX_TOKENS, "temperature": 0.0}


def static_answer(vl_model, parts, images):
  """The static VL sampler's greedy text for the same chat and images."""
  chat = InProcessChat(vl_model)
  messages = [{"role": "system", "content": "Look."}, {"role": "user", "content": parts}]
  prompt = chat.prompt_tokens(messages, images=len(images))
  settings = GenerationSettings.for_model(vl_model.text, MAX_TOKENS, GREEDY)
  pixels = [vision.normalize(images_lib.decode_base64(png_url(i), "x"))
            for i in images]
  out = vl_sampling.sample(vl_model, [prompt], [pixels], settings, rng=jax.random.key(0))
  return chat.completion(out.tokens[0, :out.lengths[0]], len(prompt), ()).text, len(prompt)


@pytest.mark.slow
def test_image_parts_answer_as_the_static_vl_sampler(server, vl_model):
  """Two images (one of 448 x 448, one of 60 x 90 resized to it) between text parts."""
  images = [rgb(0, 448, 448), rgb(1, 60, 90)]
  parts = [{"type": "text", "text": "What is in"}, image_part(png_url(images[0])),
           {"type": "text", "text": "and <|image_pad|>?"},
           image_part(png_url(images[1]))]
  status, out = post(server, chat_body(*parts))
  assert status == 200, out
  want, prompt_len = static_answer(vl_model, [{"type": "text", "text": "What is in"},
                                              {"type": "image"},
                                              {"type": "text", "text": "and <|image_pad|>?"},
                                              {"type": "image"}], images)
  assert out["choices"][0]["message"]["content"] == want
  # 256 image tokens per image; the pad's spelling inside the text stays text
  assert out["usage"]["prompt_tokens"] == prompt_len > 2 * 256
  ids = InProcessChat(vl_model).prompt_tokens(
      [{"role": "user", "content": [{"type": "image"}, {"type": "text", "text": "<|image_pad|>"}]}],
      images=1)
  assert ids.count(vl_model.config.image_token_id) == 256


BAD = {
    "not_data": ("https://example.com/cat.png", "is a URL; only data URLs are read"),
    "undecodable": ("data:image/png;base64,aGVsbG8=", "not a readable image"),
    "not_base64": ("data:image/png;base64,@@@@", "not valid base64"),
    "not_image": ("data:text/plain;base64,aGVsbG8=", "is not a base64 image data URL"),
}


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_image_urls_are_400_naming_the_field(server, case):
  url, why = BAD[case]
  status, out = post(server, chat_body({"type": "text", "text": "hi"}, image_part(url)))
  assert status == 400, out
  field = "messages[1].content[1].image_url.url"
  assert out["error"]["param"] == field
  assert out["error"]["message"].startswith(f"{field}: ") and why in out["error"]["message"]


def test_oversized_images_are_400(server, tmp_path, monkeypatch):
  with open(huge_png_header(tmp_path / "huge.png"), "rb") as f:
    huge = "data:image/png;base64," + base64.b64encode(f.read()).decode()
  status, out = post(server, chat_body(image_part(huge)))
  assert status == 400 and re.search(r"9000 x 9000 pixels, more than", out["error"]["message"])
  monkeypatch.setattr(images_lib, "MAX_BYTES", 50)
  status, out = post(server, chat_body(image_part(images_lib.to_data_url(rgb(0, 28, 28)))))
  assert status == 400 and "more than 50 bytes" in out["error"]["message"]
  assert out["error"]["param"] == "messages[1].content[0].image_url.url"


@pytest.mark.parametrize("part,field,why", [
    ({"type": "image_url", "image_url": "data:image/png;base64,AA=="},
     "messages[1].content[0].image_url", "must be an object"),
    ({"type": "image_url", "image_url": {"url": "data:,", "detail": "high"}},
     "messages[1].content[0].image_url", "\"detail\": \"auto\" only"),
    ({"type": "image_url", "image_url": {"url": "data:,"}, "extra": 1},
     "messages[1].content[0]", "unknown key 'extra'"),
])
def test_malformed_image_parts_are_400(server, part, field, why):
  status, out = post(server, chat_body(part))
  assert status == 400 and out["error"]["param"] == field and why in out["error"]["message"]


def test_a_text_model_given_an_image_is_400_and_the_server_goes_on(model):  # noqa: F811
  srv = serving.make_server(InProcessChat(model, max_context=64), "tiny", port=0,
                            default_max_tokens=4, limits=ChatLimits(max_tokens=8, max_batch=2))
  with running(srv):
    status, out = post(srv, chat_body(image_part(images_lib.to_data_url(rgb(0, 28, 28)))))
    assert status == 400
    assert out["error"]["param"] == "messages[1].content[0].image_url.url"
    assert "the model 'tiny' takes no images" in out["error"]["message"]
    status, out = post(srv, {"messages": MSG, "max_tokens": 3, "temperature": 0.0})
    assert status == 200, out


def test_images_on_the_merged_call_batcher_are_400(vl_model):
  """A server that generates with merged sampler calls (a chat on a mesh) takes no images."""
  srv = serving.make_server(InProcessChat(vl_model), "tiny-vl", port=0, limits=LIMITS,
                            default_max_tokens=MAX_TOKENS, engine=False)
  with running(srv):
    status, out = post(srv, chat_body(image_part(png_url(rgb(0, 28, 28)))))
  assert status == 400 and out["error"]["param"] == "messages[1].content[0].image_url.url"
  assert "merged sampler calls, which take no images" in out["error"]["message"]


def test_text_only_requests_on_the_vl_server(server, vl_model):
  """A text chat (string or text parts) needs no image and answers as the static sampler."""
  status, out = post(server, {"messages": [{"role": "system", "content": "Look."},
                                           {"role": "user", "content": [
                                               {"type": "text", "text": "hi"}]}],
                              "max_tokens": MAX_TOKENS, "temperature": 0.0})
  assert status == 200, out
  assert out["choices"][0]["message"]["content"] == static_answer(vl_model, "hi", [])[0]


def test_serve_launcher_loads_a_vl_folder(vl_folder_chat, server):
  """`launchers.serve` on a Qwen2.5-VL folder: the chat carries the VL model, so image parts
  reach the engine with the tower; adapters on it are refused by name."""
  from absl import app

  from launchers import serve

  srv = serve.build_server(vl_folder_chat, port=0, max_batch=2, default_max_tokens=MAX_TOKENS,
                           limits=LIMITS)
  assert isinstance(srv.chat.vl, vl.VlModel)
  parts = [image_part(png_url(rgb(3, 448, 448))), {"type": "text", "text": "and?"}]
  with running(srv):
    status, mine = post(srv, chat_body(*parts))
  _, theirs = post(server, chat_body(*parts))
  assert status == 200 and mine["choices"] == theirs["choices"]
  with pytest.raises(app.UsageError, match="adapters on a Qwen2.5-VL folder"):
    serve.build_server(vl_folder_chat, port=0, lora_modules=["ex=/nowhere"])
