"""The flatness penalty: its gradient against finite differences in float64,
the sampled Fisher surrogate's unbiasedness (averaged over every possible draw exactly),
agreement with the study's measure, and the loop's guarantees with it on (resume, DDP,
bf16, config errors)."""

from __future__ import annotations

import dataclasses
import json

import pytest
import torch
import torch.multiprocessing as mp

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.languages import make_language
from sameloss.measures.curvature import FisherContexts, LossHessian, trace_fisher
from sameloss.models import build_model
from sameloss.training import PretrainConfig, pretrain
from sameloss.training.config import FlatnessConfig
from sameloss.training.data import global_batch, mask_batch, step_generator
from sameloss.training.objectives.flatness import (FlatnessPenalty, fisher_surrogate, fisher_terms, sample_labels,
                                        signed_fisher, signed_gradient)
from sameloss.training.runio import build_language
from training.test_pretrain import _ddp_worker, _free_port, small_config, weights, weights_at_init


@pytest.fixture(scope="module")
def micro():
    """A float64 micro transformer on the micro HMM (11 outputs) and a batch of 4 sentences
    (7 masked positions)."""
    language = make_language("hmm", "micro")
    torch.manual_seed(0)
    model = build_model("transformer", "micro", language.vocab_size, language.max_len).double()
    return language, model, global_batch(language, 0, 1, 4, 0.15)


@pytest.fixture(scope="module")
def micro_lstm():
    """The same with the micro bidirectional LSTM (run unrolled while measured)."""
    language = make_language("hmm", "micro")
    torch.manual_seed(0)
    model = build_model("lstm", "micro", language.vocab_size, language.max_len).double()
    return language, model, global_batch(language, 0, 1, 4, 0.15)


def _penalty(model, batch, **settings):
    cfg = FlatnessConfig(weight=1.0, **settings)
    return FlatnessPenalty(cfg, model.config.vocab_size, seed=0).penalty(model, batch, step=3)


def _directional(model, fn, direction, eps):
    """Central finite difference of ``fn()`` along ``direction`` (the model's parameters moved in place)."""
    params = list(model.parameters())
    values = []
    for sign in (1, -1):
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.add_(sign * eps * d)
        values.append(float(fn()))
        with torch.no_grad():
            for p, d in zip(params, direction):
                p.sub_(sign * eps * d)
    return (values[0] - values[1]) / (2 * eps)


def _analytic(model, value, direction):
    grads = torch.autograd.grad(value, list(model.parameters()), retain_graph=True)
    return float(sum((g * d).sum() for g, d in zip(grads, direction)))


EXACT = {"measure": "fisher", "estimator": "per-example", "labels": 0}
SAMPLED = {"measure": "fisher", "estimator": "per-example", "labels": 2}
SIGNS = {"measure": "fisher", "estimator": "signs"}


@pytest.mark.parametrize("kind, settings", [
    ("micro", EXACT), ("micro", {"measure": "hutchinson", "probes": 2}),
    ("micro_lstm", EXACT), ("micro_lstm", {"measure": "hutchinson", "probes": 2}),
    # the trace of the encoder's blocks alone, differentiated in every parameter
    ("micro", {**EXACT, "params": "blocks"}),
    ("micro", {"measure": "hutchinson", "probes": 2, "params": "blocks"}),
    # the signs estimator: the step's signs fixed, a deterministic function of θ too
    ("micro", SIGNS), ("micro_lstm", SIGNS), ("micro", {**SIGNS, "params": "blocks"}),
], ids=["transformer-fisher-exact", "transformer-hutchinson", "lstm-fisher-exact", "lstm-hutchinson",
        "transformer-fisher-blocks", "transformer-hutchinson-blocks", "transformer-signs", "lstm-signs",
        "transformer-signs-blocks"])
