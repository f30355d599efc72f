"""Search layered random PCFGs for a span task with probe headroom (issue 24, item 1).

    python bench/pcfg_headroom_search.py --out runs/pcfg-headroom-search            # screen + train
    python bench/pcfg_headroom_search.py --out DIR --stage screen                   # screen only
    python bench/pcfg_headroom_search.py --out DIR --stage train --only w6-r2-l2-s3-b3-e0.3-lw5-c0.5-g0
    python bench/pcfg_headroom_search.py --out DIR --stage report                   # the tables
    python bench/pcfg_headroom_search.py --out DIR --schedule isoloss --only w6-r2-l2-s4-b3-e0.3-lw5-c0.5-g6

The criteria (issue 24): the ~0.1M ``tiny`` transformer, trained as the isoloss study's
tiny runs are (batch 256, AdamW lr 1e-3, warm-up 200, dropout 0.1, WD 0.01, 15 % masking),
reaches exact KL < 0.01 nats within ``--steps`` (2000) steps (``--schedule isoloss``: within
the study's own AdamW fork — constant lr to step 1100, linear decay over 200 steps to
lr × 0.05, 300 steps there — 1600 steps), and a span task (``span-k``:
the most likely symbol spanning the first k words given the sentence) keeps headroom at
n = 200 few-shot examples: the trained model >= 5 points above both the look-up table and
the random-init encoder, and >= 5 points below the oracle (``measures.headroom``).

Stages, cheapest first (each candidate = ``random_layered`` shape + grammar seed + max_len):

1. *screen* (no training): P(fit), the exact-conditional cost, the entropy, and per span
   task its class count, kept fraction and the headroom rows that need no training —
   majority, random-init encoder (the tiny model's initial weights, seed 0), look-up table,
   oracle — on a smaller design (``--screen-subsets`` 10, ``--screen-test`` 2000). A task is *promising* when the
   oracle is at least ``--min-gap`` points above both look-up and random-init (room for a
   trained model 5 above them and 5 below the oracle).
2. *train* (``--train-top`` best promising candidates by that gap, one at a time, one
   thread): 2000 steps with an exact evaluation every ``--eval-every`` steps (the first
   step with KL < 0.01 is "steps to KL < 0.01"), then the full headroom table of each
   promising task with the step-2000 model, on the full test set (``--test``).
   ``--schedule isoloss``: 1600 steps as above, the model measured at the study's base
   step 1000 (where its headroom gate reads the base) and at the fork's end, step 1600; a
   candidate meets the criteria when KL < 0.01 at some step and the margins hold at both.

``--stage report`` prints search.csv as markdown: per candidate its best screened task, then
every trained row. ``--model-seed N`` trains another model of the same grammar (its own run
folder ``<candidate>-modelN``): the spread of the trained row between model seeds.

The recorded search (2-core CPU shared with other jobs, load 5-12; screening 10-40 s per
grammar, training + measuring 3-8 min each, about 2.5 h in all): the screen of the whole
grid (157 grammars), then, one ``--stage train --only ...`` call per round, chosen from the
screen and the previous rounds (the screen's gap does not predict the KL):
    1. w6-r2-l3-s3-b2-e0.45-lw4-c1-g0-m6 w6-r2-l2-s4-b6-e0.3-lw3-c1-g0 w6-r2-l2-s3-b3-e0.3-lw5-c0.5-g0
    2. w6-r6-l2-s4-b3-e0.3-lw5-c1-g0 w6-r6-l2-s4-b3-e0.1-lw5-c1-g0 w6-r2-l2-s4-b6-e0.1-lw3-c1-g0
       w6-r2-l2-s4-b6-e0.1-lw5-c1-g0
    3. w6-r6-l2-s4-b3-e0.3-lw5-c0.5-g0 w6-r6-l2-s4-b3-e0.3-lw5-c1-g1 w6-r6-l2-s4-b3-e0.3-lw5-c1-g2
       w6-r4-l2-s3-b3-e0.3-lw5-c0.5-g0
    4. w6-r2-l3-s3-b2-e0.3-lw4-c1-g0-m4 w6-r2-l3-s3-b2-e0.45-lw4-c1-g0-m4 w6-r2-l3-s3-b2-e0.45-lw4-c1-g0-m5
    5. w6-r2-l2-s3-b3-e0.2-lw5-c0.5-g0 w6-r2-l2-s3-b3-e0.4-lw5-c0.5-g0 w5-r2-l2-s4-b3-e0.3-lw5-c0.5-g0
    6. --model-seed 1, then 2: w6-r2-l2-s3-b3-e0.3-lw5-c0.5-g0
    7. --min-gap 10 (a two-word span): w6-r2-l2-s3-b3-e0.1-lw5-c0.5-g3, then its model seeds 1, 2
    8. (2026-11-24, idle 2-core CPU) --stage screen of grammar seeds 6-15 of the registered
       shape (w6-r2-l2-s3-b3-e0.3-lw5-c0.5-g6 ... -g15; 5 s each; best span-1 gaps: g13 22.3,
       g11 16.9, g14 14.0, g12 13.2, g8 11.5, every oracle 98.9-99.9), then --stage train
       --only ...-g13: KL 0.0143 at step 2000 (never < 0.01), span-1 at n = 200: look-up
       66.5, random-init 76.7, trained 94.5, oracle 98.9 — 4.5 below the oracle: fails two
       criteria
    9. (2026-11-24, idle 2-core CPU, two searches at once, ~1 min per trained candidate)
       more level-2 symbols (more span-1 classes: a linear probe on 64 features needs more
       of its 200 examples than one on the posterior): --stage screen of s4 (2 roots, 2 or
       3 rules), s5 (3 roots) and w8/lw6, w7/lw6 shapes, grammar seeds 0-11; --stage train
       of the 14 with the largest screen gaps. At the constant lr 13 of them ended at KL
       0.011-0.024 (the lr's noise floor; the 14th, w6-r2-l2-s3-b3-e0.3-lw6-c0.5-g1, at
       0.0085 but 1.1 points below its oracle), the s4-b3 shape 2.0-7.5 points below the
       oracle. Then --schedule isoloss (the study's own AdamW fork: the decay ends the
       plateau): w6-r2-l2-s4-b3-e0.3-lw5-c0.5-g6 met every criterion in model seeds 0, 1
       and 2 (KL < 0.01 first at step 1400/1300/1500; span-1 at n = 200 with the base at
       step 1000: look-up 81.3, random-init 80.6-80.7, trained 91.7/90.8/91.7, oracle 98.8;
       at step 1600: trained 89.8/88.3/92.1), registered as PCFG size ``headroom``; the
       old ``headroom`` (g0 of s3) under the same schedule: KL < 0.01 at step 1300 but
       4.8/4.1 points below the oracle at step 1000/1600 (fails, as before).
Result of rounds 1-8 (constant lr): no grammar met all four margins in every model seed. Most tasks over two or more
words sit near the ceiling for every representation in grammars this small; those with
room (three levels, six roots) fitted too slowly, like every grammar whose trained model
stayed 5+ points below the oracle (KL >= 0.0115 at step 2000; three levels >= 0.025). One
met all four at model seed 0 — w6-r2-l2-s3-b3-e0.1-lw5-c0.5-g3, span-2 (majority 82.9,
random-init 84.3, look-up 85.7, trained 93.0, oracle 99.2; KL < 0.01 at step 1700) — but not
at seeds 1 and 2 (KL 0.0105 and 0.0110 at best; 3.4 and 3.7 points below the oracle). The
one registered as ``PCFG`` size ``headroom`` (its comment in ``languages/pcfg.py``) misses a
single margin in every seed: w6-r2-l2-s3-b3-e0.3-lw5-c0.5-g0, KL < 0.01 at steps 1400-1600;
span-1 at n = 200: look-up 70.8, random-init 73.9-81.5, trained 95.0-96.6, oracle 99.2 —
2.6-4.2 points below the oracle, not 5. Round 9's winner replaced it (``languages/pcfg.py``).

Every row goes to ``<out>/search.csv`` (rewritten atomically after each row; a rerun skips
rows already there, and a finished training run is reused, so an interrupted search
resumes). Runs are ``<out>/runs/<candidate>`` (ordinary ``sameloss pretrain`` folders).
Candidates are registered as PCFG sizes inside this process only (``PCFG`` builds sizes
from ``pcfg.PRESETS``), so a run folder's config names a size that exists only here: to
reuse a winner elsewhere it must be registered in ``PRESETS`` (as ``headroom`` was).
"""

