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
    """Held-out sentences, masks and true conditionals, computed once per run.

    Device-correct: the model runs on ``device`` chunk by chunk, each chunk's true
    conditionals are copied there, and only per-token values stay on the device; the
    results are read back once, at the end of ``evaluate`` (no read-back per chunk).
    The masked positions are picked by indices computed on the host (``MaskedBatch.to``),
    which needs no read-back either."""

    QUANTITIES = ("loss", "kl", "entropy", "sampled_loss")

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
        # rows are in sentence order, so each subset is a contiguous run of rows
        counts = torch.bincount(self.subset, minlength=n_subsets).tolist()
        bounds = [0] + torch.tensor(counts).cumsum(0).tolist()
        self._subset_slices = [slice(bounds[k], bounds[k + 1]) for k in range(n_subsets)]
        # (first row, rows) of every chunk of sentences
        per_sentence = self.batch.masked.sum(dim=1)
        self._chunk_rows = []
        row = 0
        for i in range(0, n_sentences, batch_size):
            k = int(per_sentence[i:i + batch_size].sum())
            self._chunk_rows.append((row, k))
            row += k

    def _chunks(self, model: torch.nn.Module, device):
        """``(first row, log q [rows, vocab] float64 on device)`` per chunk of sentences."""
        for (row, _), i in zip(self._chunk_rows, range(0, self.batch.inputs.shape[0], self.batch_size)):
            chunk = self.batch.rows(i, i + self.batch_size).to(device)
            yield row, torch.log_softmax(chunk.at_masked(model(chunk.inputs)).double(), dim=-1)

    @torch.no_grad()
    def log_probs(self, model: torch.nn.Module, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[M, vocab]`` float64 model log-probabilities at the held-out masked positions
        (on the host)."""
        was_training = model.training
        model.eval()
        try:
            return torch.cat([logq for _, logq in self._chunks(model, device)]).cpu()
        finally:
            model.train(was_training)

    def evaluate(self, model: torch.nn.Module, device: torch.device | str = "cpu") -> dict:
        table = self.table(model, device).tolist()  # the one read-back
        result = {"n_tokens": int(self.true.shape[0])}
        for name, (mean, *subsets) in zip(self.QUANTITIES, table):
            result[name] = mean
            result[f"{name}_std"] = _std(subsets)
        result["log_kl"] = math.log(max(result["kl"], 1e-300))
        return result

    @torch.no_grad()
    def table(self, model: torch.nn.Module, device: torch.device | str = "cpu") -> torch.Tensor:
        """``[len(QUANTITIES), 1 + n_subsets]`` float64 on ``device``: per quantity, its
        mean over the held-out tokens and each subset's mean."""
        was_training = model.training
        model.eval()
        try:
            values = {name: [] for name in self.QUANTITIES}
            for row, logq in self._chunks(model, device):
                sl = slice(row, row + logq.shape[0])
                p = self.true[sl].to(device)
                entropy = self.entropy[sl].to(device)
                expected_ce = -(p * logq[:, : self.n_words]).sum(dim=1)  # E_p[-log q] per masked token
                targets = self.target_rows[sl].to(device)
                values["loss"].append(expected_ce)
                values["kl"].append(expected_ce - entropy)
                values["entropy"].append(entropy)
                values["sampled_loss"].append(-logq.gather(1, targets[:, None]).squeeze(1))
        finally:
            model.train(was_training)
        return torch.stack([self._means(torch.cat(values[name])) for name in self.QUANTITIES])

    def _means(self, values: torch.Tensor) -> torch.Tensor:
        """``[1 + n_subsets]``: the mean of ``values``, then each subset's."""
        return torch.stack([values.mean()] + [values[sl].mean() for sl in self._subset_slices])


def _std(values: list[float]) -> float:
    """Sample standard deviation (``nan`` for fewer than two), as ``torch.std``."""
    if len(values) < 2:
        return float("nan")
    return float(torch.tensor(values, dtype=torch.float64).std())


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
        """Per masked token, the cross-entropy of the true token (kept on the device and
        read back once), and the token's sentence."""
        out = []
        for i in range(0, batch.inputs.shape[0], self.batch_size):
            chunk = batch.rows(i, i + self.batch_size).to(device)
            logq = torch.log_softmax(chunk.at_masked(model(chunk.inputs)).double(), dim=-1)
            out.append(-logq.gather(1, chunk.at_masked(chunk.targets)[:, None]).squeeze(1))
        rows = batch.masked.nonzero()[:, 0]
        return torch.cat(out).cpu(), rows

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