def test_the_penalty_gradient_is_the_finite_difference_gradient_of_its_estimate(request, kind, settings):
    """Fisher with every label (the trace itself, through the label weights f_θ(y) too) and
    Hutchinson with the step's fixed probes: the estimate is a deterministic function of
    θ, and autograd's gradient of the penalty (a third derivative of the loss, through
    torch.func transforms) is its derivative. Measured when written (float64, this
    direction): fisher −590.943392659 by autograd, −590.943387653 by differences at
    ε = 1e-6 (relative 8.5e-9; 8.5e-7 at ε = 1e-5, 8.5e-5 at 1e-4: the differences' own
    O(ε²) error); Hutchinson 3489.347225432 against 3489.347200116 (7.3e-9). With the fused
    LayerNorm kernel instead of ``composite_layer_norms`` autograd said −590.8079 and
    −518.6 (a torch.func bug, see there). The LSTM (no LayerNorm): 3.5e-10 and 2.0e-11."""
    _, model, batch = request.getfixturevalue(kind)
    gen = torch.Generator().manual_seed(1)
    direction = [torch.randn(p.shape, generator=gen, dtype=p.dtype) for p in model.parameters()]
    penalty, estimate = _penalty(model, batch, **settings)
    # (Hutchinson's vᵀHv of one block can be negative: the Hessian is not positive semi-definite)
    assert float(penalty.detach()) == pytest.approx(float(estimate), rel=1e-12) and float(estimate) != 0
    analytic = _analytic(model, penalty, direction)
    if "params" in settings:  # the parameters outside the regex get the penalty's gradient too
        grads = torch.autograd.grad(penalty, list(model.parameters()), allow_unused=True)
        outside = [g for (name, _), g in zip(model.named_parameters(), grads) if "blocks" not in name]
        assert any(g is not None and float(g.abs().max()) > 0 for g in outside)
    numeric = _directional(model, lambda: _penalty(model, batch, **settings)[1], direction, 1e-6)
    assert abs(analytic) > 1e-3 * abs(float(estimate))  # a direction the estimate changes along
    assert analytic == pytest.approx(numeric, rel=2e-7), (analytic, numeric)


def test_the_exact_fisher_penalty_is_the_measured_trace_on_the_same_contexts(micro):
    """The penalty's estimate is the study's measure (``trace_fisher``, App. B.1) on the
    same contexts: one masked position per sentence, every label."""
    language, model, _ = micro
    sample = language.sample(6, torch.Generator().manual_seed(2))
    contexts = mask_batch(language, sample.tokens, sample.lengths, None, torch.Generator().manual_seed(3))
    _, estimate = _penalty(model, contexts, **EXACT)
    measured = trace_fisher(model, language, FisherContexts(batch=contexts), n_labels=None)
    assert float(estimate) == pytest.approx(measured.estimate, rel=1e-10)


def test_the_hutchinson_penalty_is_v_h_v_of_the_measures_loss_hessian(micro):
    _, model, batch = micro
    _, estimate = _penalty(model, batch, measure="hutchinson", probes=3)
    from sameloss.measures.curvature.estimators import probe_vectors
    n_params = sum(p.numel() for p in model.parameters())
    probes = probe_vectors(3, n_params, "rademacher", step_generator(0, 3, stream=5), torch.float64)
    hv = LossHessian(model, batch).matmat(probes)
    assert float(estimate) == pytest.approx(float((probes * hv).sum(dim=1).mean()), rel=1e-10)