from __future__ import annotations

import argparse
import csv
import io
import itertools
import math
import sys
import time
from pathlib import Path

import torch

from sameloss import config as configlib
from sameloss.errors import UserError
from sameloss.files import atomic_write_text, folder_lock
from sameloss.languages import pcfg as pcfg_module
from sameloss.languages.pcfg import PCFG
from sameloss.measures.headroom import HeadroomDesign, headroom_table, task_data
from sameloss.training.config import PretrainConfig

SHAPE_KEYS = ("n_words", "n_roots", "n_levels", "symbols_per_level", "binary_rules_per_symbol", "emit_prob",
              "words_per_last_symbol", "concentration")
SHORT = {"n_words": "w", "n_roots": "r", "n_levels": "l", "symbols_per_level": "s", "binary_rules_per_symbol": "b",
         "emit_prob": "e", "words_per_last_symbol": "lw", "concentration": "c"}
N = 200  # the few-shot size the criteria are stated at
MARGIN = 5.0  # points
KL_TARGET = 0.01


def candidate_name(shape: dict, seed: int, max_len: int | None) -> str:
    name = "-".join(f"{SHORT[k]}{shape[k]:g}" for k in SHAPE_KEYS) + f"-g{seed}"
    return name + (f"-m{max_len}" if max_len else "")


