"""Benchmark: the measuring stage of an isoloss checkpoint, the old path against the new one
(issue 45 item 1), in one run on the same checkpoints, with the equality checks.

What a measured checkpoint of the ``quick`` isoloss study costs (``study._probe_spec``):

* ``features``: ``model.features`` of the design's pool and test sentences (the same in
  both paths);
* few-shot heads per endpoint (``pos lbfgs``, ``pos adamw``, ``all adamw``): old — one
  ``heads.fit_linear_heads`` per size (torch's L-BFGS / AdamW) and an einsum over the test
  set, the code before issue 45, copied here; new — ``fewshot.fewshot_probes``: every
  size's heads as one batched problem (Newton / the hand-written AdamW); and
  ``fewshot_probes_many`` over all the checkpoints at once (a fork's probed checkpoints);
* the Fisher trace (the design's contexts, labels and repeats): old — the ``vmap`` path
  (``FisherContexts(hooks=False)``), new — per-example norms from hooks (``hooks=True``);
* the flatness penalty's differentiable Fisher terms on its slice (issue 45 item 2's
  input): ``training.flatness.fisher_terms`` (vmap) against ``models.gradnorms.fisher_squares
  (create_graph=True)``, forward and backward;
* the rescaling guards (issue 58 item 3) beside the Fisher trace, on the same contexts and
  labels: ``curvature.adaptive_trace`` (``tr(T F T)``, its batched path: the Fisher trace's
  hooked passes, per-example linear-layer gradients formed) and ``weight_norms``, their CPU
  seconds over the Fisher trace's (hooks, the study's path; and the vmap path), with the
  labels drawn checked equal (gradient counts).

Checkpoints: ``--run CHECKPOINT ...`` (checkpoint folders), else the quick design's model
trained ``--steps`` steps from its seed, snapshotted at ``--checkpoints`` points evenly
spread (a fork's probed checkpoints). CPU seconds (``time.process_time``) per part, each
part run once per checkpoint (``--threads`` torch threads); the ratio is old / new. Checks:
per subset, the accuracy difference in test examples (adamw: equal but near ties; lbfgs:
the old L-BFGS stopped short of the optimum Newton reaches), ``fewshot_probes_many`` equal
to one call per checkpoint, the traces' relative difference (≤ 1e-6), the labels drawn
(gradient counts) equal. The load average is printed: on a shared machine absolute times
move with it, ratios taken in one run much less.

    python bench/bench_measures.py [--steps 300] [--checkpoints 3] [--threads 1] [--run DIR ...]
                                   [--traces-only]

``--traces-only``: the Fisher trace (both paths), the adaptive trace and the weight norms
only (no few-shot heads, no penalty terms).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from sameloss.experiments.recipes.isoloss import PRESETS
from sameloss.experiments.recipes.isoloss.study import _probe_spec, base_run
from sameloss.measures import fewshot
from sameloss.measures.builtin.fewshot import fewshot_data
from sameloss.measures.builtin.rescaling import weight_norms
from sameloss.measures.curvature import FisherContexts, adaptive_trace, trace_fisher
from sameloss.measures.curvature.base import composite_layer_norms, measuring
from sameloss.measures.heads import HeadTraining, fit_linear_heads
from sameloss.measures.representations import model_representation
from sameloss.models import gradnorms
from sameloss.training import loop, runio
from sameloss.training.flatness import fisher_terms
from sameloss.training.optim import build_optimizer


def trained_checkpoints(cfg, steps: int, count: int) -> tuple[list[torch.nn.Module], object]:
    """The design's model trained ``steps`` steps, copies at ``count`` evenly spread steps."""
    language = runio.build_language(cfg)
    torch.manual_seed(cfg.seed)
    model = runio.init_model(cfg, language, "cpu")
    optimizer, schedule = build_optimizer(cfg, model)
    with tempfile.TemporaryDirectory() as tmp:
        run = loop.Run(cfg, Path(tmp), language, model, model, optimizer, schedule, None, None, torch.device("cpu"),
                       0, 1, loop.LogWindow())
        marks = {round(steps * (i + 1) / count) for i in range(count)}
        out = []
        for step in range(1, steps + 1):
            loop._step(run, step)
            if step in marks:
                out.append(copy.deepcopy(model).eval())
    return out, language


