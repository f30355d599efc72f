"""PCFG: exact conditionals, likelihoods, entropy and task labels against brute-force
enumeration of every tree, in float64."""

from __future__ import annotations

import math
from pathlib import Path

import pytest
import torch

from helpers.pcfg_brute import RECURSIVE, conditional, enumerate_trees, string_probs
from sameloss.errors import InputFileError, UserError
from sameloss.languages.base import Batch
from sameloss.languages.pcfg import HEADROOM_TASK, MIN_FIT, NOTE_FLOPS, PCFG
from sameloss.languages.pcfg_grammar import Grammar
from sameloss.languages.pcfg_random import GrammarShape, random_layered

ANCHOR = Path(__file__).resolve().parents[3] / "shared" / "anchors" / "rule_deep_mlm.txt"
TOL = 1e-10



def layered(seed: int) -> Grammar:
    return random_layered(GrammarShape(n_words=5, n_roots=2, n_levels=2, symbols_per_level=3, binary_rules_per_symbol=3,
                                       emit_prob=0.3, words_per_emission=2, words_per_last_symbol=3), seed=seed)


def test_a_random_grammar_is_drawn_as_pinned_and_leaves_the_global_generator_alone():
    """``random_layered``'s draws (Dirichlet weights from torch's public Gamma sampler, every draw
    from the global generator seeded with the grammar's seed and restored after) pinned: seed 0
    of ``layered``'s shape as the code drawing from its own generator gave it."""
    torch.manual_seed(123)
    before = torch.get_rng_state()
    g = layered(0)
    assert torch.equal(torch.get_rng_state(), before)
    assert g.rule_left.tolist() == [3, 5, 6, 6, 8, 8, 8, 8, 6, 7, 8]
    assert g.rule_right.tolist() == [5, 4, 7, 6, 6, 8, 7, 6, 7, 8, 6]
    pinned = [1.0, 1.0, 0.431699681639, 0.138380940854, 0.129919377506, 0.369376321987, 0.143967107138,
              0.186656570875, 0.016202614756, 0.123995595613, 0.55980178963]
    assert g.rule_prob.tolist() == pytest.approx(pinned, abs=1e-12)
    emitted = [0.181787372799, 0.118212627201, 0.240167087237, 0.059832912763, 0.100327824015, 0.199672175985,
               0.113332588539, 0.282721932332, 0.603945479129, 0.374050744235, 0.320880502087, 0.305068753678,
               0.441261738389, 0.211537226032, 0.347201035579]
    assert g.emission[g.emission > 0].tolist() == pytest.approx(emitted, abs=1e-12)


GRAMMARS = {
    "layered0": (lambda: layered(0), 4),
    "layered1": (lambda: layered(1), 4),
    "recursive": (lambda: Grammar.from_text(RECURSIVE), 5),
    "headroom": (lambda: PCFG.preset("headroom").grammar, 4),  # the registered size itself
}


@pytest.fixture(scope="module", params=list(GRAMMARS))
def case(request):
    make, max_len = GRAMMARS[request.param]
    grammar = make()
    lang = PCFG(grammar, max_len)
    by_string, trees = enumerate_trees(grammar, max_len)
    return lang, by_string, string_probs(by_string)


def _pad(lang, strings):
    tokens = torch.full((len(strings), lang.max_len), lang.pad_id, dtype=torch.long)
    for i, s in enumerate(strings):
        tokens[i, : len(s)] = torch.tensor(s)
    return tokens


def test_conditionals_match_enumeration_for_every_mask_pattern(case):
    lang, _, probs = case
    gen = torch.Generator().manual_seed(0)
    strings = sorted(probs, key=lambda s: -probs[s])[:40]
    tokens = _pad(lang, strings)
    n, T = tokens.shape
    for trial in range(6):
        valid = tokens != lang.pad_id
        masked = (torch.rand(n, T, generator=gen) < 0.35) & valid
        query = ((torch.rand(n, T, generator=gen) < 0.5) & valid) | masked  # masked and unmasked
        got = lang.conditionals(tokens.masked_fill(masked, lang.mask_id), masked, query)
        for row, (i, t) in enumerate(query.nonzero().tolist()):
            hidden = [j for j in range(T) if masked[i, j]]
            want = conditional(probs, strings[i], hidden, t, lang.n_words)
            assert torch.allclose(got[row], torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0), (trial, i, t)


