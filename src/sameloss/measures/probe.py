"""Linear probe of a frozen encoder (App. A.5 of the paper).

"Since the CLS token is not trained in pre-training, we concatenate embeddings of all the
tokens in the sentence as the representations. We use AdamW with learning rate 1e-3 to
train the linear head ... for 100 epochs ... [optionally] a random Gaussian projection to
dimension 512 ... The error bar ... shows the standard deviation of 5 random seeds."

Representation. ``extract_features`` runs the encoder once over every split (``eval()``
mode, no gradients, in batches) and concatenates the final hidden states of *all*
``max_len`` positions into one ``[n, max_len · d_features]`` vector per sentence.
Positions holding ``pad_id`` are **zeroed**: a transformer's output at a pad position is
some function of the pad embedding and the real tokens (the pads are never attended
to, but they still attend), which is not a token representation; zeroing makes a
sentence's vector depend on its real tokens only, and makes the transformer agree with
the LSTM (whose pad features are already zero) and with the look-up table (``lookup.py``,
zero conditionals at pads). The languages' sentences are right-padded, so position ``t``
of every sentence is the ``t``-th word.

Head. Optionally a fixed Gaussian projection ``x ↦ x R`` with ``R ~ N(0, 1/D)`` to
``projection_dim`` dimensions (drawn from the seed), then standardisation (per feature;
mean and std fitted on the training split only; constant features get std 1), then a
linear layer ``W x + b`` trained with the cross-entropy on the training split by

* ``method="adamw"`` (the paper): minibatch AdamW, lr 1e-3, weight decay ``weight_decay``
  on ``W`` (not ``b``), ``epochs`` epochs (default 50; the paper's 100 is ``epochs=100``)
  in a seeded random order, ``W`` initialised
  U(±1/√D) from the seed; after every epoch the validation accuracy is measured and the
  head of the best epoch (earliest among ties) is the one tested ("early selection");
* ``method="lbfgs"``: the convex multinomial logistic regression
  ``mean CE + l2/2 · ‖W‖²`` solved to convergence by full-batch L-BFGS (strong-Wolfe line
  search) from ``W = 0``. Its optimum is unique and nothing in it is random, so without a
  projection it is solved once and every seed reports the same accuracy (std 0,
  ``settings["seed_independent"]``); the seed only changes the projection. Much faster than 100
  epochs of AdamW and free of optimiser noise.

``probe_features`` does all of this on precomputed feature matrices (``lookup.py`` reuses
it); ``linear_probe(model, data)`` extracts the features and calls it. Both return a
``DownstreamResult``: test accuracy mean ± std over seeds (std with ``ddof=1``), every
seed's numbers, the settings and the majority-class baseline.
"""

from __future__ import annotations

import dataclasses
import json
import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
import torch.nn.functional as F
from tqdm import tqdm

from sameloss.errors import UserError
from sameloss.files import atomic_write_text
from sameloss.measures.heads import METHODS, HeadTraining, fit_linear_heads
from sameloss.measures._compat import PROBE, old_keywords
from sameloss.measures.tasks import SPLITS, TaskData

DEFAULT_SEEDS = (0, 1, 2, 3, 4)
# the paper trains the head for 100 epochs; with early selection on validation accuracy
# 50 gives the same numbers on the tiny presets at half the cost
DEFAULT_EPOCHS = 50


@dataclass(frozen=True)
class ProbeSettings:
    """How a probe is run: the head's training (``heads.HeadTraining``: ``adamw``, the
    paper's, ``epochs`` at ``lr``; or ``lbfgs``, the exact convex solve with ``l2``, at most
    ``max_iter`` iterations), one probe per seed of ``seeds`` (the result is their mean ±
    std), and ``projection_dim``: a fixed random projection of the features to this size
    first (``None``: none)."""

    head: HeadTraining = field(default_factory=lambda: HeadTraining(epochs=DEFAULT_EPOCHS))
    seeds: Sequence[int] = DEFAULT_SEEDS
    projection_dim: int | None = None

    def __post_init__(self):
        if not self.seeds:
            raise UserError("the probe needs at least one seed")
        if self.projection_dim is not None and self.projection_dim < 1:
            raise UserError(f"projection_dim must be a positive integer, got {self.projection_dim}")
        if self.head.epochs < 1 and self.head.method == "adamw":
            raise UserError(f"epochs must be >= 1, got {self.head.epochs}")

    @classmethod
    def of(cls, method: str = "adamw", seeds: Sequence[int] = DEFAULT_SEEDS, projection_dim: int | None = None,
           **head) -> "ProbeSettings":
        """Settings from keywords: ``method`` and ``HeadTraining``'s fields (``epochs``, ``lr``,
        ``batch_size``, ``weight_decay``, ``l2``, ``max_iter``), ``seeds``, ``projection_dim``.
        An unknown method is a ``UserError``."""
        if method not in METHODS:
            raise UserError(f"unknown probe method {method!r}; choose from {', '.join(METHODS)}")
        return cls(HeadTraining(method, **{"epochs": DEFAULT_EPOCHS, **head}), tuple(seeds), projection_dim)


