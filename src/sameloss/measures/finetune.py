"""Fine-tuning: the whole encoder plus a linear head, trained on a downstream task
(App. A.5: "we use the contextual embeddings of the CLS token for fine-tuning. We use
AdamW with learning rate 1e-4. We perform 200 warmup steps and train on the downstream
tasks for 10 epochs"; 5 seeds).

Sentence representation (``pooling``). The paper reads a CLS token, following Devlin et al.
Here the models' position tables have exactly ``language.max_len`` rows and HMM and Dyck
sentences always fill them, so a prepended ``[CLS]`` would not fit without dropping a
word (or adding a position row that pre-training never trained, or shifting every word's
position away from the one it was pre-trained at). A CLS token is also never seen in
pre-training here (the paper's point for not probing it), so its output is a pooling
that fine-tuning has to learn. The choice here keeps every word at its pre-trained
position and adds no untrained input:

* ``"mean"`` (default): the mean of the final hidden states over the real (non-pad)
  positions — a single ``d_features`` vector, like a CLS output, whose pooling weights are
  fixed but which the fine-tuned encoder can shape (attention can route any position's
  information into every position's output);
* ``"concat"``: the linear probe's representation (all positions concatenated, pads
  zeroed), so fine-tuning and probing differ only in whether the encoder is trained;
* ``"cls"``: the final hidden state at position 0 — the paper's recipe, for models
  pre-trained with a ``[CLS]`` token there (the corpus language; ``measure`` picks it
  for them).

Training (per seed): a fresh ``copy.deepcopy`` of the model (the caller's model and
checkpoint are never modified), in ``train()`` mode, so dropout is the model's own
(the pre-training config's); a head ``N(0, 0.02)`` (BERT's init) from the seed; AdamW
(lr ``lr``, betas (0.9, 0.999), eps 1e-6, weight decay ``weight_decay`` on matrices only,
as in pre-training); ``warmup_steps`` of linear warm-up, then linear decay to zero over
the remaining steps (Devlin et al.'s schedule, ``schedule="linear"``) or a constant rate
(``"constant"``); minibatches in a seeded order; the dropout masks come from the seed
too (inside ``torch.random.fork_rng``, so the caller's RNG is untouched). After every
epoch the validation accuracy is measured; ``select="best"`` tests the weights of the
best epoch (earliest among ties; this keeps one copy of the weights), ``"last"`` the
final ones.
"""

from __future__ import annotations

import copy
import dataclasses
import math
from collections.abc import Sequence
from dataclasses import dataclass

import torch
import torch.nn.functional as F
from torch import nn
from tqdm import tqdm

from sameloss.errors import UserError
from sameloss.measures.probe import DEFAULT_SEEDS, DownstreamResult, make_result, model_pad_id
from sameloss.measures.tasks import TaskData

POOLINGS = ("mean", "concat", "cls")
SCHEDULES = ("linear", "constant")
SELECTIONS = ("best", "last")


class Classifier(nn.Module):
    """``encoder.features`` → pooling → ``nn.Linear``: logits ``[n, n_classes]``."""

    def __init__(self, encoder: nn.Module, n_classes: int, pad_id: int, max_len: int, pooling: str = "mean",
                 generator: torch.Generator | None = None, init_std: float = 0.02):
        super().__init__()
        if pooling not in POOLINGS:
            raise UserError(f"unknown pooling {pooling!r}; choose from {', '.join(POOLINGS)}")
        self.encoder, self.pad_id, self.pooling, self.max_len = encoder, pad_id, pooling, max_len
        d = encoder.d_features * (max_len if pooling == "concat" else 1)
        self.head = nn.Linear(d, n_classes)
        with torch.no_grad():
            w = torch.randn(self.head.weight.shape, generator=generator) * init_std
            self.head.weight.copy_(w)
            self.head.bias.zero_()

    def pooled(self, tokens: torch.Tensor) -> torch.Tensor:
        h = self.encoder.features(tokens)
        real = (tokens != self.pad_id)[..., None]
        h = h * real  # pads contribute nothing (and are zero in "concat")
        if self.pooling == "mean":
            return h.sum(dim=1) / real.sum(dim=1).clamp(min=1)
        if self.pooling == "cls":
            return h[:, 0]
        if tokens.shape[1] != self.max_len:
            raise ValueError(f"concat pooling needs inputs of width {self.max_len}, got {tokens.shape[1]}")
        return h.reshape(tokens.shape[0], -1)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.pooled(tokens))