def test_conditional_ignores_the_words_at_masked_and_query_positions(case):
    lang, _, probs = case
    strings = [s for s in probs if len(s) >= 2][:10]
    tokens = _pad(lang, strings)
    query = tokens != lang.pad_id
    masked = torch.zeros_like(query)
    masked[:, 0] = True
    a = lang.conditionals(tokens, masked, query)
    scrambled = tokens.clone()
    scrambled[:, 0] = lang.mask_id
    b = lang.conditionals(scrambled, masked, query)
    assert torch.equal(a, b)


def test_log_likelihood_matches_enumeration(case):
    lang, _, probs = case
    strings = list(probs)[:60]
    got = lang.log_likelihood(_pad(lang, strings))
    want = torch.tensor([math.log(probs[s]) for s in strings], dtype=torch.float64)
    assert torch.allclose(got, want, atol=TOL, rtol=0)


def test_masked_log_likelihood_sums_out_the_masked_words(case):
    lang, _, probs = case
    strings = [s for s in probs if len(s) >= 3][:20]
    tokens = _pad(lang, strings)
    masked = torch.zeros_like(tokens, dtype=torch.bool)
    masked[:, 1] = True
    got = lang.log_likelihood(tokens, masked)
    for i, s in enumerate(strings):
        want = sum(p for u, p in probs.items() if len(u) == len(s) and all(u[j] == s[j] for j in range(len(s)) if j != 1))
        assert abs(got[i].item() - math.log(want)) < TOL


def test_entropy_estimate_agrees_with_exact_value(case):
    lang, _, probs = case
    # exact token-weighted single-mask entropy under the sampling distribution
    # (the grammar conditioned on length <= max_len)
    total = sum(probs.values())
    num = den = 0.0
    for s, p in probs.items():
        for t in range(len(s)):
            c = conditional(probs, s, [], t, lang.n_words)
            num += p / total * -sum(x * math.log(x) for x in c if x > 0)
        den += p / total * len(s)
    exact = num / den
    est = lang.entropy(20_000, torch.Generator().manual_seed(1), batch_size=5000)
    assert est.stderr > 0
    assert abs(est.mean - exact) < 4 * est.stderr, (est, exact)


def test_sampler_matches_string_probabilities(case):
    lang, _, probs = case
    total = sum(probs.values())
    batch = lang.sample(30_000, torch.Generator().manual_seed(2))
    assert batch.tokens.shape == (30_000, lang.max_len)
    counts: dict = {}
    for row, n in zip(batch.tokens.tolist(), batch.lengths.tolist()):
        counts[tuple(row[:n])] = counts.get(tuple(row[:n]), 0) + 1
    assert set(counts) <= set(probs)
    for s, p in sorted(probs.items(), key=lambda kv: -kv[1])[:10]:
        freq, q = counts.get(s, 0) / 30_000, p / total
        assert abs(freq - q) < 4 * math.sqrt(q * (1 - q) / 30_000) + 1e-4, (s, freq, q)


def test_sampled_constituents_form_a_tree_the_grammar_can_produce(case):
    lang, by_string, _ = case
    batch = lang.sample(300, torch.Generator().manual_seed(3))
    spans = batch.latent
    for i in range(len(batch)):
        n = int(batch.lengths[i])
        mine = frozenset(tuple(r[1:]) for r in spans[spans[:, 0] == i].tolist())
        s = tuple(batch.tokens[i, :n].tolist())
        assert any(mine == k for _, k in by_string[s]), (s, sorted(mine))


def test_same_seed_same_sample(case):
    lang = case[0]
    a = lang.sample(500, torch.Generator().manual_seed(7))
    b = lang.sample(500, torch.Generator().manual_seed(7))
    assert torch.equal(a.tokens, b.tokens) and torch.equal(a.latent, b.latent)


