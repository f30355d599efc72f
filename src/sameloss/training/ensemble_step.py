"""One step of an ensemble (``training.ensemble``) and the members' log windows.

``step_members`` is the one-model loop's ``_step`` (``loop.py``) for every member of a
stack at once, in the same order of operations: the members' batches (each its seed's batch
``step``, drawn once per seed: forks of one seed share it), SAM's ascent on the first halves,
the update forward on the halves or whole batches, the adversarial objective and the flatness
penalty, one backward pass, clipping, the optimiser and each member's schedule. The arithmetic
is ``stacked.py``'s.

``StackedWindow`` is ``loop.LogWindow`` with a members axis: the sums since each member's last
log line stay on the device, added without a read-back (a step never waits on the device), in
float64 in step order as ``LogWindow`` sums them — so a member's ``metrics.jsonl`` holds the
numbers its one-model window would. ``take(i)`` hands member ``i``'s window to the one-model
``_log`` / ``_save`` as a ``LogWindow``; ``put`` takes it back.
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import torch
from torch.nn.utils.stateless import _reparametrize_module

from . import keyed, loop, stacked
from .data import global_batch, step_generator
from .loop import LogWindow
from .objectives.sam import SAM


@dataclass
class Member:
    """One run of an ensemble: its ``loop.Run`` (model, optimiser and schedule are its home
    between stackings), its first step, the RNG states its one-model run holds (advanced by
    its own global-RNG dropout draws under the loop strategy), and whether this call
    created its folder."""

    index: int
    run: loop.Run
    start: int
    rng: torch.Tensor
    cuda_rng: torch.Tensor | None
    created: bool
    resumed: bool

    @property
    def cfg(self):
        return self.run.cfg


@dataclass
class StepOut:
    """What a step leaves for the members' logs (``loop.StepResult`` per member, stacked)."""

    summed: torch.Tensor  # [S] summed cross-entropy, detached, on the device
    n_targets: list[int]
    tokens: list[int]
    downstream: torch.Tensor | None = None
    grad_norm: torch.Tensor | None = None
    flatness: torch.Tensor | None = None


def _base(optimizer):
    return optimizer.base if isinstance(optimizer, SAM) else optimizer


def _draws(members, step: int, n_sites: int, device) -> stacked.DropoutDraws | None:
    if not any(m.cfg.dropout_draws == "keyed" for m in members):
        return None
    rates = [m.cfg.model.dropout for m in members]
    keys, thresholds, scales = keyed.stacked([m.cfg.seed for m in members], step, rates, n_sites, device)
    return stacked.DropoutDraws(keys, thresholds, scales, off=all(r == 0 for r in rates))


def _adversarial_batches(members, step: int, device) -> tuple[torch.Tensor, torch.Tensor]:
    """Each member's labelled batch of ``step`` (its objective's ``loss``: the same draw)."""
    drawn: dict[int, tuple[torch.Tensor, torch.Tensor]] = {}
    for m in members:
        a = m.run.adversary
        if m.cfg.seed not in drawn:
            gen = step_generator(a.seed, step, stream=4)
            idx = torch.randperm(a.tokens.shape[0], generator=gen)[: a.batch_size]
            drawn[m.cfg.seed] = (a.tokens[idx], a.labels[idx])
    tokens = [drawn[m.cfg.seed][0] for m in members]
    if len({t.shape for t in tokens}) > 1:
        raise ValueError("the members' adversarial pools are too small for one batch size")
    return torch.stack(tokens).to(device), torch.stack([drawn[m.cfg.seed][1] for m in members]).to(device)


@contextlib.contextmanager
def _own_draws(m: Member, step: int, pass_: int):
    """Member ``m``'s dropout draws for one forward pass of its own module, as its one-model
    loop opens them: keyed masks, or the global RNG set to the member's own state (and its
    state taken back after: the draws advanced it)."""
    cfg, device = m.cfg, m.run.device
    if cfg.dropout_draws == "keyed":
        with keyed.draws(keyed.one_model(cfg.seed, step, pass_, cfg.model.dropout, m.run.model.keyed_sites, device)):
            yield
    elif cfg.model.dropout > 0:
        torch.set_rng_state(m.rng)
        if m.cuda_rng is not None:
            torch.cuda.set_rng_state(m.cuda_rng)
        try:
            yield
        finally:
            m.rng = torch.get_rng_state()
            if m.cuda_rng is not None:
                m.cuda_rng = torch.cuda.get_rng_state()
    else:
        yield