@torch.no_grad()
def accuracy(classifier: nn.Module, tokens: torch.Tensor, labels: torch.Tensor, batch_size: int = 512) -> float:
    """Accuracy in ``eval()`` mode (the mode is restored afterwards)."""
    if labels.numel() == 0:
        return float("nan")
    was_training = classifier.training
    classifier.eval()
    device = next(classifier.parameters()).device
    correct = 0
    try:
        for start in range(0, labels.numel(), batch_size):
            logits = classifier(tokens[start:start + batch_size].to(device))
            correct += int((logits.argmax(dim=1).cpu() == labels[start:start + batch_size]).sum())
    finally:
        classifier.train(was_training)
    return correct / labels.numel()


def lr_factor(step: int, warmup_steps: int, total_steps: int, schedule: str) -> float:
    """Multiplier of the base rate at (0-based) ``step``: linear warm-up to 1 over
    ``warmup_steps``, then 1 (``constant``) or a linear decay reaching 0 after
    ``total_steps`` (``linear``)."""
    warm = min(1.0, (step + 1) / warmup_steps) if warmup_steps > 0 else 1.0
    if schedule == "constant" or step < warmup_steps:
        return warm
    return max(0.0, (total_steps - step) / max(1, total_steps - warmup_steps))


@dataclass(frozen=True)
class FinetuneSettings:
    """How each seed fine-tunes (the paper's settings are the defaults: AdamW lr 1e-4, 200
    warm-up steps, 10 epochs): ``pooling``, how the head reads the sentence (``mean`` over
    positions, ``concat``, or ``cls``); ``epochs``; AdamW's ``lr`` and ``weight_decay``;
    ``warmup_steps`` of linear warm-up; ``batch_size`` examples a step; ``schedule``, the lr
    after the warm-up (``linear`` decay or ``constant``); ``select``, ``best`` (the epoch of
    the best validation accuracy) or ``last``. A bad setting is a ``UserError``."""

    pooling: str = "mean"
    epochs: int = 10
    lr: float = 1e-4
    warmup_steps: int = 200
    batch_size: int = 32
    weight_decay: float = 0.01
    schedule: str = "linear"
    select: str = "best"

    def __post_init__(self):
        if self.pooling not in POOLINGS:
            raise UserError(f"unknown pooling {self.pooling!r}; choose from {', '.join(POOLINGS)}")
        if self.schedule not in SCHEDULES:
            raise UserError(f"unknown schedule {self.schedule!r}; choose from {', '.join(SCHEDULES)}")
        if self.select not in SELECTIONS:
            raise UserError(f"unknown selection {self.select!r}; choose from {', '.join(SELECTIONS)}")
        if self.epochs < 1 or self.batch_size < 1 or self.lr <= 0 or self.warmup_steps < 0:
            raise UserError("finetune needs epochs >= 1, batch_size >= 1, lr > 0 and warmup_steps >= 0")


def finetune_one(model: nn.Module, data: TaskData, seed: int, settings: FinetuneSettings = FinetuneSettings(),
                 pad_id: int | None = None, progress: bool = False) -> dict:
    """Fine-tune a copy of ``model`` with one seed; that seed's record (see ``finetune``)."""
    pad_id = model_pad_id(model) if pad_id is None else pad_id
    device = next(model.parameters()).device
    devices = [device.index if device.index is not None else torch.cuda.current_device()] \
        if device.type == "cuda" else []
    with torch.random.fork_rng(devices=devices):  # dropout masks (and nn.Linear's init) from the seed
        torch.manual_seed(int(seed))
        return _finetune_one(model, data, seed, device, pad_id, settings, progress)