def old_fewshot_probes(pool_h, test_h, pool_y, test_y, n_classes, design) -> dict:
    """``fewshot.fewshot_probes`` as it was before issue 45: one ``fit_linear_heads`` per
    size (L-BFGS to ``tol`` 1e-6 / torch's AdamW), accuracies by an einsum."""
    out: dict = {}
    views = {name: (view(pool_h), view(test_h)) for name, view in design.views}
    for view, method in design.endpoints:
        xp, xt = views[view]
        for n, k in zip(design.sizes, design.subsets):
            dtype = torch.float64 if method == "lbfgs" else torch.float32
            subsets = fewshot.subset_indices(design.pool, n, k, design.seed)
            x, mu, sd = fewshot._standardised(xp.to(dtype)[subsets])
            how = HeadTraining(method, epochs=design.epochs if method == "adamw" else 100,
                               l2=design.l2 if method == "lbfgs" else 1e-3, tolerance_grad=1e-6,
                               tolerance_change=1e-14)
            fit = fit_linear_heads(x, pool_y[subsets], n_classes, how, seed=0)
            Wf, bf = fit.W / sd, fit.b - (fit.W * (mu / sd)).sum(dim=2)
            logits = torch.einsum("md,kcd->kmc", xt.to(dtype), Wf) + bf[:, None, :]
            acc = (logits.argmax(dim=2) == test_y[None]).double().mean(dim=1).tolist()
            key = f"{view}_{method}_n{n}"
            out[key] = float(np.mean(acc))
            out[f"{key}_subsets"] = acc
            if method == "lbfgs":
                out[f"{key}_grad"] = float(fit.grad_norm.max())
    return out


def cpu(fn):
    t = time.process_time()
    value = fn()
    return value, time.process_time() - t


def penalty_terms(model, language, sentences: int = 32, labels: int = 2) -> dict[str, float]:
    """CPU seconds of the penalty's differentiable Fisher terms (squares and log-probs of
    ``labels`` labels per masked position of ``sentences`` sentences, then the backward of
    their sum), the vmap path against the hooks; their values' and gradients' largest
    relative difference."""
    from sameloss.measures.curvature.base import loss_batch

    batch = loss_batch(language, sentences, 0.15, seed=1)
    rows, positions = batch.masked.nonzero(as_tuple=True)
    tokens = batch.inputs.index_select(0, rows)
    lab = torch.randint(0, language.vocab_size, (len(rows), labels), generator=torch.Generator().manual_seed(2))
    params = list(model.parameters())
    out, grads = {}, {}
    with measuring(model), composite_layer_norms(model):
        for name, fn in (("vmap", lambda: fisher_terms(model, tokens, positions, lab)),
                         ("hooks", lambda: gradnorms.fisher_squares(model, tokens, positions, lab, create_graph=True))):
            fn()  # warm-up (torch.func set-up)

            def run(fn=fn):
                sq, lp = fn()
                return sq.detach(), torch.autograd.grad(sq.sum() + lp.sum(), params)
            (value, grads[name]), out[name] = cpu(run)
            out[f"{name}_value"] = value
    out["value_rel"] = float(((out["hooks_value"] - out["vmap_value"]).abs() / out["vmap_value"].abs()).max())
    out["grad_rel"] = max(float((a - b).abs().max() / b.abs().max().clamp_min(1e-30))
                          for a, b in zip(grads["hooks"], grads["vmap"]))
    return out


