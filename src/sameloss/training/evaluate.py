"""The exact pre-training loss on a fixed held-out set (App. A.7).

For every masked position the true conditional ``p`` is known, so the expected
cross-entropy of the model ``q`` splits exactly into ``H(p) + KL(p || q)``. The loss
reported here is that expectation — not the cross-entropy of the one sampled token —
which removes the label-sampling noise; near saturation only the KL part moves, and
its log is the sensitive view (Fig. 9). Standard deviations are over disjoint subsets
of sentences, as the paper reports them.
"""

from __future__ import annotations

import math

import torch

from ..languages.base import Language, entropy_of
from .data import mask_batch, step_generator


class ExactEvaluator:
    """Held-out sentences, masks and true conditionals, computed once per run."""

    def __init__(self, language: Language, n_sentences: int, rate: float | None, seed: int,
                 n_subsets: int = 5, batch_size: int = 1024):
        gen = step_generator(seed, 0, stream=1)
        sample = language.sample(n_sentences, gen)
        self.batch = mask_batch(language, sample.tokens, sample.lengths, rate, gen)
        self.n_words = language.n_words
        self.batch_size = batch_size
        rows = []
        for i in range(0, n_sentences, batch_size):
            sl = slice(i, i + batch_size)
            rows.append(language.conditionals(self.batch.inputs[sl], self.batch.masked[sl]))
        self.true = torch.cat(rows)  # [M, W] float64, rows in masked.nonzero() order
        self.entropy = entropy_of(self.true)  # [M]
        sentence_of_row = self.batch.masked.nonzero()[:, 0]
        # each masked token belongs to one of n_subsets disjoint groups of sentences
        self.subset = sentence_of_row * n_subsets // n_sentences
        self.n_subsets = n_subsets
        self.target_rows = self.batch.targets[self.batch.masked]

    @torch.no_grad()
    def log_probs(self, model: torch.nn.Module, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[M, vocab]`` float64 model log-probabilities at the held-out masked positions."""
        was_training = model.training
        model.eval()
        out = []
        for i in range(0, self.batch.inputs.shape[0], self.batch_size):
            inputs = self.batch.inputs[i:i + self.batch_size].to(device)
            masked = self.batch.masked[i:i + self.batch_size].to(device)
            logits = model(inputs)[masked]
            out.append(torch.log_softmax(logits.double(), dim=-1).cpu())
        model.train(was_training)
        return torch.cat(out)

    def evaluate(self, model: torch.nn.Module, device: torch.device | str = "cpu") -> dict:
        logq = self.log_probs(model, device)
        p = self.true
        words = logq[:, : self.n_words]
        expected_ce = -(p * words).sum(dim=1)  # E_p[-log q] per masked token
        kl = expected_ce - self.entropy
        sampled_ce = -logq.gather(1, self.target_rows[:, None]).squeeze(1)
        result = {"n_tokens": int(p.shape[0])}
        for name, values in (("loss", expected_ce), ("kl", kl), ("entropy", self.entropy),
                             ("sampled_loss", sampled_ce)):
            mean, std = self._mean_and_subset_std(values)
            result[name] = mean
            result[f"{name}_std"] = std
        result["log_kl"] = math.log(max(result["kl"], 1e-300))
        return result

    def _mean_and_subset_std(self, values: torch.Tensor) -> tuple[float, float]:
        means = torch.stack([values[self.subset == k].mean() for k in range(self.n_subsets)])
        std = float(means.std()) if self.n_subsets > 1 else float("nan")
        return float(values.mean()), std


NOT_DEFINED = "not defined for a corpus"


class HeldOutEvaluator:
    """The loss on real text (a ``Corpus``), where no true conditionals exist: the
    cross-entropy of the true tokens at masked positions of a fixed set of held-out
    sequences, and the same on a fixed set of training sequences, whose difference is the
    train/held-out gap of finite data. KL and entropy are ``None`` (never 0) with
    ``kl_note`` saying why."""

    def __init__(self, language, n_sentences: int, rate: float | None, seed: int, n_subsets: int = 5,
                 batch_size: int = 256):
        gen = step_generator(seed, 0, stream=1)
        held = language.split_batch("heldout", n_sentences)
        n_train = language.n_sequences("train")
        pick = torch.randperm(n_train, generator=gen)[:min(n_sentences, n_train)]
        train = language.batch_of(language.rows(pick.sort().values.numpy()))
        self.sets = {name: mask_batch(language, b.tokens, b.lengths, rate, gen) for name, b in
                     (("heldout", held), ("train", train))}
        self.batch_size = batch_size
        self.n_subsets = n_subsets

    @torch.no_grad()
    def _token_losses(self, model, batch, device) -> tuple[torch.Tensor, torch.Tensor]:
        out = []
        for i in range(0, batch.inputs.shape[0], self.batch_size):
            inputs = batch.inputs[i:i + self.batch_size].to(device)
            masked = batch.masked[i:i + self.batch_size].to(device)
            logq = torch.log_softmax(model(inputs)[masked].double(), dim=-1)
            target = batch.targets[i:i + self.batch_size].to(device)[masked]
            out.append(-logq.gather(1, target[:, None]).squeeze(1).cpu())
        rows = batch.masked.nonzero()[:, 0]
        return torch.cat(out), rows

    def evaluate(self, model: torch.nn.Module, device: torch.device | str = "cpu") -> dict:
        was_training = model.training
        model.eval()
        try:
            losses = {name: self._token_losses(model, b, device) for name, b in self.sets.items()}
        finally:
            model.train(was_training)
        result: dict = {}
        for name, (values, rows) in losses.items():
            n = self.sets[name].inputs.shape[0]
            subset = rows * self.n_subsets // max(n, 1)
            means = torch.stack([values[subset == k].mean() for k in range(self.n_subsets)
                                 if bool((subset == k).any())])
            result[f"{name}_loss"] = float(values.mean())
            result[f"{name}_loss_std"] = float(means.std()) if means.numel() > 1 else float("nan")
            result[f"{name}_tokens"] = int(values.numel())
        result.update(loss=result["heldout_loss"], loss_std=result["heldout_loss_std"],
                      sampled_loss=result["heldout_loss"], n_tokens=result["heldout_tokens"],
                      gap=result["heldout_loss"] - result["train_loss"],
                      kl=None, kl_std=None, log_kl=None, entropy=None, entropy_std=None, kl_note=NOT_DEFINED)
        return result


def make_evaluator(language, n_sentences: int, rate: float | None, seed: int, n_subsets: int = 5):
    """``ExactEvaluator`` for a language with exact conditionals, ``HeldOutEvaluator``
    for a corpus."""
    if getattr(language, "exact", True):
        return ExactEvaluator(language, n_sentences, rate, seed, n_subsets)
    return HeldOutEvaluator(language, n_sentences, rate, seed, n_subsets)