# The grid: the released grammar's shape (layered, binary rules between adjacent levels, a
# little emission above the last level), shrunk so a 0.1M model can fit it in 2000 steps.
# First ``micro`` (the size the study used before: KL 0.064 after 2000 steps), then two
# levels (sentences of 2-4 words: fits in ~2000 steps), and three levels capped at 6 words.
MICRO = dict(n_words=12, n_roots=2, n_levels=3, symbols_per_level=3, binary_rules_per_symbol=2, emit_prob=0.2,
             words_per_last_symbol=4, concentration=1.0)


def grid() -> list[tuple[dict, int, int | None]]:
    out = [(MICRO, 1, None)]
    for words, spl, rules, emit, wpl, conc in itertools.product((6, 8), (3, 4), (3, 6), (0.1, 0.3), (3, 5),
                                                                (0.5, 1.0)):
        out.append((dict(MICRO, n_words=words, n_levels=2, symbols_per_level=spl, binary_rules_per_symbol=rules,
                         emit_prob=emit, words_per_last_symbol=wpl, concentration=conc), 0, None))
    for words, rules, emit, wpl in itertools.product((6, 8), (2, 4), (0.3, 0.45), (3, 4)):
        out.append((dict(MICRO, n_words=words, binary_rules_per_symbol=rules, emit_prob=emit,
                         words_per_last_symbol=wpl), 0, 6))
    # With two roots the first level-1 symbol is one of two (S_i -> L1_a L1_b is fixed), so
    # spans of two or more words sit at the ceiling above: more roots, as in the released
    # grammar (9 roots over 8 symbols per level).
    for roots, spl, rules, emit, wpl in itertools.product((4, 6), (3, 4), (3, 6), (0.1, 0.3), (3, 5)):
        out.append((dict(MICRO, n_words=6, n_roots=roots, n_levels=2, symbols_per_level=spl,
                         binary_rules_per_symbol=rules, emit_prob=emit, words_per_last_symbol=wpl), 0, None))
    for rules, wpl in itertools.product((2, 4), (3, 4)):
        out.append((dict(MICRO, n_words=6, n_roots=4, binary_rules_per_symbol=rules, emit_prob=0.3,
                         words_per_last_symbol=wpl), 0, 6))
    # Other grammar seeds of the first shapes that reached KL < 0.01 with span-1 headroom
    # above look-up and random-init (but within 5 points of the oracle at seed 0).
    for emit, seed in itertools.product((0.3, 0.1), range(1, 6)):
        out.append((dict(MICRO, n_words=6, n_levels=2, binary_rules_per_symbol=3, emit_prob=emit,
                         words_per_last_symbol=5, concentration=0.5), seed, None))
    # Peakier rules (concentration 0.5 fitted fastest) with more roots and symbols (lower
    # oracles: more classes), and other seeds of the six-root shape that kept 6.4 points
    # below the oracle (but reached only KL 0.016 in 2000 steps).
    for roots, spl, emit in itertools.product((4, 6), (3, 4), (0.1, 0.3)):
        out.append((dict(MICRO, n_words=6, n_roots=roots, n_levels=2, symbols_per_level=spl,
                         binary_rules_per_symbol=3, emit_prob=emit, words_per_last_symbol=5, concentration=0.5),
                    0, None))
    for seed in range(1, 4):
        out.append((dict(MICRO, n_words=6, n_roots=6, n_levels=2, symbols_per_level=4, binary_rules_per_symbol=3,
                         emit_prob=0.3, words_per_last_symbol=5), seed, None))
    # Three levels kept 11 points below the oracle but fitted slowly (8-word sentences): three
    # levels with sentences capped at 4-5 words (trees of mixed depth, short contexts).
    for emit, conc, max_len in itertools.product((0.3, 0.45), (0.5, 1.0), (4, 5)):
        out.append((dict(MICRO, n_words=6, words_per_last_symbol=4, emit_prob=emit, concentration=conc), 0, max_len))
    for conc in (0.5, 1.0):
        out.append((dict(MICRO, n_words=6, n_roots=4, words_per_last_symbol=4, emit_prob=0.45, concentration=conc),
                    0, 5))
    # Three levels fit too slowly even at 4 words (KL 0.025 at step 2000); last round: two
    # levels near the one shape that fitted (w6-r2-s3-b3-e0.3-lw5-c0.5, but 3.8 points below
    # its oracle), with one more symbol or root (more classes: lower oracles), fewer rules or
    # words, other emission rates.
    near = dict(MICRO, n_words=6, n_levels=2, binary_rules_per_symbol=3, emit_prob=0.3, words_per_last_symbol=5,
                concentration=0.5)
    for change in (dict(symbols_per_level=4, binary_rules_per_symbol=2),  # (4 symbols, 3 rules: above)
                   dict(n_roots=3), dict(n_roots=3, symbols_per_level=4), dict(binary_rules_per_symbol=2),
                   dict(n_words=5), dict(n_words=5, symbols_per_level=4), dict(emit_prob=0.2), dict(emit_prob=0.4),
                   dict(words_per_last_symbol=6)):
        out.append((dict(near, **change), 0, None))
    return out