def test_task_labels_match_enumeration(case):
    lang, by_string, probs = case
    g = lang.grammar
    strings = list(probs)[:80]
    tokens = _pad(lang, strings)
    _, trees = enumerate_trees(g, lang.max_len)
    roots = g.start_symbols
    tasks = lang.tasks
    batch = type("B", (), {"tokens": tokens})  # labellers read .tokens only (the sampled tasks: their own test)
    labels = {name: task.label(batch) for name, task in tasks.items() if not name.endswith("-sampled")}
    for i, s in enumerate(strings):
        # released code: argmax inside probability of the prefix read as a string
        def inside(a, prefix):
            return sum(p for u, p, _ in trees(a, len(prefix)) if u == prefix)
        root_scores = [inside(a, s) for a in roots]
        assert labels["A"][i] == (max(range(len(roots)), key=root_scores.__getitem__) if max(root_scores) > 0 else -1)
        for name, k in (("B", 4), ("C", 2)):
            if len(s) < k:
                assert labels[name][i] == -1
                continue
            scores = [inside(a, s[:k]) for a in range(g.n_nonterminals)]
            want = max(range(len(scores)), key=scores.__getitem__) if max(scores) > 0 else -1
            assert labels[name][i] == want or scores[int(labels[name][i])] == pytest.approx(max(scores), rel=1e-12)
        # paper: posterior over the symbol spanning [0, L)
        for name, span in zip(("A-paper", "B-paper", "C-paper"), lang.paper_spans):
            post = [0.0] * g.n_nonterminals
            for p, k in by_string[s]:
                for (a_start, a_end, a) in k:
                    if a_start == 0 and a_end == span:
                        post[a] += p / probs[s]
            got = lang.span_posterior(tokens[i: i + 1], span)[0]
            assert torch.allclose(got, torch.tensor(post, dtype=torch.float64), atol=TOL, rtol=0)
            want = max(range(len(post)), key=post.__getitem__) if max(post) > 0 else -1
            assert labels[name][i] == want or post[int(labels[name][i])] == pytest.approx(max(post), rel=1e-12)


def _every_length(probs, per_length: int = 25) -> list[tuple[int, ...]]:
    """The ``per_length`` most likely strings of every length (the longest included)."""
    out = []
    for length in sorted({len(s) for s in probs}):
        out += sorted((s for s in probs if len(s) == length), key=lambda s: -probs[s])[:per_length]
    return out


def test_span_task_posteriors_match_enumeration(case):
    """Every task's ``posterior`` against the explicit trees (float64), on strings of every
    length: ``span-k`` (and the paper's tasks) P(symbol spans [0, k) | sentence) for every
    k, the released A/B/C the normalised inside scores of the first k words read as a
    string of their own (A: the start symbols over the whole sentence); each label is
    its posterior's argmax, -1 where the posterior is zero."""
    lang, by_string, probs = case
    g = lang.grammar
    strings = _every_length(probs)
    assert max(map(len, strings)) == lang.max_len
    tokens = _pad(lang, strings)
    batch = type("B", (), {"tokens": tokens})
    tasks = lang.tasks
    assert [f"span-{k}" for k in range(1, lang.max_len)] == [n for n in tasks if n.startswith("span-")
                                                             and not n.endswith("-sampled")]
    _, trees = enumerate_trees(g, lang.max_len)

    def inside(a, string):
        return sum(p for u, p, _ in trees(a, len(string)) if u == string)

    def check(name, want_of):
        post, labels = tasks[name].posterior(tokens), tasks[name].label(batch)
        assert post.dtype == torch.float64 and post.shape[0] == len(strings)
        for i, s in enumerate(strings):
            want = want_of(s)
            assert torch.allclose(post[i], torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0), (name, s)
            if max(want) == 0:
                assert labels[i] == -1
            else:
                assert want[int(labels[i])] == pytest.approx(max(want), rel=1e-12)

    def span_posterior(k):
        def want_of(s):
            want = [0.0] * g.n_nonterminals
            for p, constituents in by_string[s]:
                for a_start, a_end, a in constituents:
                    if a_start == 0 and a_end == k:
                        want[a] += p / probs[s]
            return want
        return want_of

    def normalised_inside(k, symbols):
        def want_of(s):
            if k is not None and len(s) < k:
                return [0.0] * len(symbols)
            scores = [inside(a, s if k is None else s[:k]) for a in symbols]
            total = sum(scores)
            return [x / total if total > 0 else 0.0 for x in scores]
        return want_of

    for k in range(1, lang.max_len):
        assert tasks[f"span-{k}"].span == (0, k)
        check(f"span-{k}", span_posterior(k))
    for name, k in zip(("A-paper", "B-paper", "C-paper"), lang.paper_spans):
        check(name, span_posterior(k))
    everything = list(range(g.n_nonterminals))
    for name, k, symbols in (("A", None, list(g.start_symbols)), ("B", 4, everything), ("C", 2, everything)):
        assert tasks[name].span == (0, k)
        check(name, normalised_inside(k, symbols))