def trace_parts(model, language, spec, add) -> tuple[tuple, dict]:
    """The Fisher trace by the vmap path (old) and the hooks (new), the adaptive trace and the
    weight norms on one checkpoint at the design's contexts, labels and repeats: CPU seconds
    to ``add``, the traces' check and the guards' values."""
    contexts = FisherContexts(n_contexts=spec.n_contexts, seed=spec.seed)
    kw = dict(n_labels=spec.n_labels, repeats=spec.repeats)
    old_tr, t_old = cpu(lambda: trace_fisher(model, language, dataclasses.replace(contexts, hooks=False), **kw))
    new_tr, t_new = cpu(lambda: trace_fisher(model, language, contexts, **kw))
    adaptive, t_adaptive = cpu(lambda: adaptive_trace(model, language, contexts, **kw))
    norms, t_norms = cpu(lambda: weight_norms(model))
    add("trace (old)", t_old)
    add("trace (new)", t_new)
    add("adaptive trace", t_adaptive)
    add("weight norms", t_norms)
    check = ("trace", abs(new_tr.estimate / old_tr.estimate - 1), old_tr.extra["n_gradients"] ==
             new_tr.extra["n_gradients"], new_tr.settings["hooks"])
    guards = {"trace_fisher": new_tr.estimate, "adaptive_trace": adaptive.estimate,
              "adaptive_trace_se": adaptive.stderr, "weight_norm_sq": norms["weight_norm_sq"],
              "same_labels": adaptive.extra["n_gradients"] == new_tr.extra["n_gradients"]}
    return check, guards


def report_guards(times, guards: list[dict], spec) -> None:
    """The adaptive trace's and the weight norms' cost over the Fisher trace's."""
    fisher, vmap = float(np.mean(times["trace (new)"])), float(np.mean(times["trace (old)"]))
    adaptive, norms = float(np.mean(times["adaptive trace"])), float(np.mean(times["weight norms"]))
    print(f"rescaling guards ({spec.n_contexts} contexts x {spec.repeats} repeats, {spec.n_labels} labels drawn; "
          f"CPU-s per checkpoint, mean):")
    print(f"  Fisher trace {fisher:.3f} (hooks; vmap path {vmap:.3f}), adaptive trace {adaptive:.3f}: "
          f"{adaptive / fisher:.2f}x the Fisher trace ({adaptive / vmap:.2f}x its vmap path); "
          f"weight norms {norms * 1e3:.2f} ms")
    for i, g in enumerate(guards):
        print(f"  checkpoint {i}: trace_fisher {g['trace_fisher']:.4g}, adaptive_trace {g['adaptive_trace']:.4g} "
              f"± {g['adaptive_trace_se']:.2g}, weight_norm_sq {g['weight_norm_sq']:.4g}, "
              f"same labels as the Fisher trace: {g['same_labels']}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--steps", type=int, default=300, help="training steps of the benchmark's model")
    ap.add_argument("--checkpoints", type=int, default=3)
    ap.add_argument("--threads", type=int, default=1)
    ap.add_argument("--run", nargs="*", default=[], help="checkpoint folders instead of training")
    ap.add_argument("--traces-only", action="store_true",
                    help="only the Fisher trace, the adaptive trace and the weight norms")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    p = PRESETS["quick"]
    cfg = dataclasses.replace(base_run(p, 0).config(), device="cpu")
    if args.run:
        loaded = [runio.load_checkpoint(r) for r in args.run]
        models, language, cfg = [m.model for m in loaded], loaded[0].language, loaded[0].cfg
    else:
        models, language = trained_checkpoints(cfg, args.steps, args.checkpoints)
    spec = _probe_spec(p, 0)
    design = spec.fewshot
    times: dict[str, list[float]] = {}

    def add(part, seconds):
        times.setdefault(part, []).append(seconds)

    if args.traces_only:
        load = " ".join(f"{x:.2f}" for x in os.getloadavg())
        checks, guards = zip(*(trace_parts(model, language, spec, add) for model in models))
        print(f"quick isoloss design, {len(models)} checkpoint(s), {torch.get_num_threads()} thread(s), load average "
              f"{load} before, {' '.join(f'{x:.2f}' for x in os.getloadavg())} after")
        report_guards(times, list(guards), spec)
        worst = max(c[1] for c in checks)
        print(f"  Fisher trace, hooks against vmap: relative difference at most {worst:.1e}, same labels "
              f"{all(c[2] for c in checks)}")
        return
    data = fewshot_data({}, language, cfg, design)
    reps, checks, guards = [], [], []
    for model in models:
        (pool_h, test_h), t = cpu(lambda: (model_representation(model, data.train.tokens),
                                           model_representation(model, data.test.tokens)))
        add("features", t)
        reps.append((pool_h, test_h))
        new_row: dict = {}
        for endpoint in design.endpoints:
            one = dataclasses.replace(design, endpoints=(endpoint,))
            old, t_old = cpu(lambda: old_fewshot_probes(pool_h, test_h, data.train.labels, data.test.labels,
                                                        data.n_classes, one))
            new, t_new = cpu(lambda: fewshot.fewshot_probes(pool_h, test_h, data.train.labels, data.test.labels,
                                                            data.n_classes, one))
            add(f"{endpoint[0]} {endpoint[1]} (old)", t_old)
            add(f"{endpoint[0]} {endpoint[1]} (new)", t_new)
            new_row.update(new)
            for n in design.sizes:
                key = f"{endpoint[0]}_{endpoint[1]}_n{n}"
                diff = np.abs(np.array(old[f"{key}_subsets"]) - np.array(new[f"{key}_subsets"])) * design.test
                checks.append((key, int((diff > 0.5).sum()), len(diff), float(diff.max()),
                               old.get(f"{key}_grad"), new.get(f"{key}_grad"), abs(old[key] - new[key])))
        check, guard = trace_parts(model, language, spec, add)
        checks.append(check)
        guards.append(guard)
        reps[-1] = (pool_h, test_h, new_row)
    many, t_many = cpu(lambda: fewshot.fewshot_probes_many([(a, b) for a, b, _ in reps], data.train.labels,
                                                           data.test.labels, data.n_classes, design))
    many_equal = all(m == row for m, (_, _, row) in zip(many, reps))
    penalty = penalty_terms(models[-1], language)
    report(times, checks, len(models), t_many, many_equal, penalty, args)
    report_guards(times, guards, spec)


