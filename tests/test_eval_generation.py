"""Sampling backends: completion lengths with several stop ids, and the arguments the vLLM backend passes."""

from __future__ import annotations

import sys
from importlib.machinery import ModuleSpec
from pathlib import Path
from types import ModuleType, SimpleNamespace

import pytest
import torch
from helpers import geometry3k_parquet, real_vllm_missing

from riskpo_trl.evaluation import EvalConfig, evaluate
from riskpo_trl.evaluation.generation import SamplingSettings, TransformersBackend, _completion_mask
from riskpo_trl.tiny_model import build_tiny_model

PAD, EOS, IM_END = 0, 1, 7
TOY_ROWS = str(Path(__file__).parent / "data" / "toy_math.jsonl")


def test_completion_mask_stops_on_any_stop_id_and_drops_trailing_pad():
    completions = torch.tensor([
        [5, 6, EOS, PAD, PAD],     # ends on the tokenizer's EOS
        [5, IM_END, PAD, PAD, PAD],  # ends on the generation config's other EOS
        [5, 6, 5, 6, 5],           # ran to max_new_tokens
        [5, 6, PAD, PAD, PAD],     # ended on a stop id we were not told about: padding still not counted
    ])  # fmt: skip
    mask = _completion_mask(completions, [EOS, IM_END], PAD)
    assert mask.sum(dim=1).tolist() == [3, 2, 5, 2]
    # Pad id equal to EOS (common for Llama-style tokenizers): the first EOS is part of the completion.
    assert _completion_mask(torch.tensor([[5, EOS, EOS, EOS]]), EOS, EOS).tolist() == [[1, 1, 0, 0]]


def test_transformers_backend_stops_on_every_generation_config_eos():
    model, tokenizer = build_tiny_model()
    # The random tiny model greedily repeats one token per prompt: "x" -> x_token forever, "hello" -> another one.
    greedy = SamplingSettings(num_samples=1, temperature=0.0, max_new_tokens=8)
    backend = TransformersBackend(model, tokenizer)
    first = [samples[0].num_tokens for samples in backend.generate(["x", "hello"], greedy)]
    assert first == [8, 8]  # neither stops on the tokenizer's EOS alone
    x_token = model.generate(**tokenizer("x", return_tensors="pt"), do_sample=False, max_new_tokens=1)[0, -1].item()
    assert x_token != tokenizer.eos_token_id

    # Qwen-style list: "x" now stops after one token and is padded while "hello" runs on.
    model.generation_config.eos_token_id = [tokenizer.eos_token_id, x_token]
    x_samples, hello_samples = backend.generate(["x", "hello"], SamplingSettings(
        num_samples=1, temperature=0.0, max_new_tokens=8, return_logprobs=True
    ))  # fmt: skip
    assert x_samples[0].num_tokens == 1  # was 8 when the padding counted
    # Its text stops before the stop token, as vLLM's does, though that token is an ordinary character.
    assert x_samples[0].text == ""
    assert hello_samples[0].num_tokens == 8
    # The log-prob diagnostic covers the one real token, not the padding after it.
    x_alone = TransformersBackend(model, tokenizer).generate(["x"], SamplingSettings(
        num_samples=1, temperature=0.0, max_new_tokens=8, return_logprobs=True
    ))[0][0]  # fmt: skip
    assert x_alone.num_tokens == 1
    assert x_samples[0].mean_logprob == pytest.approx(x_alone.mean_logprob, abs=1e-4)


class FakeVLLM:
    """Stands in for the ``vllm`` module: records how the engine and each request are configured."""

    def __init__(self):
        self.engine_kwargs: list[dict] = []
        self.request_params: list[dict] = []
        self.prompts: list = []
        fake = self

        class SamplingParams:
            def __init__(self, **kwargs):
                fake.request_params.append(kwargs)
                self.n = kwargs["n"]

        class LLM:
            def __init__(self, **kwargs):
                fake.engine_kwargs.append(kwargs)

            def get_tokenizer(self):
                return SimpleNamespace(chat_template=None)

            def generate(self, prompts, params, lora_request=None, use_tqdm=True):
                fake.prompts += prompts
                completion = SimpleNamespace(text="\\boxed{5}", token_ids=[1, 2, 3], cumulative_logprob=-3.0)
                return [SimpleNamespace(outputs=[completion] * params.n) for _ in prompts]

        self.module = ModuleType("vllm")
        self.module.__spec__ = ModuleSpec("vllm", None)  # what importlib.util.find_spec reports
        self.module.LLM, self.module.SamplingParams = LLM, SamplingParams


