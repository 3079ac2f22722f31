"""The task: ``a+b=`` with both operands of ``d`` digits, one difficulty bucket per ``d``; its splits and reward."""

from __future__ import annotations

import random
from dataclasses import dataclass

from .config import LMConfig

Problem = tuple[int, int]


@dataclass
class Splits:
    train: dict[int, list[Problem]]  # RL training prompts per bucket (SFT draws fresh pairs, avoiding val/test)
    val: dict[int, list[Problem]]
    test: dict[int, list[Problem]]


def make_splits(cfg: LMConfig) -> Splits:
    rng = random.Random(cfg.split_seed)
    train, val, test = {}, {}, {}
    for d in cfg.digits:
        low, high = 10 ** (d - 1), 10**d - 1
        wanted = cfg.num_val_per_bucket + cfg.num_test_per_bucket + cfg.num_rl_train_per_bucket
        pairs: set[Problem] = set()
        ordered: list[Problem] = []
        while len(ordered) < wanted:
            pair = (rng.randint(low, high), rng.randint(low, high))
            if pair not in pairs:
                pairs.add(pair)
                ordered.append(pair)
        val[d] = ordered[: cfg.num_val_per_bucket]
        test[d] = ordered[cfg.num_val_per_bucket : cfg.num_val_per_bucket + cfg.num_test_per_bucket]
        train[d] = ordered[cfg.num_val_per_bucket + cfg.num_test_per_bucket :]
    return Splits(train=train, val=val, test=test)


def prompt_of(a: int, b: int) -> str:
    return f"{a}+{b}="


def exact_match_reward(completions: list[str], answer: list[str], **kwargs) -> list[float]:
    """Binary verifiable reward: 1.0 iff the completion is exactly the sum (surrounding whitespace ignored)."""
    return [float(completion.strip() == target) for completion, target in zip(completions, answer)]


def sft_pairs(cfg: LMConfig, splits: Splits, per_bucket: int) -> list[Problem]:
    """Fresh SFT pairs, never a validation or test problem, equally many per bucket."""
    held_out = {p for split in (splits.val, splits.test) for pairs in split.values() for p in pairs}
    rng = random.Random(cfg.split_seed + 1)
    out = []
    for d in cfg.digits:
        low, high = 10 ** (d - 1), 10**d - 1
        count = 0
        while count < per_bucket:
            pair = (rng.randint(low, high), rng.randint(low, high))
            if pair not in held_out:
                out.append(pair)
                count += 1
    rng.shuffle(out)
    return out


class StrictExactMatch:
    """The exact protocol's binary reward: 1.0 iff the completion's tokens, up to and including the first EOS, are
    exactly the sum's tokens followed by EOS. It accepts one token sequence per problem (the text grader above also
    accepts surrounding whitespace, special tokens that decoding skips, and a completion cut at the length limit),
    so a problem's success probability is one teacher-forced product (:mod:`benchmarks.lm_study.exact`)."""

    __name__ = "strict_exact_match_reward"

    def __init__(self, tokenizer) -> None:
        self.tokenizer = tokenizer
        self._accepted: dict[str, list[int]] = {}

    def accepted(self, target: str) -> list[int]:
        if target not in self._accepted:
            ids = self.tokenizer(target, add_special_tokens=False)["input_ids"]
            self._accepted[target] = [*ids, self.tokenizer.eos_token_id]
        return self._accepted[target]

    def __call__(self, completions, answer, completion_ids=None, **kwargs) -> list[float]:
        if completion_ids is None:
            raise ValueError("StrictExactMatch grades token ids: pass completion_ids (TRL's trainers do).")
        eos = self.tokenizer.eos_token_id
        rewards = []
        for ids, target in zip(completion_ids, answer):
            ids = list(ids)
            cut = ids[: ids.index(eos) + 1] if eos in ids else ids
            rewards.append(float(cut == self.accepted(target)))
        return rewards