def report(times, checks, count, t_many, many_equal, penalty, args) -> None:
    load = " ".join(f"{x:.2f}" for x in os.getloadavg())
    print(f"quick isoloss design, {count} checkpoint(s), {torch.get_num_threads()} thread(s), load average {load}")
    print(f"{'part (CPU-s per checkpoint, mean)':40s} {'old':>8s} {'new':>8s} {'old/new':>8s}")
    old_total = new_total = 0.0
    parts = [k[:-6] for k in times if k.endswith("(old)")]
    f = float(np.mean(times["features"]))
    print(f"{'features (the same in both)':40s} {f:8.3f} {f:8.3f} {1.0:8.2f}")
    for part in parts:
        o, n = float(np.mean(times[f"{part} (old)"])), float(np.mean(times[f"{part} (new)"]))
        old_total, new_total = old_total + o, new_total + n
        print(f"{part:40s} {o:8.3f} {n:8.3f} {o / n:8.2f}")
    heads_one = sum(float(np.mean(times[f"{p} (new)"])) for p in parts if p != "trace")
    print(f"{'heads, all checkpoints at once (/ckpt)':40s} {'':8s} {t_many / count:8.3f} "
          f"{'':8s} (one at a time {heads_one:.3f}; equal: {many_equal})")
    new_many = new_total - heads_one + t_many / count
    print(f"{'measuring stage (features+heads+trace)':40s} {old_total + f:8.3f} {new_total + f:8.3f} "
          f"{(old_total + f) / (new_total + f):8.2f}   (heads batched over checkpoints: {new_many + f:.3f}, "
          f"{(old_total + f) / (new_many + f):.2f}x)")
    print(f"{'  without the features':40s} {old_total:8.3f} {new_many:8.3f} {old_total / new_many:8.2f}")
    print(f"penalty's Fisher terms (32 sentences, 2 labels, forward + double backward): vmap {penalty['vmap']:.3f} s,"
          f" hooks {penalty['hooks']:.3f} s ({penalty['vmap'] / penalty['hooks']:.2f}x); values within "
          f"{penalty['value_rel']:.1e}, gradients within {penalty['grad_rel']:.1e} relative")
    print("checks:")
    for c in checks:
        if c[0] == "trace":
            print(f"  trace: relative difference {c[1]:.1e}, same labels {c[2]}, hook path {c[3]}")
        else:
            key, changed, total, worst, g_old, g_new, mean = c
            grads = f", gradient norm left old {g_old:.1e} new {g_new:.1e}" if g_old is not None else ""
            print(f"  {key}: {changed}/{total} subsets' accuracies differ, by at most {worst:.0f} test examples "
                  f"(mean accuracy by {mean:.1e}){grads}")


if __name__ == "__main__":
    main()