def register(shape: dict, seed: int, max_len: int | None) -> str:
    """Register the candidate as a PCFG size of this process (training and checkpoint
    loading build the language from the config's size)."""
    name = candidate_name(shape, seed, max_len)
    pcfg_module.PRESETS[name] = dict(shape, **({"max_len": max_len} if max_len else {}))
    pcfg_module.PRESET_SEEDS[name] = seed
    return name


def isoloss_schedule() -> tuple[int, int, int, int, float]:
    """The isoloss ``tiny`` study's AdamW fork as one run: (base steps, end step, decay
    steps, final steps, final lr factor) — constant lr to the base and its recipe steps,
    then the linear decay and the stretch at the decayed lr, where its candidates lie."""
    from sameloss.experiments.recipes.isoloss import PRESETS as ISOLOSS

    p = ISOLOSS["tiny"]
    adamw = next(f for f in p.forks if f.name == "adamw")
    return p.base_steps, p.fork_end(adamw), p.decay_steps, p.final_steps_of(adamw), p.final_lr_factor


def train_config(name: str, steps: int, eval_every: int, eval_sentences: int, seed: int = 0,
                 schedule: str = "constant") -> PretrainConfig:
    # the isoloss study's tiny settings (experiments/common.py COMMON["tiny"], recipes/isoloss/)
    extra = [f"save_every={steps}"]
    if schedule == "isoloss":
        base, steps, decay, final, factor = isoloss_schedule()
        extra = [f"optim.decay_steps={decay}", f"optim.final_steps={final}", f"optim.final_lr_factor={factor}",
                 f"save_every={steps}", f"checkpoints=[{base}]"]  # kept: the base (the gate's) and the end
    return configlib.load(PretrainConfig, None, [
        f"name={name}", "language.name=pcfg", f"language.size={name}", "model.size=tiny", f"steps={steps}",
        "batch_size=256", "optim.name=adamw", "optim.lr=1e-3", "optim.warmup_steps=200", "optim.weight_decay=0.01",
        "model.dropout=0.1", f"eval.every={eval_every}", f"eval.n_sentences={eval_sentences}", f"seed={seed}",
        "log_every=100", "device=cpu", *extra])