# ---- results ----------------------------------------------------------------------------
@dataclass
class DownstreamResult:
    """Test accuracy of one downstream measure over several seeds (fractions in [0, 1]).

    measure: ``"linear_probe"``, ``"finetune"`` or ``"lookup_table"``.
    mean, std: over ``accuracies`` (one per seed; std with ``ddof=1``, 0 for one seed).
    majority_rate: test accuracy of always predicting the most frequent training class.
    per_seed: each seed's details (validation / training accuracy, selected epoch, ...).
    settings: everything that produced the numbers (method, epochs, lr, projection, ...).
    """

    measure: str
    language: str
    task: str
    mean: float
    std: float
    accuracies: list[float]
    seeds: list[int]
    n_classes: int
    n_train: int
    n_validation: int
    n_test: int
    majority_rate: float
    settings: dict = field(default_factory=dict)
    per_seed: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        """Plain data for JSON; NaN (e.g. no validation split) becomes ``None``."""
        return _finite(dataclasses.asdict(self))

    def to_json(self, path: str | Path | None = None) -> str:
        text = json.dumps(self.to_dict(), indent=2, allow_nan=False)
        if path is not None:
            atomic_write_text(path, text + "\n")
        return text

    def __str__(self) -> str:
        return (f"{self.measure} {self.language}/{self.task}: {100 * self.mean:.1f} ± {100 * self.std:.1f}% "
                f"({len(self.accuracies)} seeds; majority {100 * self.majority_rate:.1f}%)")


def _finite(obj):
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _finite(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_finite(v) for v in obj]
    return obj


def summarize(accuracies: Sequence[float]) -> tuple[float, float]:
    """Mean and sample standard deviation (``ddof=1``; 0 for a single value)."""
    acc = torch.tensor(list(accuracies), dtype=torch.float64)
    if acc.numel() == 0:
        raise ValueError("no accuracies to summarise")
    std = float(acc.std(unbiased=True)) if acc.numel() > 1 else 0.0
    return float(acc.mean()), std


def make_result(measure: str, data: TaskData, per_seed: list[dict], seeds: Sequence[int],
                settings: dict) -> DownstreamResult:
    accuracies = [float(r["test_accuracy"]) for r in per_seed]
    mean, std = summarize(accuracies)
    sizes = data.sizes()
    return DownstreamResult(
        measure=measure, language=data.language, task=data.task, mean=mean, std=std,
        accuracies=accuracies, seeds=[int(s) for s in seeds], n_classes=data.n_classes,
        n_train=sizes["train"], n_validation=sizes["validation"], n_test=sizes["test"],
        majority_rate=data.majority()[1], settings=dict(settings), per_seed=per_seed)


# ---- features -----------------------------------------------------------------------------
def _device_of(model: torch.nn.Module) -> torch.device:
    try:
        return next(model.parameters()).device
    except StopIteration:
        return torch.device("cpu")


@torch.no_grad()
def extract_features(model: torch.nn.Module, tokens: torch.Tensor, pad_id: int, batch_size: int = 512,
                     progress: bool = False) -> torch.Tensor:
    """``model.features`` of every position, concatenated: float32 ``[n, T · d_features]``
    on the CPU, zero at pad positions. Runs in ``eval()`` mode without gradients and
    restores the model's mode afterwards."""
    was_training = model.training
    model.eval()
    device = _device_of(model)
    n, T = tokens.shape
    out = None
    try:
        starts = range(0, n, batch_size)
        for start in tqdm(starts, desc="features", unit="batch", disable=not progress, leave=False):
            tok = tokens[start:start + batch_size].to(device)
            h = model.features(tok).float()
            h = h.masked_fill((tok == pad_id)[..., None], 0.0)
            if out is None:
                out = torch.empty(n, T * h.shape[-1], dtype=torch.float32)
            out[start:start + tok.shape[0]] = h.reshape(tok.shape[0], -1).cpu()
    finally:
        model.train(was_training)
    if out is None:
        d = getattr(model, "d_features", 0)
        out = torch.empty(0, T * d, dtype=torch.float32)
    return out