def _finetune_one(model, data, seed, device, pad_id, settings: FinetuneSettings, progress) -> dict:
    pooling, epochs, lr, warmup_steps = settings.pooling, settings.epochs, settings.lr, settings.warmup_steps
    batch_size, weight_decay, schedule, select = (settings.batch_size, settings.weight_decay, settings.schedule,
                                                  settings.select)
    gen = torch.Generator().manual_seed(int(seed))
    encoder = copy.deepcopy(model)
    encoder.requires_grad_(True)
    clf = Classifier(encoder, data.n_classes, pad_id, data.train.tokens.shape[1], pooling, generator=gen).to(device)
    params = [p for p in clf.parameters() if p.requires_grad]
    groups = [{"params": [p for p in params if p.dim() >= 2], "weight_decay": weight_decay},
              {"params": [p for p in params if p.dim() < 2], "weight_decay": 0.0}]
    opt = torch.optim.AdamW(groups, lr=lr, betas=(0.9, 0.999), eps=1e-6)
    x, y = data.train.tokens, data.train.labels
    n = y.numel()
    steps_per_epoch = math.ceil(n / batch_size)
    total = steps_per_epoch * epochs
    sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: lr_factor(s, warmup_steps, total, schedule))
    best_acc, best_state, best_epoch, last_loss = -1.0, None, epochs, float("nan")
    history = []
    for epoch in tqdm(range(1, epochs + 1), desc=f"finetune seed {seed}", unit="epoch",
                      disable=not progress, leave=False):
        clf.train()
        order = torch.randperm(n, generator=gen)
        total_loss = 0.0
        for start in range(0, n, batch_size):
            idx = order[start:start + batch_size]
            loss = F.cross_entropy(clf(x[idx].to(device)), y[idx].to(device))
            opt.zero_grad(set_to_none=True)
            loss.backward()
            opt.step()
            sched.step()
            total_loss += float(loss.detach()) * idx.numel()
        last_loss = total_loss / max(n, 1)
        val = accuracy(clf, data.validation.tokens, data.validation.labels)
        history.append({"epoch": epoch, "train_loss": last_loss, "validation_accuracy": val})
        if select == "best" and val > best_acc:
            best_acc, best_epoch = val, epoch
            best_state = copy.deepcopy(clf.state_dict())
    if select == "best" and best_state is not None:
        clf.load_state_dict(best_state)
    else:
        best_epoch = epochs
    return {
        "seed": int(seed),
        "test_accuracy": accuracy(clf, data.test.tokens, data.test.labels),
        "validation_accuracy": accuracy(clf, data.validation.tokens, data.validation.labels),
        "train_accuracy": accuracy(clf, x, y),
        "selected_epoch": best_epoch,
        "steps": total,
        "history": history,
    }


def finetune(model: nn.Module, data: TaskData, settings: FinetuneSettings = FinetuneSettings(),
             seeds: Sequence[int] = DEFAULT_SEEDS, pad_id: int | None = None,
             progress: bool = False) -> DownstreamResult:
    """Fine-tune a fresh copy of ``model`` (encoder + linear head on a pooled
    representation) once per seed. The paper's settings are the defaults (AdamW lr 1e-4,
    200 warm-up steps, 10 epochs, 5 seeds); the module docstring has the pooling and the
    schedule.

    Args:
        model: the encoder (left unchanged: each seed fine-tunes a copy).
        data: the task's splits (``make_task_data``).
        settings: pooling, epochs, optimiser, schedule and selection (``FinetuneSettings``;
            e.g. ``FinetuneSettings(pooling="cls", epochs=3)``).
        seeds: one fine-tuning per seed.
        pad_id: the padding id (default ``model.config.pad_id``).
        progress: show a progress bar.

    Returns:
        the test accuracy, mean ± std over the seeds, with each seed's record.
    """
    if not seeds:
        raise UserError("finetune needs at least one seed")
    per_seed = [finetune_one(model, data, seed, settings, pad_id=pad_id, progress=progress)
                for seed in tqdm(list(seeds), desc="finetune", unit="seed", disable=not progress, leave=False)]
    record = {**dataclasses.asdict(settings), "optimizer": "AdamW(betas=(0.9, 0.999), eps=1e-6)",
              "data_seed": data.seed, "dropout": getattr(getattr(model, "config", None), "dropout", None)}
    return make_result("finetune", data, per_seed, seeds, record)