def _loop_losses(st: stacked.Stack, members, used, step: int, pass_: int, out: StepOut | None) -> torch.Tensor:
    """The loop strategy's losses ``[S]``: member by member, the one-model loop's own code
    (``mlm_loss``, the adversarial objective, the flatness penalty) on the member's module
    with its slice of the stack swapped in; ``out``: the update pass, whose logged values
    are kept there."""
    views = {n: p.unbind(0) for n, p in st.params.items()}  # one backward node per parameter
    losses, summed, down, flat = [], [], [], []
    for i, m in enumerate(members):
        r = m.run
        with _reparametrize_module(r.model, {n: v[i] for n, v in views.items()}):
            batch = used[i].shard(0, 1).to(r.device)
            with r.autocast:
                with _own_draws(m, step, pass_):
                    loss, s = loop.mlm_loss(r.model, batch, used[i].n_targets, 1)
                if out is not None and r.adversary is not None:
                    with _own_draws(m, step, keyed.PASS_ADVERSARIAL):
                        adv, d = r.adversary.loss(r.model, step, r.device)
                    loss = loss + adv
                    down.append(d)
            if out is not None and r.flatness is not None:
                penalty, f = r.flatness.loss(r.model, used[i], step)
                loss = loss + penalty
                flat.append(f)
        losses.append(loss)
        summed.append(s)
    if out is not None:
        out.summed = torch.stack(summed)
        out.downstream = torch.stack(down) if down else None
        out.flatness = torch.stack(flat) if flat else None
    return torch.stack(losses)


def _vmap_losses(st: stacked.Stack, template, members, used, step: int, pass_: int, out: StepOut | None
                 ) -> torch.Tensor:
    """The vmap strategy's losses ``[S]``: the members' forward passes as one batched
    computation (``stacked``); the flatness penalty member by member."""
    first = members[0].run
    device = first.device
    draws = _draws(members, step, getattr(template, "keyed_sites", 0), device)
    b = stacked.batches(used, first.language.pad_id, device)
    with first.autocast:
        loss, summed = stacked.mlm_losses(template, st, b, draws, pass_)
        if out is not None and first.adversary is not None:
            tokens, labels = _adversarial_batches(members, step, device)
            weights = torch.tensor([m.run.adversary.weight for m in members], device=device)
            adv, out.downstream = stacked.adversarial_losses(template, st, first.adversary, tokens, labels, weights,
                                                             draws)
            loss = loss + adv
    if out is not None:
        out.summed = summed
        if first.flatness is not None:  # outside autocast: the penalty computes in float32
            penalties, estimates = [], []
            for i, m in enumerate(members):
                with _reparametrize_module(m.run.model, st.member(i, detach=False)):
                    penalty, estimate = m.run.flatness.loss(m.run.model, used[i], step)
                penalties.append(penalty)
                estimates.append(estimate)
            loss = loss + torch.stack(penalties)
            out.flatness = torch.stack(estimates)
    return loss


def step_members(st: stacked.Stack, template, members: list[Member], step: int, want_norm: bool,
                 strategy: str = "vmap", drawn: dict | None = None) -> StepOut:
    """One update of every member (module docstring); ``want_norm``: keep the gradient norms
    (a log step; clipping computes them anyway); ``strategy``: ``vmap`` (one batched
    forward pass) or ``loop`` (member by member, the one-model code; ``template`` unused);
    ``drawn``: the members' batches of ``step`` by seed, drawn ahead (``ensemble_data``)."""
    first = members[0].run
    cfg, language = first.cfg, first.language
    exact = strategy == "loop"

    def losses(used, pass_, out=None):
        if exact:
            return _loop_losses(st, members, used, step, pass_, out)
        return _vmap_losses(st, template, members, used, step, pass_, out)

    full = dict(drawn or {})
    for m in members:  # one draw per seed: forks of one seed train on the same batches
        if m.cfg.seed not in full:
            full[m.cfg.seed] = global_batch(language, m.cfg.seed, step, cfg.batch_size, first.rate, cfg.mask_replace)
    batches = [full[m.cfg.seed] for m in members]
    st.zero_grad()
    if cfg.sam.rho > 0:
        halves = [b.halves() for b in batches]
        losses([h[0] for h in halves], keyed.PASS_ASCENT).sum().backward()
        rho = torch.tensor([m.cfg.sam.rho for m in members], device=first.device)
        stacked.ascend(st, rho, cfg.sam.adaptive, exact)
        st.zero_grad()
        used = [h[1] for h in halves]
    elif cfg.update_half:
        used = [b.halves()[1] for b in batches]
    else:
        used = batches
    out = StepOut(torch.empty(0), [u.n_targets for u in used], [int((u.inputs != language.pad_id).sum()) for u in used])
    losses(used, keyed.PASS_UPDATE, out).sum().backward()
    _update(st, members, out, want_norm, exact)
    return out