def model_pad_id(model: torch.nn.Module) -> int:
    """The pad id a model was built with (``model.config.pad_id``)."""
    try:
        return int(model.config.pad_id)
    except AttributeError:
        raise UserError("the model has no config.pad_id; pass pad_id= explicitly") from None


def gaussian_projection(dim_in: int, dim_out: int, seed: int) -> torch.Tensor:
    """A fixed ``[dim_in, dim_out]`` matrix with i.i.d. N(0, 1/dim_in) entries (from
    ``seed``), so projected features keep roughly the scale of the inputs."""
    gen = torch.Generator().manual_seed(int(seed) + 7_919)
    return torch.randn(dim_in, dim_out, generator=gen) / math.sqrt(max(dim_in, 1))


def standardize(train: torch.Tensor, *others: torch.Tensor, eps: float = 1e-6) -> list[torch.Tensor]:
    """Subtract the training mean and divide by the training std (per feature; a feature
    that is constant on the training split gets std 1)."""
    mean = train.mean(dim=0)
    std = train.std(dim=0, unbiased=False) if train.shape[0] > 1 else torch.ones_like(mean)
    std = torch.where(std > eps, std, torch.ones_like(std))
    return [(x - mean) / std for x in (train, *others)]


# ---- the head -----------------------------------------------------------------------------
@dataclass
class Head:
    """A trained linear head ``logits = x W^T + b`` with its training record."""

    weight: torch.Tensor  # [n_classes, D]
    bias: torch.Tensor  # [n_classes]
    best_epoch: int | None = None  # AdamW: the selected epoch (1-based)
    validation_accuracy: float = float("nan")
    train_accuracy: float = float("nan")
    iterations: int | None = None  # L-BFGS: iterations used
    final_loss: float = float("nan")  # objective on the training split

    def logits(self, x: torch.Tensor) -> torch.Tensor:
        return F.linear(x, self.weight, self.bias)

    def accuracy(self, x: torch.Tensor, y: torch.Tensor, batch_size: int = 65_536) -> float:
        if y.numel() == 0:
            return float("nan")
        correct = 0
        for start in range(0, y.numel(), batch_size):
            pred = self.logits(x[start:start + batch_size].to(self.weight.device)).argmax(dim=1)
            correct += int((pred == y[start:start + batch_size].to(pred.device)).sum())
        return correct / y.numel()


def _check_inputs(x: torch.Tensor, y: torch.Tensor, n_classes: int, name: str) -> None:
    if x.ndim != 2 or y.ndim != 1 or x.shape[0] != y.shape[0]:
        raise ValueError(f"{name}: features must be [n, D] and labels [n], got {tuple(x.shape)} and {tuple(y.shape)}")
    if y.numel() and (int(y.min()) < 0 or int(y.max()) >= n_classes):
        raise ValueError(f"{name}: labels must lie in 0..{n_classes - 1}")


def train_head(train: tuple[torch.Tensor, torch.Tensor], validation: tuple[torch.Tensor, torch.Tensor],
               n_classes: int, head: HeadTraining = HeadTraining(epochs=DEFAULT_EPOCHS), seed: int = 0,
               device: str | torch.device = "cpu", progress: bool = False) -> Head:
    """Train a linear head on precomputed (already projected / standardised) features
    ``train = (x, y)``, selected on ``validation = (x, y)``.

    ``adamw``: minibatch AdamW for ``epochs`` epochs, keeping the head of the epoch with
    the best validation accuracy (earliest among ties; the last epoch if there is no
    validation split). ``lbfgs``: full-batch L-BFGS on ``mean CE + l2/2 ‖W‖²`` from zero,
    at most ``max_iter`` iterations (``heads.fit_linear_heads``, the routine the few-shot
    probes share). The caller's global RNG is not touched. The head is trained on
    ``device`` (the features are moved there); it is returned on the CPU.
    """
    (x_train, y_train), (x_val, y_val) = train, validation
    _check_inputs(x_train, y_train, n_classes, "train")
    _check_inputs(x_val, y_val, n_classes, "validation")
    device = torch.device(device)
    x_train, y_train = x_train.float().to(device), y_train.to(device)
    x_val, y_val = x_val.float().to(device), y_val.to(device)
    fit = fit_linear_heads(x_train, y_train, n_classes, head, seed=seed, validation=(x_val, y_val), progress=progress)
    if head.method == "lbfgs":
        fitted = Head(fit.W.clone(), fit.b.clone(), iterations=fit.iterations, final_loss=fit.objective)
    else:
        with torch.no_grad():
            final = float(F.cross_entropy(F.linear(x_train, fit.W, fit.b), y_train)) if len(y_train) else float("nan")
        fitted = Head(fit.W, fit.b, best_epoch=fit.best_epoch, final_loss=final)
    with torch.no_grad():
        fitted.validation_accuracy = fitted.accuracy(x_val, y_val)
        fitted.train_accuracy = fitted.accuracy(x_train, y_train)
    fitted.weight, fitted.bias = fitted.weight.cpu(), fitted.bias.cpu()
    return fitted