def test_vllm_engine_is_seeded_once_and_requests_carry_no_seed(monkeypatch, tmp_path):
    fake = FakeVLLM()
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    config = EvalConfig(
        model="org/model", backend="vllm", seed=5, dataset_files=[TOY_ROWS], num_samples=2, ks=[1], batch_size=2,
        output_dir=str(tmp_path),
    )  # fmt: skip
    results = evaluate(config, progress=False)
    assert results["backend"] == "VLLMBackend"
    assert [kwargs["seed"] for kwargs in fake.engine_kwargs] == [5]
    assert len(fake.request_params) == 3  # 5 problems in batches of 2
    # A fixed seed in every request would replay the same random stream for every problem.
    assert all("seed" not in params for params in fake.request_params)


def test_vllm_gets_each_prompts_images_in_its_multi_modal_form(monkeypatch, tmp_path):
    """Geometry prompts reach vLLM as {"prompt", "multi_modal_data": {"image": [...]}} (vLLM's documented form)."""
    fake = FakeVLLM()
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    data = geometry3k_parquet(tmp_path / "geometry3k.parquet", 3)
    config = EvalConfig(
        model="org/vlm",
        backend="vllm",
        benchmarks=[f"geometry3k_test={data}"],
        num_samples=2,
        ks=[1],
        output_dir=str(tmp_path / "out"),
    )
    results = evaluate(config, progress=False)
    assert len(fake.prompts) == 3 and all(set(request) == {"prompt", "multi_modal_data"} for request in fake.prompts)
    assert all(len(request["multi_modal_data"]["image"]) == 1 for request in fake.prompts)
    assert "Find x" in fake.prompts[0]["prompt"]
    assert results["benchmarks"]["geometry3k_test=geometry3k.parquet"]["complete"]


def test_vllm_kwargs_reach_the_engine_and_its_own_options_are_refused(monkeypatch, tmp_path):
    fake = FakeVLLM()
    monkeypatch.setitem(sys.modules, "vllm", fake.module)
    config = EvalConfig(model="org/model", backend="vllm", dataset_files=[TOY_ROWS], num_samples=1, ks=[1],
                        dtype="float32", output_dir=str(tmp_path), vllm_kwargs='{"max_model_len": 4096, '
                        '"tensor_parallel_size": 2}')  # fmt: skip
    evaluate(config, progress=False)
    assert fake.engine_kwargs == [
        {"model": "org/model", "seed": 0, "dtype": "float32", "max_model_len": 4096, "tensor_parallel_size": 2}
    ]
    for bad, message in [
        ({"seed": 1}, r"vllm_kwargs sets \['seed'\]: give them with their own options"),
        ("[1]", "must be a JSON object"),
        ("{max_model_len: 8}", "is not JSON"),
    ]:
        with pytest.raises(ValueError, match=message):
            EvalConfig(model="m", backend="vllm", dataset_files=[TOY_ROWS], vllm_kwargs=bad)
    with pytest.raises(ValueError, match="backend='transformers'"):
        EvalConfig(model="m", backend="transformers", dataset_files=[TOY_ROWS], vllm_kwargs={"max_model_len": 8})


def test_real_vllm_tests_skip_when_only_a_stand_in_or_no_vllm_is_importable(monkeypatch):
    monkeypatch.setitem(sys.modules, "vllm", FakeVLLM().module)
    assert "only a stand-in `vllm` module" in real_vllm_missing()
    monkeypatch.setitem(sys.modules, "vllm", None)  # what importlib reports for a package that is not there
    assert "vLLM is not installed" in real_vllm_missing()
    assert ".ci/vllm_real.sh" in real_vllm_missing()