def measured_steps(cfg: PretrainConfig, schedule: str) -> list[int]:
    """Where the trained row is measured: the last step, and under the isoloss schedule
    also the base step (where the study's headroom gate reads its base)."""
    return [isoloss_schedule()[0], cfg.steps] if schedule == "isoloss" else [cfg.steps]


class Log:
    """``search.csv``: one row per (candidate, task, stage), rewritten atomically."""

    def __init__(self, path: Path):
        self.path = path
        self.rows: list[dict] = []
        if path.exists():
            with path.open(newline="") as f:
                self.rows = list(csv.DictReader(f))

    def has(self, candidate: str, task: str, stage: str, model_seed: int = 0) -> bool:
        return any(r["candidate"] == candidate and r["task"] == task and r["stage"] == stage
                   and int(r.get("model_seed") or 0) == model_seed for r in self.rows)

    def get(self, candidate: str, stage: str) -> list[dict]:
        return [r for r in self.rows if r["candidate"] == candidate and r["stage"] == stage]

    def add(self, row: dict) -> None:
        self.rows.append({k: (f"{v:.6g}" if isinstance(v, float) else v) for k, v in row.items()})
        keys = list(dict.fromkeys(k for r in self.rows for k in r))
        buf = io.StringIO()
        writer = csv.DictWriter(buf, fieldnames=keys, restval="")
        writer.writeheader()
        writer.writerows(self.rows)
        atomic_write_text(self.path, buf.getvalue())


def describe_grammar(lang: PCFG) -> dict:
    rep = lang.length_report
    p = rep.length_probs[1:] / rep.length_probs[1:].sum()
    flops = sum(float(p[t - 1]) * lang.parser.flops(t) for t in range(1, rep.max_len + 1) if p[t - 1] > 0)
    ent = lang.entropy(2000, torch.Generator().manual_seed(0))
    return {"max_len": lang.max_len, "n_nonterminals": lang.grammar.n_nonterminals, "p_fit": rep.fit,
            "mean_len": float((torch.arange(1, rep.max_len + 1) * p).sum()), "kflop_per_sentence": flops / 1e3,
            "entropy": ent.mean}


def screen(lang: PCFG, cfg: PretrainConfig, args) -> list[dict]:
    """Per span task: what needs no training (majority, random-init, look-up, oracle)."""
    out = []
    for k in range(1, lang.max_len):
        task = f"span-{k}"
        design = HeadroomDesign(task, sizes=(N,), subsets=(args.screen_subsets,), pool=args.pool,
                                test=args.screen_test)
        row = {"task": task}
        try:
            data = task_data(lang, design)
        except UserError as exc:  # the span is (almost) never a constituent
            out.append(row | {"note": str(exc)[:80]})
            continue
        table = headroom_table(lang, design, random_init=cfg, data=data)
        counts = torch.bincount(data.train.labels, minlength=data.n_classes)
        row.update(kept=data.kept_fraction, classes_seen=int((counts > 0).sum()),
                   majority=100 * table.accuracy("majority", N), random_init=100 * table.accuracy("random-init", N),
                   lookup=100 * table.accuracy("look-up", N), oracle=100 * table.accuracy("oracle", N))
        row["gap"] = row["oracle"] - max(row["lookup"], row["random_init"])
        out.append(row)
    return out