def test_a_sampled_span_task_labels_the_drawn_symbol_and_its_oracle_is_its_exact_posterior(case):
    """``span-k-sampled``: the label is the symbol of the drawn tree over [0, k) (-1: no such
    constituent), and the oracle's posterior is P(that symbol | sentence, [0, k) a constituent),
    against the explicit trees; the sampler's labels of a frequent sentence follow it; and where the
    sentence leaves the symbol ambiguous its Bayes accuracy is below 1 (the argmax labels of
    ``span-k`` are a function of the sentence: their oracle sits at 100 %)."""
    lang, by_string, probs = case
    g = lang.grammar
    tasks = lang.tasks
    strings = _every_length(probs)
    tokens = _pad(lang, strings)
    batch = lang.sample(20_000, torch.Generator().manual_seed(5))
    counts: dict = {}
    for row, n in zip(batch.tokens.tolist(), batch.lengths.tolist()):
        counts[tuple(row[:n])] = counts.get(tuple(row[:n]), 0) + 1
    for k in range(1, lang.max_len):
        task = tasks[f"span-{k}-sampled"]
        assert task.span == (0, k) and task.n_classes == g.n_nonterminals
        post = task.posterior(tokens)
        for i, s in enumerate(strings):
            want = [0.0] * g.n_nonterminals
            for p, constituents in by_string[s]:
                for a_start, a_end, a in constituents:
                    if a_start == 0 and a_end == k:
                        want[a] += p
            total = sum(want)
            want = [x / total if total > 0 else 0.0 for x in want]
            assert torch.allclose(post[i], torch.tensor(want, dtype=torch.float64), atol=TOL, rtol=0), (k, s)
        labels = task.label(batch)
        lat = batch.latent
        for i in range(200):
            over = lat[(lat[:, 0] == i) & (lat[:, 1] == 0) & (lat[:, 2] == k)]
            assert int(labels[i]) == (int(over[0, 3]) if len(over) else -1)
        # the labels of the most frequent sentence follow its posterior (binomial tolerance)
        top = max(counts, key=counts.get)
        rows = [i for i in range(len(batch)) if tuple(batch.tokens[i, :int(batch.lengths[i])].tolist()) == top]
        kept = labels[rows][labels[rows] >= 0]
        if len(kept) >= 100:
            p = task.posterior(batch.tokens[rows[:1]])[0]
            freq = torch.bincount(kept, minlength=g.n_nonterminals).double() / len(kept)
            assert torch.all((freq - p).abs() <= 5 * torch.sqrt(p * (1 - p) / len(kept)) + 1e-3), (k, top)


def test_the_sampled_span_task_leaves_room_below_its_oracle_where_the_argmax_task_does_not():
    """On the registered ``headroom`` grammar the oracle of ``span-1`` (argmax labels) is right
    every time — its labels are a function of the posterior — while that of ``span-1-sampled`` is
    right only as often as the sentence determines the symbol (measured 90.8 %)."""
    lang = PCFG.preset("headroom")
    batch = lang.sample(4000, torch.Generator().manual_seed(0))
    argmax, sampled = lang.tasks["span-1"], lang.tasks["span-1-sampled"]
    post = sampled.posterior(batch.tokens)
    assert torch.equal(post.argmax(dim=1), argmax.label(batch))
    labels = sampled.label(batch)
    assert bool((labels >= 0).all())  # one word is always a constituent
    bayes = float((post.argmax(dim=1) == labels).double().mean())
    assert 0.85 < bayes < 0.95
    # and its expected value, E[max posterior], agrees (the labels are drawn from the posterior)
    assert bayes == pytest.approx(float(post.max(dim=1).values.mean()), abs=0.02)


