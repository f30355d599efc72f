"""Training objectives as registered classes (``training.objectives``): the built-ins in their
order, and an objective registered here — its settings in ``cfg.objectives`` — trained alone
and in both kinds of ensemble with no other edit (docs/how-to/extend.md's example is this
one, run as written by ``tests/test_extend_page.py``)."""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
import torch

from sameloss.errors import UserError
from sameloss.training import config as training_config
from sameloss.training import pretrain
from sameloss.training.checkpoint import complete_checkpoints
from sameloss.training.ensemble import PER_MEMBER, Failure, ensemble_key, train_ensemble
from sameloss.training.objectives import OBJECTIVES, Objective, ordered
from sameloss.training.runio import load_checkpoint, read_metrics

from training.test_ensemble import KL_RTOL, WEIGHT_ATOL, small


@dataclass(frozen=True)
class NormSettings:
    weight: float = 0.0
    matrices: bool = True

    def step_forwards(self, batch_size, vocab):
        return 0.5


class Norm(Objective):
    """λ × the squared norm of the model's matrices (or of every parameter)."""

    name, Settings, order, logs, per_member = "test_norm", NormSettings, 40, "test_norm", ("weight",)

    def loss(self, run, batch, step):
        norm = sum(p.square().sum() for p in run.model.parameters() if p.dim() >= 2 or not self.settings.matrices)
        return self.settings.weight * norm, norm.detach()

    @classmethod
    def losses(cls, objectives, stack, batches, step):
        matrices = objectives[0].settings.matrices  # (shared: not per member)
        norm = sum(p.square().flatten(1).sum(1) for p in stack.params.values() if p.dim() >= 3 or not matrices)
        weights = torch.tensor([o.settings.weight for o in objectives], device=stack.device)
        return weights * norm, norm.detach()


@contextlib.contextmanager
def registered(cls):
    """``cls`` and its settings registered for the ``with`` block only."""
    with OBJECTIVES.added(cls):
        training_config.register_objective(cls.name, cls.Settings)
        try:
            yield cls
        finally:
            training_config.OBJECTIVE_SETTINGS.pop(cls.name)


def weights(run):
    return load_checkpoint(complete_checkpoints(run)[-1]).model.state_dict()


def test_the_built_in_objectives_in_their_order():
    assert [c.name for c in ordered()] == ["mlm", "sam", "adversarial", "flatness"]
    assert {"sam.rho", "adversarial.weight", "flatness.weight"} <= PER_MEMBER


def test_a_registered_objective_trains_alone_and_in_both_kinds_of_ensemble(tmp_path):
    with registered(Norm):
        cfgs = [small(name="a", **{"objectives.test_norm.weight": 0.05}),
                small(name="b", seed=1, **{"objectives.test_norm.weight": 0.5})]
        assert ensemble_key(cfgs[0]) == ensemble_key(cfgs[1]) != ensemble_key(small())
        assert [type(t).__name__ for t in cfgs[0].treatments()][-1] == "NormSettings"  # the planner prices it
        alone = pretrain(cfgs[0], tmp_path / "alone", progress=False)
        plain = pretrain(small(name="a"), tmp_path / "plain", progress=False)
        logged = [r["test_norm"] for r in read_metrics(tmp_path / "alone") if "train_loss" in r]
        assert len(logged) == 4 and all(v > 0 for v in logged)
        assert "test_norm" not in read_metrics(tmp_path / "plain")[0]
        assert any(not torch.equal(x, y) for x, y in zip(weights(tmp_path / "alone").values(),
                                                         weights(tmp_path / "plain").values()))
        for strategy in ("loop", "vmap"):
            got = train_ensemble(cfgs, [tmp_path / strategy / c.name for c in cfgs], progress=False,
                                 strategy=strategy)
            assert not any(isinstance(r, Failure) for r in got), got
            a, b = weights(tmp_path / strategy / "a"), weights(tmp_path / "alone")
            if strategy == "loop":  # member by member: the run alone's computation
                assert got[0] == alone and all(torch.equal(a[k], b[k]) for k in a)
            else:
                assert got[0]["kl"] == pytest.approx(alone["kl"], rel=KL_RTOL)
                assert all(torch.allclose(a[k], b[k], atol=WEIGHT_ATOL, rtol=0) for k in a)
            mean = [r["test_norm"] for r in read_metrics(tmp_path / strategy / "a") if "train_loss" in r]
            assert mean == pytest.approx(logged, rel=0 if strategy == "loop" else 1e-5)


def test_an_objectives_settings_are_checked_in_one_line():
    with pytest.raises(UserError, match="unknown training objective 'test_norm'"):
        small(**{"objectives.test_norm.weight": 0.1})
    with registered(Norm):
        with pytest.raises(UserError, match="unknown config key 'objectives.test_norm.wieght'"):
            small(**{"objectives.test_norm.wieght": 0.1})
        with pytest.raises(UserError, match="'objectives.test_norm.matrices': expected true or false"):
            small(**{"objectives.test_norm.matrices": 3})
        cfg = small(**{"objectives.test_norm.weight": 0.1})
        assert cfg.objectives["test_norm"] == NormSettings(weight=0.1)