@pytest.mark.parametrize("k", [1, 2])
def test_the_sampled_fisher_gradient_is_unbiased_averaged_over_every_draw(micro, k):
    """Labels drawn from the model: averaged over every possible draw (all V^k label
    tuples of two contexts, weighted by their probability under the model), the
    surrogate's value is the exact trace and its gradient the exact trace's gradient
    (itself checked against finite differences above). Holding the labels fixed instead —
    dropping the score-function term — is biased: its average misses by far more."""
    _, model, batch = micro
    rows, positions = batch.masked.nonzero(as_tuple=True)
    tokens, positions = batch.inputs[rows[:2]], positions[:2]
    V = model.config.vocab_size
    tuples = torch.cartesian_prod(*[torch.arange(V)] * k).reshape(-1, k)  # [V^k, k]
    params = list(model.parameters())
    with FlatnessPenalty.context(model, torch.device("cpu")):
        exact_sq, exact_lp = fisher_terms(model, tokens, positions, torch.arange(V).expand(2, V))
        exact = fisher_surrogate(exact_sq, exact_lp, exact=True).sum()
        sq, lp = fisher_terms(model, tokens.repeat_interleave(len(tuples), 0),
                              positions.repeat_interleave(len(tuples)), tuples.repeat(2, 1))
    prob = exact_lp.detach().exp()  # [2, V]: the model's distribution at each context
    weight = prob.repeat_interleave(len(tuples), 0).gather(1, tuples.repeat(2, 1)).prod(dim=1)  # P(tuple)
    averaged = (weight * fisher_surrogate(sq, lp, exact=False)).sum()
    fixed_labels = (weight * sq.mean(dim=1)).sum()
    assert float(weight.sum()) == pytest.approx(2.0, rel=1e-12)
    assert float(averaged.detach()) == pytest.approx(float(exact.detach()), rel=1e-10)
    direction = [torch.randn(p.shape, generator=torch.Generator().manual_seed(4), dtype=p.dtype) for p in params]
    want = _analytic(model, exact, direction)
    got = _analytic(model, averaged, direction)
    biased = _analytic(model, fixed_labels, direction)
    assert got == pytest.approx(want, rel=1e-9), (got, want)
    assert abs(biased - want) > 1e-3 * abs(want), (biased, want)


def _hadamard(n: int) -> torch.Tensor:
    """Sylvester's ``n × n`` Hadamard matrix (``n`` a power of 2): ±1 entries, orthogonal columns."""
    h = torch.ones(1, 1, dtype=torch.float64)
    while h.shape[0] < n:
        h = torch.cat([torch.cat([h, h], 1), torch.cat([h, -h], 1)], 0)
    return h


def test_the_signs_estimate_and_its_gradient_are_unbiased_averaged_over_a_hadamard_design(micro):
    """The signs estimator (``signed_fisher``), averaged over the rows of a Hadamard matrix
    — sign vectors whose second moment is exactly the identity, as the expectation over
    independent signs is — equals the exact Fisher trace of the slice (every label,
    per-example: the estimator checked against the measure and finite differences above),
    and so does its gradient. One sign vector alone does not."""
    _, model, batch = micro
    n_contexts, V = int(batch.masked.sum()), model.config.vocab_size
    design = _hadamard(1 << (n_contexts * V - 1).bit_length())[:, :n_contexts * V]  # 128 rows × 77
    params = list(model.parameters())
    exact, exact_estimate = _penalty(model, batch, **EXACT)  # mean over the slice's targets
    direction = [torch.randn(p.shape, generator=torch.Generator().manual_seed(4), dtype=p.dtype) for p in params]
    want = _analytic(model, exact, direction)
    values, slopes = [], []
    with FlatnessPenalty.context(model, torch.device("cpu"), composite=False):
        for row in design:
            value = signed_fisher(model, batch, row.reshape(n_contexts, V)) / n_contexts
            values.append(float(value.detach()))
            slopes.append(_analytic(model, value, direction))
    assert sum(values) / len(values) == pytest.approx(float(exact_estimate), rel=1e-10)
    assert sum(slopes) / len(slopes) == pytest.approx(want, rel=1e-9)
    assert abs(values[1] - float(exact_estimate)) > 1e-3 * float(exact_estimate)  # one draw is noisy


def test_labels_are_drawn_from_the_given_distribution():
    probs = torch.tensor([[0.5, 0.0, 0.2, 0.3, 0.0]])
    u = torch.rand(1, 40_000, generator=torch.Generator().manual_seed(0), dtype=torch.float64)
    labels = sample_labels(probs, u)[0]
    counts = torch.bincount(labels, minlength=5).double() / labels.numel()
    assert counts[1] == 0 and counts[4] == 0  # probability 0: never
    se = (probs[0] * (1 - probs[0]) / labels.numel()).sqrt()
    assert ((counts - probs[0]).abs() <= 4 * se + 1e-12).all(), counts
    assert sample_labels(probs, torch.zeros(1, 1, dtype=torch.float64)).item() == 0
    assert sample_labels(probs, torch.full((1, 1), 1 - 2**-53, dtype=torch.float64)).item() == 3