def test_prefix_posteriors_are_recomputed_for_changed_or_other_tokens(case):
    lang, _, probs = case
    strings = [s for s in probs if len(s) >= 2][:20]
    tokens = _pad(lang, strings)
    first = lang.prefix_posteriors(tokens)
    assert lang.prefix_posteriors(tokens) is first  # the same tensor, unchanged: one pass
    other = _pad(lang, strings[::-1])
    tokens[0] = other[0]  # in place: the kept result no longer applies
    # (to the last bits only: a row's float64 sums may round differently at another place in
    # the batch; a stale result would be another sentence's, wrong by far more)
    torch.testing.assert_close(lang.prefix_posteriors(tokens)[0], first[-1], rtol=0, atol=1e-12)
    torch.testing.assert_close(lang.prefix_posteriors(other), first.flip(0), rtol=0, atol=1e-12)  # another tensor
    for k in range(1, lang.max_len + 1):
        assert torch.equal(lang.span_posterior(tokens, k), lang.prefix_posteriors(tokens.clone())[:, k - 1])


# ---- the released grammar --------------------------------------------------------------
@pytest.mark.skipif(not ANCHOR.exists(), reason="shared/anchors not beside the checkout")
def test_released_grammar_reads_as_is():
    lang = PCFG.from_file(ANCHOR)
    g = lang.grammar
    assert (g.n_nonterminals, g.n_words, lang.max_len) == (50, 200, 16)
    assert [g.nonterminals[i] for i in g.start_symbols] == [f"S{i}" for i in range(1, 10)]
    assert g.unreachable == ("A1_9",)
    assert dict(g.renormalised)["A4_1"] == pytest.approx(0.99976591, abs=1e-8)
    # duplicate lines add up: A1_2 -> A2_1 A2_7 appears three times in the file
    nt = {n: i for i, n in enumerate(g.nonterminals)}
    sel = (g.rule_parent == nt["A1_2"]) & (g.rule_left == nt["A2_1"]) & (g.rule_right == nt["A2_7"])
    assert sel.sum() == 1
    assert g.rule_prob[sel].item() == pytest.approx(0.011925442062071771 + 0.07545018977724269 + 0.05552696768540534)
    batch = lang.sample(2000, torch.Generator().manual_seed(0))
    assert 2 <= batch.lengths.min() and batch.lengths.max() <= 16
    assert 10.0 < batch.lengths.double().mean() < 11.4  # the notes: mean 10.7


def test_round_trip_through_our_format(tmp_path):
    g = layered(3)
    path = tmp_path / "g.pcfg"
    g.save(path)
    h = Grammar.from_file(path)
    assert h.nonterminals == g.nonterminals and h.words == g.words
    for field in ("start", "rule_parent", "rule_left", "rule_right", "rule_prob", "emission"):
        assert torch.allclose(getattr(h, field).double(), getattr(g, field).double(), atol=1e-15), field


def test_round_trip_keeps_unary_and_own_root_rules(tmp_path):
    g = Grammar.from_text(RECURSIVE)
    h = Grammar.from_text(g.to_text())
    a, b = PCFG(g, 5), PCFG(h, 5)
    tokens = a.sample(200, torch.Generator().manual_seed(0)).tokens
    assert torch.allclose(a.log_likelihood(tokens), b.log_likelihood(tokens), atol=1e-12)