def _update(st: stacked.Stack, members, out: StepOut, want_norm: bool, exact: bool) -> None:
    """Clipping (or the log step's gradient norms), SAM's return, the optimiser, the schedules."""
    cfg, device = members[0].cfg, members[0].run.device
    clips = [m.cfg.optim.grad_clip for m in members]
    if any(c is not None for c in clips):
        limits = torch.tensor([float("inf") if c is None else c for c in clips], device=device)
        out.grad_norm = stacked.clip(st, limits, exact)
    elif want_norm:
        out.grad_norm = stacked.grad_norms(st, exact=exact)
    if cfg.sam.rho > 0:
        stacked.descend(st)
    groups = [_base(m.run.optimizer).param_groups[0] for m in members]
    lrs, decays = [g["lr"] for g in groups], [g["weight_decay"] for g in groups]
    if cfg.optim.name == "adamw":
        stacked.adamw_step(st, lrs, decays, tuple(cfg.optim.betas), cfg.optim.eps)
    else:
        stacked.sgd_step(st, lrs, decays, cfg.optim.momentum, exact)
    for m in members:
        m.run.schedule.step()


# ---- the log windows -------------------------------------------------------------------------
class StackedWindow:
    """``loop.LogWindow`` of S members (module docstring): device sums ``loss``, ``tokens``,
    ``downstream``, ``flatness`` ``[S]``, ``diverged [S, 2]`` (step and loss of the first
    non-finite loss, NaN while none), the last gradient norms; host counts and start times."""

    def __init__(self, n: int, device):
        f64 = dict(dtype=torch.float64, device=device)
        self.loss, self.downstream, self.flatness = (torch.zeros(n, **f64) for _ in range(3))
        self.diverged = torch.full((n, 2), float("nan"), **f64)
        self.grad_norm: torch.Tensor | None = None
        self.tokens, self.targets, self.steps = [0] * n, [0] * n, [0] * n
        self.started = [0.0] * n
        self.has_norm = [False] * n
        self._host: dict | None = None  # the sums read back once (``read``), until the next change

    @classmethod
    def of(cls, windows: list[LogWindow], device) -> StackedWindow:
        out = cls(len(windows), device)
        for i, w in enumerate(windows):
            out.put(i, w)
        return out

    def read(self) -> dict:
        """The device sums on the host, read once (one wait for the device per check)."""
        if self._host is None:
            names = ("loss", "downstream", "flatness", "diverged")
            values = [getattr(self, k) for k in names]
            if self.grad_norm is not None:
                names, values = (*names, "grad_norm"), [*values, self.grad_norm.double()]
            self._host = dict(zip(names, (v.cpu() for v in values)))
        return self._host

    def put(self, i: int, w: LogWindow) -> None:
        """Member ``i``'s window set to ``w``'s sums."""
        self._host = None
        self.loss[i] = float(w.loss)
        self.downstream[i] = float(w.downstream)
        self.flatness[i] = float(w.flatness)
        self.diverged[i] = w.diverged.to(self.diverged) if w.diverged is not None else float("nan")
        self.tokens[i], self.targets[i], self.steps[i], self.started[i] = int(w.tokens), w.targets, w.steps, w.started
        self.has_norm[i] = w.grad_norm is not None
        if w.grad_norm is not None:
            if self.grad_norm is None:
                self.grad_norm = torch.full_like(self.loss, float("nan"))
            self.grad_norm[i] = w.grad_norm.to(self.grad_norm)

    def take(self, i: int) -> LogWindow:
        """Member ``i``'s window as a ``LogWindow`` (host values; the sums exact in float64)."""
        host = self.read()
        div = host["diverged"][i]
        w = LogWindow(self.tokens[i], float(host["loss"][i]), self.targets[i], float(host["downstream"][i]),
                      self.steps[i], self.started[i], None if div[0].isnan() else div,
                      flatness=float(host["flatness"][i]))
        if self.has_norm[i] and "grad_norm" in host:
            w.grad_norm = host["grad_norm"][i].to(self.grad_norm.dtype)
        return w

    def add(self, out: StepOut, step: int) -> None:
        self._host = None
        summed = out.summed.detach().double()
        self.loss += summed
        for i, (k, n) in enumerate(zip(out.tokens, out.n_targets)):
            self.tokens[i] += k
            self.targets[i] += n
            self.steps[i] += 1
        if out.downstream is not None:
            self.downstream += out.downstream.detach().double()
        if out.flatness is not None:
            self.flatness += out.flatness.detach().double()
        if out.grad_norm is not None:
            self.grad_norm = out.grad_norm.detach()
            self.has_norm = [True] * len(self.has_norm)
        first = torch.isnan(self.diverged[:, 0]) & ~torch.isfinite(summed)
        here = torch.stack([torch.full_like(summed, step), summed], dim=1)
        self.diverged = torch.where(first[:, None], here, self.diverged)

    def diverged_members(self) -> list[tuple[int, torch.Tensor]]:
        """``(i, [step, loss])`` of every member whose loss was not finite (one read)."""
        div = self.read()["diverged"]
        return [(i, div[i]) for i in range(div.shape[0]) if not torch.isnan(div[i, 0])]