# ---- the probe ----------------------------------------------------------------------------
@old_keywords("settings", 2, ProbeSettings.of, PROBE, positional=("measure", str, False))
def probe_features(features: dict[str, torch.Tensor], data: TaskData, settings: ProbeSettings = ProbeSettings(),
                   measure: str = "linear_probe", extra_settings: dict | None = None,
                   device: str | torch.device = "cpu", progress: bool = False) -> DownstreamResult:
    """Linear probe on precomputed representations ``features[split]`` (``[n, D]``, rows
    aligned with ``data``'s splits): per seed, project (optional), standardise on train,
    train a head (``train_head``, on ``device``) and test it. See the module docstring."""
    how, projection_dim, seeds = settings.head, settings.projection_dim, settings.seeds
    labels = {s: getattr(data, s).labels for s in SPLITS}
    for s in SPLITS:
        if features[s].shape[0] != labels[s].shape[0]:
            raise ValueError(f"{s}: {features[s].shape[0]} feature rows for {labels[s].shape[0]} labels")
    D = features["train"].shape[1]
    if projection_dim is None:  # standardisation does not depend on the seed: do it once
        fixed = standardize(*(features[s].float() for s in SPLITS))
    # L-BFGS from zero without a projection involves no randomness: solve it once
    seed_independent = how.method == "lbfgs" and projection_dim is None
    per_seed = []
    for seed in tqdm(list(seeds), desc=measure, unit="seed", disable=not progress, leave=False):
        if seed_independent and per_seed:
            per_seed.append({**per_seed[0], "seed": int(seed)})
            continue
        if projection_dim is None:
            x_tr, x_va, x_te = fixed
        else:
            R = gaussian_projection(D, projection_dim, seed)
            x_tr, x_va, x_te = standardize(*(features[s].float() @ R for s in SPLITS))
        head = train_head((x_tr, labels["train"]), (x_va, labels["validation"]), data.n_classes, how, seed=seed,
                          device=device, progress=progress)
        per_seed.append({
            "seed": int(seed),
            "test_accuracy": head.accuracy(x_te, labels["test"]),
            "validation_accuracy": head.validation_accuracy,
            "train_accuracy": head.train_accuracy,
            "train_loss": head.final_loss,
            "best_epoch": head.best_epoch,
            "iterations": head.iterations,
        })
    record = {"method": how.method, "feature_dim": int(D), "projection_dim": projection_dim,
              "standardize": True, "data_seed": data.seed, "seed_independent": seed_independent}
    if how.method == "adamw":
        record.update(epochs=how.epochs, lr=how.lr, batch_size=how.batch_size, weight_decay=how.weight_decay,
                      selection="best validation accuracy")
    else:
        record.update(l2=how.l2, max_iter=how.max_iter)
    record.update(extra_settings or {})
    return make_result(measure, data, per_seed, seeds, record)


@old_keywords("settings", 2, ProbeSettings.of, PROBE, positional=("method", str, True))
def linear_probe(model: torch.nn.Module, data: TaskData, settings: ProbeSettings = ProbeSettings(),
                 feature_batch_size: int = 512, pad_id: int | None = None, progress: bool = False) -> DownstreamResult:
    """Linear probe of a frozen ``model`` on a task: features of all positions concatenated
    (pads zeroed), computed once; then ``probe_features`` (the head is trained on the
    model's device).

    Args:
        model: anything with ``features(tokens) -> [n, T, d]``.
        data: the task's train / validation / test splits (``make_task_data``).
        settings: the head's training, the seeds and the projection (``ProbeSettings``;
            e.g. ``ProbeSettings.of("lbfgs", seeds=(0,))``).
        feature_batch_size: sentences per feature pass.
        pad_id: the padding id (default ``model.config.pad_id``).
        progress: show a progress bar.

    Returns:
        the test accuracy (mean and std over the seeds) with the settings used.
    """
    pad_id = model_pad_id(model) if pad_id is None else pad_id
    features = {s: extract_features(model, getattr(data, s).tokens, pad_id, feature_batch_size, progress)
                for s in SPLITS}
    extra = {"representation": "concatenated final hidden states of all positions, pad positions zeroed",
             "d_features": features["train"].shape[1] // data.train.tokens.shape[1]}
    return probe_features(features, data, settings, measure="linear_probe", extra_settings=extra,
                          device=_device_of(model), progress=progress)