# ---- bad input ----------------------------------------------------------------------------
BAD = {
    "non-normalised": ("S A B 0.5\nA a 1.0\nB b 1.0\n", r"<g>:1: the rules of 'S' sum to 0.5"),
    "negative": ("S A B 1.2\nS A A -0.2\nA a 1.0\nB b 1.0\n", r"<g>:2: probability -0.2 is negative"),
    "nan": ("S A B nan\nA a 1.0\nB b 1.0\n", r"<g>:1: probability is nan"),
    "not a number": ("S A B one\nA a 1.0\n", r"<g>:1: probability 'one' is not a number"),
    "malformed": ("S A B C 1.0\n", r"<g>:1: expected 'LHS RHS1 \[RHS2\] PROB', got 5 fields"),
    "no rules": ("S A B 1.0\nA a 1.0\n", r"<g>:1: symbol 'B' has no rules"),
    "unreachable (ours)": ('root S\nS -> A A 1.0\nA -> "a" 1.0\nB -> "b" 1.0\n', r"<g>:4: symbol 'B' is unreachable"),
    "unary chain": ("S X 1.0\nX Y 1.0\nY a 1.0\n", r"<g>:2: unary rule X -> Y: only the root"),
    "no root": ("A a 1.0\n", r"<g>: the root symbol 'S' has no rules"),
    "empty": ("\n\n", r"<g>: the grammar has no rules"),
    "unproductive": ("S A B 1.0\nA A A 1.0\nB b 1.0\n", r"<g>:1: symbols 'S', 'A' derive no finite string"),
    "quoted in binary": ('S -> "a" B 1.0\nB -> "b" 1.0\n', r"<g>:1: a binary rule must rewrite to two non-terminals"),
}


@pytest.mark.parametrize("name", list(BAD))
def test_bad_grammar_names_the_problem_and_line(name):
    text, pattern = BAD[name]
    with pytest.raises(InputFileError, match=pattern):
        Grammar.from_text(text, source="<g>")


def test_missing_file_and_unknown_preset_are_user_errors(tmp_path):
    with pytest.raises(UserError, match="grammar file not found"):
        PCFG.from_file(tmp_path / "nope.txt")
    with pytest.raises(UserError, match="unknown PCFG size 'huge'; choose from headroom, micro, paper, tiny"):
        PCFG.preset("huge")


def test_presets_have_the_documented_shapes():
    paper = PCFG.preset("paper")
    assert (paper.n_words, paper.grammar.n_nonterminals, paper.max_len) == (200, 50, 32)
    tiny = PCFG.preset("tiny")
    assert tiny.max_len <= 8 and tiny.n_words <= 32
    batch = paper.sample(1000, torch.Generator().manual_seed(0))
    assert batch.lengths.max() <= 32
    # every position's conditional is a distribution
    c = paper.conditionals(batch.tokens[:50], torch.zeros(50, 32, dtype=torch.bool), batch.tokens[:50] != paper.pad_id)
    assert torch.allclose(c.sum(dim=1), torch.ones(c.shape[0], dtype=torch.float64), atol=1e-12)


def test_headroom_size_builds_and_its_span_task_labels_each_sentence_by_its_posterior(capsys):
    lang = PCFG.preset("headroom")
    assert (lang.n_words, lang.grammar.n_nonterminals, lang.max_len) == (6, 11, 4)  # S, 2 roots, 2 levels of 4
    rep = lang.length_report
    assert rep.regime == "subcritical" and rep.fit >= MIN_FIT and rep.shortest == 2
    p = rep.length_probs[1:] / rep.length_probs[1:].sum()
    cost = sum(float(p[t - 1]) * lang.parser.flops(t) for t in range(1, 5))
    assert 0 < cost < NOTE_FLOPS and capsys.readouterr().err == ""  # cheap: no cost note
    task = lang.tasks[HEADROOM_TASK]
    assert task.span == (0, 1) and task.n_classes == lang.grammar.n_nonterminals
    batch = lang.sample(600, torch.Generator().manual_seed(0))
    labels = task.label(batch)
    # a function of the sentence: alone or in a batch, and equal sentences, the same label
    alone = torch.cat([task.label(Batch(batch.tokens[i:i + 1], batch.lengths[i:i + 1])) for i in range(30)])
    assert torch.equal(alone, labels[:30])
    seen: dict = {}
    for row, y in zip(batch.tokens.tolist(), labels.tolist()):
        assert seen.setdefault(tuple(row), y) == y
    assert len(seen) < len(batch)  # the check above did compare repeated sentences
    assert torch.equal(task.posterior(batch.tokens).argmax(dim=1), labels)  # every sentence labelled
    counts = torch.bincount(labels, minlength=task.n_classes)
    assert int((counts > 0).sum()) >= 4 and float(counts.max()) / len(labels) < 0.6  # majority ≈ 55 %
    summary = lang.describe(n_sentences=300)
    assert summary["max_len"] == 4 and summary["tasks"][HEADROOM_TASK]["kept_fraction"] == 1.0