def test_the_penalty_is_float32_under_bf16_autocast():
    language = make_language("hmm", "micro")
    torch.manual_seed(0)
    model = build_model("transformer", "micro", language.vocab_size, language.max_len)
    batch = global_batch(language, 0, 1, 16, 0.15)
    for settings in (SAMPLED, SIGNS, {"measure": "hutchinson"}):
        plain = _penalty(model, batch, **settings)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            under = _penalty(model, batch, **settings)
        assert under[0].dtype == torch.float32 and torch.equal(plain[1], under[1]), settings


# ---- the loop ------------------------------------------------------------------------------------
def test_a_penalised_run_resumes_bit_identically(tmp_path):
    cfg = small_config(**{"flatness.weight": 0.05})  # dropout on: the RNG state is restored too
    pretrain(cfg, tmp_path / "whole", progress=False)
    pretrain(cfg, tmp_path / "split", progress=False, stop_after=5)
    pretrain(cfg, tmp_path / "split", progress=False, resume=True)
    a, b = weights(tmp_path / "whole"), weights(tmp_path / "split")
    for k in a:
        assert torch.equal(a[k], b[k]), k
    whole = [json.loads(x) for x in (tmp_path / "whole" / "metrics.jsonl").read_text().splitlines()]
    split = [json.loads(x) for x in (tmp_path / "split" / "metrics.jsonl").read_text().splitlines()]
    assert [r.get("flatness_trace") for r in whole] == [r.get("flatness_trace") for r in split]
    assert all(r["flatness_trace"] > 0 for r in whole if "train_loss" in r)
    # the penalty changed the trajectory
    pretrain(small_config(), tmp_path / "plain", progress=False)
    c = weights(tmp_path / "plain")
    assert any(not torch.equal(a[k], c[k]) for k in a)


class _SummedElsewhere(FlatnessPenalty):
    """A process of a simulated group: ``reduce`` gives the sum of every process's ``G``,
    computed beforehand from the whole slice with the same signs (what ``all_reduce`` returns)."""

    total: torch.Tensor

    def reduce(self, total):
        total.copy_(self.total)


@pytest.mark.parametrize("settings", [SAMPLED, EXACT, SIGNS, {"measure": "hutchinson", "probes": 2}],
                         ids=["fisher-sampled", "fisher-exact", "fisher-signs", "hutchinson"])
def test_the_processes_parts_add_up_to_the_single_process_penalty(micro, settings):
    """Under DDP each process computes its rows' part of the slice and DDP averages the
    gradients: the parts, divided by the world size, must sum to the single-process
    penalty and gradient — with sampled labels and signs too (the draws are the whole
    slice's, each process keeping its rows'; the signs' ``G`` summed over the processes
    before the square). The slice of 4 sentences over 3 processes: 2, 1 and 1."""
    _, model, batch = micro
    cfg = FlatnessConfig(weight=0.5, **settings)
    params = list(model.parameters())
    whole, whole_estimate = FlatnessPenalty(cfg, 11, seed=0).penalty(model, batch, step=3)
    want = torch.autograd.grad(whole, params)
    penalty = _SummedElsewhere if settings is SIGNS else FlatnessPenalty
    if settings is SIGNS:
        signs = torch.randint(0, 2, (*batch.inputs.shape, 11), generator=step_generator(0, 3, stream=5)) * 2.0 - 1.0
        with FlatnessPenalty.context(model, torch.device("cpu"), composite=False):
            grads = signed_gradient(model, batch, signs[batch.masked])
        _SummedElsewhere.total = torch.cat([g.detach().reshape(-1) for g in grads])
    parts = [penalty(cfg, 11, seed=0, rank=r, world_size=3).penalty(model, batch, step=3) for r in range(3)]
    total = sum(p for p, _ in parts) / 3
    got = torch.autograd.grad(total, params)
    assert float(total.detach()) == pytest.approx(float(whole.detach()), rel=1e-12)
    assert float(sum(e for _, e in parts) / 3) == pytest.approx(float(whole_estimate), rel=1e-12)
    for g, w in zip(got, want):
        assert torch.allclose(g, w, rtol=1e-10, atol=1e-12)