def kl_curve(run_dir: Path) -> list[tuple[int, float]]:
    from sameloss.training.runio import eval_history

    return [(step, float(ev["kl"])) for step, ev in sorted(eval_history(run_dir).items()) if ev.get("kl") is not None]


def train_and_measure(name: str, lang: PCFG, cfg: PretrainConfig, tasks: list[str], args) -> list[dict]:
    from sameloss.training.checkpoint import checkpoint_dir
    from sameloss.training.loop import pretrain
    from sameloss.training.runio import load_checkpoint

    suffix = (f"-model{cfg.seed}" if cfg.seed else "") + ("-isoloss" if args.schedule == "isoloss" else "")
    run_dir = args.out / "runs" / (name + suffix)
    t0 = time.monotonic()
    pretrain(cfg, run_dir, resume=run_dir.exists(), progress=False)
    train_s = time.monotonic() - t0
    curve = kl_curve(run_dir)
    below = [s for s, kl in curve if kl < KL_TARGET]
    final_kl = curve[-1][1]
    run = {"final_kl": final_kl, "min_kl": min(kl for _, kl in curve), "steps_to_kl01": below[0] if below else "",
           "kl_curve": " ".join(f"{s}:{kl:.4f}" for s, kl in curve), "train_s": train_s}  # the run's, every row
    steps = measured_steps(cfg, args.schedule)
    models = {step: load_checkpoint(checkpoint_dir(run_dir, step), "cpu")[0] for step in steps}
    out = []
    for task in tasks:
        design = HeadroomDesign(task, sizes=(N,), subsets=(args.subsets,), pool=args.pool, test=args.test)
        rows = []
        for step, model in models.items():
            table = headroom_table(lang, design, trained={"trained (tiny, step %d)" % step: model},
                                   random_init=cfg)
            print(table.format(), flush=True)
            m = table.margins(N)
            rows.append({"task": task, "step": step, **run,
                         "majority": 100 * table.accuracy("majority", N),
                         "random_init": 100 * table.accuracy("random-init", N),
                         "lookup": 100 * table.accuracy("look-up", N), "trained": 100 * table.accuracy("trained", N),
                         "oracle": 100 * table.accuracy("oracle", N), "above_lookup": m["above_lookup"],
                         "above_random_init": m["above_random_init"], "below_oracle": m["below_oracle"],
                         "headroom": m["headroom"]})
        # constant lr: the final model's KL (the criterion as first searched); the study's
        # schedule: KL < 0.01 at some step (its candidates lie in the decayed stretch), and
        # the headroom at every measured step (the gate's base and the fork's end)
        fits = final_kl < KL_TARGET if args.schedule == "constant" else bool(below)
        meets = fits and all(r["headroom"] >= MARGIN for r in rows)
        out += [r | {"meets": meets} for r in rows]
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\nThe recorded search")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--out", type=Path, default=Path("runs/pcfg-headroom-search"),
                        help="the search's folder: search.csv and runs/ (default runs/pcfg-headroom-search)")
    parser.add_argument("--stage", choices=("screen", "train", "all", "report"), default="all",
                        help="screen: no training; train: the promising screened candidates; all: both (default); "
                             "report: print the tables of search.csv (markdown) and exit")
    parser.add_argument("--only", nargs="*", default=None,
                        help="candidate names (default: the whole grid); a name outside the grid is read back into "
                             "its shape")
    parser.add_argument("--steps", type=int, default=2000, help="training steps per model (default 2000)")
    parser.add_argument("--eval-every", type=int, default=100,
                        help="steps between exact KL evaluations: the resolution of 'steps to KL < 0.01' (default 100)")
    parser.add_argument("--eval-sentences", type=int, default=2000,
                        help="held-out sentences of each exact evaluation (default 2000)")
    parser.add_argument("--pool", type=int, default=2000, help="labelled pool the few-shot subsets come from "
                                                                "(default 2000)")
    parser.add_argument("--subsets", type=int, default=40, help="subsets of n = 200 in the train stage (default 40)")
    parser.add_argument("--screen-subsets", type=int, default=10, help="subsets of n = 200 in the screen (default 10)")
    parser.add_argument("--screen-test", type=int, default=2000, help="test sentences in the screen (default 2000)")
    parser.add_argument("--test", type=int, default=20_000, help="test sentences in the train stage (default 20000)")
    parser.add_argument("--min-gap", type=float, default=15.0,
                        help="a screened task is promising when oracle − max(look-up, random-init) is at least this "
                             "many points (default 15)")
    parser.add_argument("--train-top", type=int, default=6,
                        help="train at most this many promising candidates, largest gap first (default 6)")
    parser.add_argument("--schedule", choices=("constant", "isoloss"), default="constant",
                        help="constant: --steps at the constant lr, measured at the end (the criterion as first "
                             "searched); isoloss: the isoloss tiny study's AdamW fork as one run (constant lr to "
                             "base + recipe steps, linear decay, the stretch at lr x 0.05: 1600 steps), measured at "
                             "the base step (the study's headroom gate) and at the end (default constant)")
    parser.add_argument("--model-seed", type=int, default=0,
                        help="the trained model's seed (its initial weights and data stream; 0: the search's)")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.stage == "report":
        print(report(Log(args.out / "search.csv").rows))
        return
    args.out.mkdir(parents=True, exist_ok=True)
    with folder_lock(args.out, "search"):  # one search per folder: a second would rewrite search.csv under it
        search(args)


