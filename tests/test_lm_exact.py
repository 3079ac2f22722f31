"""Exact evaluation of the tiny-LM study (a known distribution, and agreement with sampling), its strict grader, and
the reproducible SFT starts."""

from __future__ import annotations

import json
import math
import shutil
from dataclasses import replace
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest
import torch

from benchmarks.lm_study.exact import pass_at_k, sampled_acceptances, success_probabilities
from benchmarks.lm_study.task import StrictExactMatch
from riskpo_trl.tiny_model import build_char_tokenizer, build_tiny_model


class BigramModel(torch.nn.Module):
    """Next-token logits depend only on the current token: ``logits[t] = log Q[token_t]``, so the probability of any
    completion is a product of entries of softmax(log Q / T), computable by hand."""

    def __init__(self, log_q: torch.Tensor) -> None:
        super().__init__()
        self.log_q = log_q

    def forward(self, input_ids, attention_mask=None):
        return SimpleNamespace(logits=self.log_q[input_ids])


def test_exact_probability_on_a_known_distribution():
    tokenizer = build_char_tokenizer()
    vocab = len(tokenizer)
    log_q = torch.log_softmax(torch.randn(vocab, vocab, generator=torch.Generator().manual_seed(0)) * 3, dim=-1)
    model = BigramModel(log_q)
    temperature = 0.8
    probs = torch.softmax(log_q.double() / temperature, dim=-1)
    prompts, targets = ["12+34=", "5+5=", "99+99="], ["46", "10", "198"]
    got = success_probabilities(model, tokenizer, prompts, targets, temperature=temperature, max_completion_length=7)
    for prompt, target, p in zip(prompts, targets, got):
        chain = [
            tokenizer.convert_tokens_to_ids(prompt[-1]),
            *tokenizer.convert_tokens_to_ids(list(target)),
            tokenizer.eos_token_id,
        ]
        expected = math.prod(float(probs[a, b]) for a, b in zip(chain, chain[1:]))
        assert p == pytest.approx(expected, rel=1e-9)
    # A completion longer than the limit can never be sampled.
    assert success_probabilities(
        model, tokenizer, ["99+99="], ["198"], temperature=temperature, max_completion_length=3
    ) == [0.0]


def test_pass_at_k_is_the_closed_form():
    assert pass_at_k([0.5, 0.0, 1.0], 2).tolist() == pytest.approx([0.75, 0.0, 1.0])
    assert pass_at_k([1e-12], 1024)[0] == pytest.approx(1024e-12, rel=1e-6)  # no cancellation for tiny p
    curve = pass_at_k(0.01, np.arange(1, 1025))
    assert np.all(np.diff(curve) > 0) and curve[-1] == pytest.approx(1 - 0.99**1024)


def test_strict_grader_accepts_one_token_sequence():
    tokenizer = build_char_tokenizer()
    grader = StrictExactMatch(tokenizer)
    ids = tokenizer("46", add_special_tokens=False)["input_ids"]
    eos, pad, space = tokenizer.eos_token_id, tokenizer.pad_token_id, tokenizer.convert_tokens_to_ids("Ġ")
    candidates = [
        [*ids, eos],  # accepted
        [*ids, eos, pad, pad],  # padding after EOS is not part of the completion: accepted
        [*ids],  # cut at the length limit, no EOS
        [space, *ids, eos],  # the text grader accepts this one
        [ids[0], pad, ids[1], eos],  # ... and this one (decoding skips pad)
        [*ids, ids[0], eos],
    ]
    assert grader([""] * 6, ["46"] * 6, completion_ids=candidates) == [1.0, 1.0, 0.0, 0.0, 0.0, 0.0]
    with pytest.raises(ValueError, match="completion_ids"):
        grader(["46"], ["46"])