def test_a_two_process_penalised_run_matches_single_process(tmp_path):
    """The real thing, as ``test_two_process_gloo_run_matches_single_process`` (SGD: only
    float round-off separates the runs): labels drawn from the model, 7 sentences in the
    slice (the processes take 4 and 3)."""
    atol = 1e-6
    settings = {"model.dropout": 0.0, "batch_size": 30, "optim.name": "sgd", "optim.lr": 0.1,
                "flatness.weight": 0.05, "flatness.sentences": 7}
    cfg = small_config(steps=6, **settings)
    pretrain(cfg, tmp_path / "single", progress=False)
    mp.start_processes(_ddp_worker, args=(2, _free_port(), cfg, tmp_path / "ddp"), nprocs=2, start_method="spawn")
    a, b = weights(tmp_path / "single"), weights(tmp_path / "ddp")
    pretrain(small_config(steps=6, **{**settings, "flatness.weight": 0.0}), tmp_path / "plain", progress=False)
    c = weights(tmp_path / "plain")
    assert max(float((a[k] - c[k]).abs().max()) for k in a) > 10 * atol  # the penalty moved the weights
    assert max(float((a[k] - weights_at_init(cfg)[k]).abs().max()) for k in a) > 10 * atol
    for k in a:
        assert torch.allclose(a[k], b[k], atol=atol, rtol=0), (k, (a[k] - b[k]).abs().max())


def test_the_penalty_takes_its_slice_from_the_batch_the_update_uses(tmp_path, monkeypatch):
    """The penalty gets the step's batch that the update uses — its second half under
    ``update_half`` — and the step's number (its slice and draws are taken from them)."""
    seen = []
    real = FlatnessPenalty.penalty

    def recording(self, model, batch, step):
        seen.append((step, batch.inputs.clone()))
        return real(self, model, batch, step)

    monkeypatch.setattr(FlatnessPenalty, "penalty", recording)
    cfg = small_config(steps=2, **{"flatness.weight": 0.1, "flatness.sentences": 5})
    for half in (False, True):
        seen.clear()
        pretrain(dataclasses.replace(cfg, update_half=half, name=f"half{half}"), tmp_path / f"h{half}",
                 progress=False)
        assert [s for s, _ in seen] == [1, 2]
        for step, inputs in seen:
            full = global_batch(build_language(cfg), cfg.seed, step, cfg.batch_size, cfg.mask_rate).inputs
            assert torch.equal(inputs, full[16:] if half else full)


def test_flatness_settings_are_checked_in_one_line():
    with pytest.raises(UserError, match="flatness.weight and sam.rho cannot be combined"):
        small_config(**{"flatness.weight": 0.1, "sam.rho": 0.05})
    with pytest.raises(UserError, match="flatness.labels must be >= 0"):
        small_config(**{"flatness.labels": -1})
    with pytest.raises(UserError, match="flatness.sentences must be >= 1"):
        small_config(**{"flatness.sentences": 0})
    with pytest.raises(UserError, match="'flatness.measure': 'hessian' is not one of fisher, hutchinson"):
        small_config(**{"flatness.measure": "hessian"})
    with pytest.raises(UserError, match="flatness.weight must be a finite number|expected a finite number"):
        configlib.load(PretrainConfig, None, ["flatness.weight=inf"])
    with pytest.raises(UserError, match="flatness.params is not a valid regex"):
        small_config(**{"flatness.params": '"blocks[("'})


def test_a_regex_matching_no_parameter_is_refused_before_the_run_folder(tmp_path):
    cfg = small_config(**{"flatness.weight": 0.1, "flatness.params": "nothing_is_called_this"})
    with pytest.raises(UserError, match="parameter regex 'nothing_is_called_this' matches no parameter"):
        pretrain(cfg, tmp_path / "r", progress=False)
    assert not (tmp_path / "r").exists()