def search(args) -> None:
    log = Log(args.out / "search.csv")
    candidates = {candidate_name(*c): c for c in grid()}
    if args.only:
        for name in args.only:  # a name of the grid, or any name this script's naming can parse back
            candidates.setdefault(name, parse_name(name))
        candidates = {n: candidates[n] for n in args.only}
    promising: list[tuple[float, str, str]] = []
    for name, (shape, seed, max_len) in candidates.items():
        register(shape, seed, max_len)
        params = dict(candidate=name, **shape, seed=seed)
        if args.stage in ("screen", "all") and not log.get(name, "screen"):
            t0 = time.monotonic()
            try:
                lang = PCFG.preset(name)
            except UserError as exc:
                log.add(params | {"stage": "screen", "task": "", "note": str(exc)[:120]})
                print(f"{name}: refused: {exc}", flush=True)
                continue
            info = describe_grammar(lang)
            cfg = train_config(name, args.steps, args.eval_every, args.eval_sentences)
            for row in screen(lang, cfg, args):
                log.add(params | info | {"stage": "screen"} | row)
            print(f"{name}: screened in {time.monotonic() - t0:.0f} s", flush=True)
        for r in log.get(name, "screen"):
            if r.get("gap"):
                promising.append((float(r["gap"]), name, r["task"]))
        for r in log.get(name, "screen"):
            if r.get("gap"):
                print(f"  {name} {r['task']}: majority {float(r['majority']):.1f} random-init "
                      f"{float(r['random_init']):.1f} look-up {float(r['lookup']):.1f} oracle "
                      f"{float(r['oracle']):.1f} (gap {float(r['gap']):.1f})", flush=True)
    if args.stage == "screen":
        return
    by_candidate: dict[str, list[str]] = {}
    for gap, name, task in sorted(promising, reverse=True):
        if gap >= args.min_gap:
            by_candidate.setdefault(name, []).append(task)
    for name in list(by_candidate)[:args.train_top]:
        stage = "train" if args.schedule == "constant" else f"train-{args.schedule}"
        tasks = [t for t in by_candidate[name] if not log.has(name, t, stage, args.model_seed)]
        if not tasks:
            continue
        shape, seed, max_len = candidates[name]
        lang = PCFG.preset(name)
        cfg = train_config(name, args.steps, args.eval_every, args.eval_sentences, args.model_seed, args.schedule)
        info = describe_grammar(lang)
        for row in train_and_measure(name, lang, cfg, tasks, args):
            log.add(dict(candidate=name, **shape, seed=seed) | info | {"stage": stage, "model_seed": args.model_seed}
                    | row)