def test_exact_probability_matches_sampling():
    """Teach a tiny model a few sums, then check that the sampled acceptance rate of each lies within a 5-sigma
    binomial band around the exact probability (temperature and the whole-vocabulary sampler included)."""
    torch.manual_seed(0)
    model, tokenizer = build_tiny_model(hidden_size=32, intermediate_size=64)
    pairs = {"1+2=": "3", "4+4=": "8", "12+7=": "19"}
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(25):
        for prompt, target in pairs.items():
            ids = tokenizer(prompt + target, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
            x = torch.tensor([ids])
            loss = model(input_ids=x, labels=x).loss
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
    prompts, targets = list(pairs), list(pairs.values())
    exact = success_probabilities(model, tokenizer, prompts, targets, temperature=0.8, max_completion_length=7)
    assert all(0.05 < p < 0.95 for p in exact), exact  # a check with power: neither never nor always accepted
    n = 3000
    counts = sampled_acceptances(
        model, tokenizer, prompts, targets, num_samples=n, temperature=0.8, max_completion_length=7, seed=0
    )
    for p, k, text_k in zip(exact, counts["strict"], counts["text"]):
        assert abs(k / n - p) < 5 * math.sqrt(p * (1 - p) / n), (k / n, p)
        assert text_k >= k  # the text grader accepts every strictly accepted completion, and maybe more


@pytest.mark.slow
def test_sft_start_is_bit_identical_when_rebuilt(tmp_path):
    from benchmarks.lm_study.config import ExactProtocol
    from benchmarks.lm_study.sft import build_init_model
    from benchmarks.lm_study.starts import train_start, weights_digest

    cfg = replace(ExactProtocol().scaled_down().lm, sft_max_steps=3)
    init = tmp_path / "init"
    build_init_model(cfg, init)
    records = [
        train_start(
            cfg,
            init,
            tmp_path / name,
            seed=0,
            max_steps=3,
            check_every=2,
            stop_rule=lambda probs: False,
            rule_text="never",
        )
        for name in ("first", "second")
    ]
    assert records[0]["steps"] == records[1]["steps"] == 3
    assert records[0]["sha256"] == records[1]["sha256"]
    assert records[0]["weights_digest"] == records[1]["weights_digest"]
    from transformers import AutoModelForCausalLM

    assert weights_digest(AutoModelForCausalLM.from_pretrained(tmp_path / "first")) == records[0]["weights_digest"]
    assert weights_digest(AutoModelForCausalLM.from_pretrained(init)) != records[0]["weights_digest"]  # it trained


def copy_record(start: str, into: Path) -> Path:
    """A start's folder without its weights: what a fresh clone has before the weights are restored."""
    from benchmarks.lm_study.starts import STARTS_DIR, WEIGHTS

    shutil.copytree(STARTS_DIR / start, into, ignore=shutil.ignore_patterns(WEIGHTS, f"{WEIGHTS}.partial"))
    return into


def in_git_history() -> bool:
    from benchmarks.lm_study.starts import REPOSITORY

    return shutil.which("git") is not None and (REPOSITORY / ".git").exists()


@pytest.mark.parametrize("start", ["low", "moderate"])
def test_committed_starts_are_restored_from_git_history_and_match_their_hashes(start, tmp_path):
    from benchmarks.lm_study.starts import RECORD, WEIGHTS, checked_start

    if not in_git_history():
        pytest.skip("not a git checkout: the starts' weights live in the repository's history")
    restored = copy_record(start, tmp_path / start)
    assert checked_start(restored) == restored and (restored / WEIGHTS).exists()  # restored, then checked
    record = json.loads((restored / RECORD).read_text())
    assert record["reached_rule"] and record["built_with"]["torch_threads"] == 1
    weights = bytearray((restored / WEIGHTS).read_bytes())
    weights[-1] ^= 1
    (restored / WEIGHTS).write_bytes(bytes(weights))
    with pytest.raises(ValueError, match="not the committed start"):
        checked_start(restored)


def test_a_start_whose_blob_history_lacks_says_how_to_get_it(tmp_path):
    from benchmarks.lm_study.starts import RECORD, checked_start, restore_weights

    start = copy_record("low", tmp_path / "low")
    record = json.loads((start / RECORD).read_text())
    (start / RECORD).write_text(json.dumps({**record, "git_blob": "0" * 40}))
    with pytest.raises(FileNotFoundError, match="git fetch --unshallow"):
        checked_start(start)
    # A copy without .git (a source archive): the same advice.
    with pytest.raises(FileNotFoundError, match="clone the repository"):
        restore_weights(copy_record("moderate", tmp_path / "moderate"), repository=tmp_path)


def test_a_start_record_without_a_blob_asks_for_a_build(tmp_path):
    from benchmarks.lm_study.starts import RECORD, checked_start

    start = copy_record("low", tmp_path / "low")
    record = json.loads((start / RECORD).read_text())
    del record["git_blob"]
    (start / RECORD).write_text(json.dumps(record))
    with pytest.raises(FileNotFoundError, match="names no git blob"):
        checked_start(start)


def test_a_built_start_records_the_blob_git_will_give_its_weights(tmp_path):
    import subprocess

    from benchmarks.lm_study.starts import git_blob_id

    weights = tmp_path / "model.safetensors"
    weights.write_bytes(bytes(range(256)) * 9)
    if shutil.which("git") is None:
        pytest.skip("git is not installed")
    printed = subprocess.run(["git", "hash-object", str(weights)], capture_output=True, text=True, check=True)
    assert git_blob_id(weights) == printed.stdout.strip()