def _f(row: dict, key: str, fmt: str = ".1f") -> str:
    value = row.get(key, "")
    return format(float(value), fmt) if value not in ("", None) else ""


def report(rows: list[dict]) -> str:
    """Markdown: per screened candidate its best span task (largest oracle − max(look-up,
    random-init) gap), then every trained (candidate, task) with the full headroom table."""
    lines = ["Screen (no training; n = 200, mean over the screen's subsets; best span task per candidate)", "",
             "| candidate | ℓ | fit | ent | task | kept | maj | rand | look-up | oracle | gap |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    best: dict[str, dict] = {}
    for r in rows:
        if r["stage"] != "screen":
            continue
        if not r.get("gap"):
            best.setdefault(r["candidate"], r)
        elif not best.get(r["candidate"], {}).get("gap") or float(r["gap"]) > float(best[r["candidate"]]["gap"]):
            best[r["candidate"]] = r
    for name, r in best.items():
        if r.get("note") and not r.get("gap"):
            lines.append(f"| {name} | | | | | | | | | | {r['note']} |")
            continue
        lines.append(f"| {name} | {r['max_len']} | {_f(r, 'p_fit', '.3f')} | {_f(r, 'entropy', '.2f')} | "
                     f"{r['task']} | {_f(r, 'kept', '.2f')} | {_f(r, 'majority')} | {_f(r, 'random_init')} | "
                     f"{_f(r, 'lookup')} | {_f(r, 'oracle')} | {_f(r, 'gap')} |")
    lines += ["", "Trained (tiny transformer, isoloss tiny settings; n = 200, mean over the subsets; margins in "
              "points: trained − look-up, trained − random-init, oracle − trained)", "",
              "| candidate | schedule | model seed | task | KL@end | min KL | steps to KL<0.01 | step | maj | rand | "
              "look-up | trained | oracle | −look-up | −rand | oracle− | meets |",
              "|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in rows:
        if r["stage"].startswith("train"):
            schedule = r["stage"].removeprefix("train").removeprefix("-") or "constant"
            lines.append(f"| {r['candidate']} | {schedule} | {r.get('model_seed') or 0} | {r['task']} | "
                         f"{_f(r, 'final_kl', '.4f')} | {_f(r, 'min_kl', '.4f')} | {r['steps_to_kl01'] or '>'} | "
                         f"{r.get('step') or ''} | {_f(r, 'majority')} | {_f(r, 'random_init')} | {_f(r, 'lookup')} | "
                         f"{_f(r, 'trained')} | "
                         f"{_f(r, 'oracle')} | {_f(r, 'above_lookup', '+.1f')} | {_f(r, 'above_random_init', '+.1f')} "
                         f"| {_f(r, 'below_oracle', '+.1f')} | {r['meets']} |")
    return "\n".join(lines)


def parse_name(name: str) -> tuple[dict, int, int | None]:
    """The inverse of ``candidate_name``."""
    parts = name.split("-")
    inverse = {v: k for k, v in SHORT.items()}
    shape, seed, max_len = {}, None, None
    for p in parts:
        key = next((s for s in sorted(inverse, key=len, reverse=True) if p.startswith(s) and
                    _is_number(p[len(s):])), None)
        if key is not None and inverse[key] not in shape:
            value = float(p[len(key):])
            shape[inverse[key]] = int(value) if inverse[key] not in ("emit_prob", "concentration") else value
        elif p.startswith("g") and _is_number(p[1:]):
            seed = int(p[1:])
        elif p.startswith("m") and _is_number(p[1:]):
            max_len = int(p[1:])
        else:
            raise SystemExit(f"cannot read candidate name {name!r} at {p!r}")
    if set(shape) != set(SHAPE_KEYS) or seed is None:
        raise SystemExit(f"candidate name {name!r} lacks some of {', '.join(SHORT.values())}, g")
    return shape, seed, max_len


def _is_number(s: str) -> bool:
    try:
        return math.isfinite(float(s))
    except ValueError:
        return False


if __name__ == "__main__":
    try:
        main()
    except UserError as exc:
        print(f"error: {exc}", file=sys.stderr)
        sys.exit(2)
