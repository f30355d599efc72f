"""PCFG grammars that could hang or blow up: the length distribution from the grammar's
generating function (against brute-force enumeration, in float64), up-front refusal of
grammars whose sentences (almost) never fit max_len, the sampler's bounded rejection
loop, the parser's memory and cost limits, and grammar-file edge cases."""

from __future__ import annotations

import dataclasses
import math
from collections import defaultdict
from pathlib import Path

import pytest
import torch

from helpers.pcfg_brute import RECURSIVE, enumerate_trees, string_probs
from sameloss import cli
from sameloss.errors import InputFileError, UserError
from sameloss.languages import inside_outside, pcfg, pcfg_grammar, pcfg_lengths
from sameloss.languages.pcfg import PCFG
from sameloss.languages.pcfg_grammar import Grammar
from sameloss.progress import Progress
from sameloss.languages.pcfg_random import GrammarShape, random_layered

ANCHOR = Path(__file__).resolve().parents[3] / "shared" / "anchors" / "rule_deep_mlm.txt"


def branching(p: float) -> Grammar:
    """S -> S S with probability p, S -> "a" otherwise: a Galton-Watson tree with 0 or 2
    children, whose numbers are known in closed form."""
    return Grammar.from_text(f'root S\nS -> S S {p!r}\nS -> "a" {1 - p!r}\n')


# ---- the length distribution against enumeration ------------------------------------------
@pytest.mark.parametrize("make", [lambda: Grammar.from_text(RECURSIVE), lambda: branching(0.45),
                                  lambda: random_layered(GrammarShape(n_words=5, n_roots=2, n_levels=2,
                                                                      symbols_per_level=3, binary_rules_per_symbol=3,
                                                                      emit_prob=0.3, words_per_emission=2,
                                                                      words_per_last_symbol=3), seed=1)],
                         ids=["recursive", "branching", "layered"])
def test_length_table_matches_enumeration(make):
    g = make()
    max_len = 6
    _, trees = enumerate_trees(g, max_len)
    table = g.length_table(max_len)
    assert table.dtype == torch.float64
    for a in range(g.n_nonterminals):
        for length in range(1, max_len + 1):
            want = sum(p for _, p, _ in trees(a, length))
            assert table[a, length].item() == pytest.approx(want, rel=1e-12, abs=1e-15), (a, length)
    # the sentence-length distribution and the sampler's acceptance rate
    by_string, _ = enumerate_trees(g, max_len)
    per_length = defaultdict(float)
    for s, p in string_probs(by_string).items():
        per_length[len(s)] += p
    report = g.length_report(max_len)
    for length in range(1, max_len + 1):
        assert report.length_probs[length].item() == pytest.approx(per_length[length], rel=1e-12, abs=1e-15)
    assert report.fit == pytest.approx(sum(per_length.values()), rel=1e-12)


@pytest.mark.parametrize("p", [0.3, 0.5, 0.8])
def test_branching_numbers_match_the_closed_form(p, monkeypatch):
    # extinction probability min(1, (1-p)/p); mean offspring 2p; expected leaves (1-p)/(1-2p)
    for dense in (True, False):
        if not dense:  # the iterative path large grammars take
            monkeypatch.setattr(pcfg_lengths, "DENSE_SYMBOLS", 0)
        r = branching(p).length_report(8)
        assert r.spectral_radius == pytest.approx(2 * p, rel=1e-9)
        assert r.regime == {0.3: "subcritical", 0.5: "critical", 0.8: "supercritical"}[p]
        # at criticality rounding limits Newton to about sqrt(machine epsilon), and plain
        # iteration (large grammars) converges like 1/iterations
        tol = 1e-12 if p != 0.5 else 1e-6 if dense else 1e-3
        assert r.terminates == pytest.approx(min(1.0, (1 - p) / p), abs=tol)
        if p < 0.5:
            assert r.expected_length == pytest.approx((1 - p) / (1 - 2 * p), rel=1e-9)
        else:
            assert r.expected_length == math.inf
        assert r.shortest == 1


def test_shortest_yield_of_a_deep_grammar():
    g = Grammar.from_text("S A A 1.0\nA B B 1.0\nB C C 1.0\nC x 0.5\nC C C 0.5\n")
    assert g.shortest_yields().tolist() == [8.0, 4.0, 2.0, 1.0]


# ---- refused up front, through the CLI -----------------------------------------------------
def _no_sampling(monkeypatch):
    """Any sampling fails the test: the errors must come before it."""
    def sample(*args, **kwargs):
        raise AssertionError("the sampler ran before the error")
    monkeypatch.setattr(PCFG, "_sample_round", sample)


def _describe(path, capsys, *extra) -> tuple[int, str, str]:
    code = cli.main(["language", "describe", "pcfg", "--grammar", str(path), *extra])
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def _one_error_line(code, err, *fragments):
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("sameloss: error: "), err
    for fragment in fragments:
        assert fragment in lines[0], lines[0]
    return lines[0]


def test_sentences_that_never_fit_are_refused(tmp_path, capsys, monkeypatch):
    _no_sampling(monkeypatch)
    path = tmp_path / "long.txt"  # every sentence has 2**6 = 64 words; max_len is capped at 32
    path.write_text("S A1 A1 1.0\nA1 A2 A2 1.0\nA2 A3 A3 1.0\nA3 A4 A4 1.0\nA4 A5 A5 1.0\nA5 A6 A6 1.0\nA6 x 1.0\n")
    code, out, err = _describe(path, capsys)
    _one_error_line(code, err, str(path), "no sentence fits max_len 32 (the shortest has 64 words)",
                    "sampling would not finish")
    assert out == ""


def test_near_critical_recursion_is_refused(tmp_path, capsys, monkeypatch):
    _no_sampling(monkeypatch)
    path = tmp_path / "recursive.txt"
    path.write_text("S S S 0.99999\nS a 0.00001\n")
    code, _, err = _describe(path, capsys)
    line = _one_error_line(code, err, "P(a sentence fits max_len 32) = 1e-05", "supercritical",
                           "spectral radius 1.99998", "terminates with probability 1e-05",
                           "sampling would need about 1e+05 draws per sentence, refused above 100")
    assert line.count("\n") == 0


def test_threshold_is_on_the_fit_probability(tmp_path):
    # just below and just above MIN_FIT (the fit of S -> S S p at max_len 32 is about (1-p)/p)
    for p, refused in [(0.991, True), (0.97, False)]:
        g = branching(p)
        fit = g.length_report(32).fit
        assert (fit < pcfg.MIN_FIT) == refused
        if refused:
            with pytest.raises(UserError, match=r"P\(a sentence fits max_len 32\) = 0.009"):
                PCFG(g, 32)
        else:
            lang = PCFG(g, 32)
            assert lang.sample(200, torch.Generator().manual_seed(0)).lengths.max() <= 32


def test_critical_grammar_still_samples(tmp_path, capsys):
    path = tmp_path / "critical.pcfg"
    path.write_text('root S\nS -> S S 0.5\nS -> "a" 0.5\n')
    code, out, err = _describe(path, capsys, "--n-sentences", "64")
    assert code == 0 and err == ""
    assert "max_len 32" in out


# ---- the sampler's rejection loop ----------------------------------------------------------
def test_rejection_loop_is_bounded_by_the_fit_probability():
    g = branching(0.9)  # P(fit 16) is about 0.11
    lang = PCFG(g, 16)
    assert 0.1 < lang.length_report.fit < 0.12
    # a length report that claims every derivation fits: the bound is 2n + 100 draws,
    # where about 0.11 * 300 = 33 of the 100 wanted sentences fit
    lang.length_report = dataclasses.replace(lang.length_report, fit=1.0)
    with pytest.raises(UserError, match=r"sampling: \d+ derivations drawn but only \d+ of 100 sentences fit"):
        lang.sample(100, torch.Generator().manual_seed(0))


def test_redraws_follow_the_acceptance_rate(monkeypatch):
    lang = PCFG(branching(0.9), 16)
    asked = []
    original = PCFG._sample_round
    monkeypatch.setattr(PCFG, "_sample_round", lambda self, n, gen: asked.append(n) or original(self, n, gen))
    batch = lang.sample(500, torch.Generator().manual_seed(0))
    assert len(batch) == 500 and batch.lengths.max() <= 16
    # one first round of 500, then a redraw sized by 1 / P(fit), not dozens of small ones
    assert asked[0] == 500 and len(asked) <= 4
    assert asked[1] > (500 - 0.2 * 500) / 0.2


# ---- memory and cost of the parser ---------------------------------------------------------
def test_recursive_grammar_shares_one_dense_block_across_lengths():
    lang = PCFG(Grammar.from_text(RECURSIVE), 12)
    blocks = [blk for length in range(3, 13) for blk in lang.parser.blocks[length]]
    pointers = {blk.rules.data_ptr() for blk in blocks}
    # before: one dense copy per span length (the 7 GB of a 90,000-rule grammar)
    assert len(blocks) >= 10 and len(pointers) < len(blocks)
    storage = sum(t for t in {blk.rules.data_ptr(): blk.rules.numel() for blk in blocks}.values())
    assert storage <= 2 * max(blk.rules.numel() for blk in blocks)


def test_huge_dense_blocks_are_refused_before_allocation(tmp_path, capsys, monkeypatch):
    _no_sampling(monkeypatch)
    monkeypatch.setattr(inside_outside, "MAX_BLOCK_BYTES", 100)
    path = tmp_path / "g.pcfg"
    path.write_text(RECURSIVE)
    code, _, err = _describe(path, capsys)
    _one_error_line(code, err, "the parser's dense rule blocks would take", "GiB", "limit")


def test_expensive_grammar_states_its_cost_or_is_refused(tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(pcfg, "NOTE_FLOPS", 1.0)
    lang = PCFG(Grammar.from_text(RECURSIVE), 5, source="g.pcfg")
    captured = capsys.readouterr()  # a note: on stdout, as stderr is not a terminal here (issue 40)
    out = captured.out
    assert out.startswith("grammar g.pcfg: note: exact conditionals cost about") and out.count("\n") == 1
    assert captured.err == ""
    assert lang.parser.flops(5) > 0
    monkeypatch.setattr(pcfg, "MAX_FLOPS", 1.0)
    with pytest.raises(UserError, match="refusing a grammar this expensive"):
        PCFG(Grammar.from_text(RECURSIVE), 5)


def test_passes_split_into_pieces_give_the_same_conditionals(monkeypatch):
    g = Grammar.from_text(RECURSIVE)
    whole = PCFG(g, 5)
    batch = whole.sample(300, torch.Generator().manual_seed(0))
    masked = torch.zeros_like(batch.tokens, dtype=torch.bool)
    masked[:, 0] = True
    query = batch.tokens != whole.pad_id
    want = whole.conditionals(batch.tokens, masked, query)
    monkeypatch.setattr(inside_outside, "WORK_BYTES", 1)
    pieces = PCFG(g, 5)
    assert pieces.parser.rows_per_pass(5) == 1
    got = pieces.conditionals(batch.tokens, masked, query)
    assert torch.allclose(got, want, rtol=0, atol=1e-14)
    assert torch.allclose(pieces.log_likelihood(batch.tokens), whole.log_likelihood(batch.tokens), atol=1e-12)


def test_progress_lines_only_for_slow_steps(capsys):
    quiet = Progress("fast step", 10)
    quiet(5)
    quiet.close()
    assert capsys.readouterr().out == ""
    slow = Progress("slow step", 10, after=0.0, every=0.0)
    slow(5)
    slow.close()
    captured = capsys.readouterr()  # progress: on stdout, as stderr is not a terminal here (issue 40)
    assert captured.err == ""
    lines = captured.out.splitlines()
    assert lines[0].startswith("slow step: 5/10 (") and lines[1].startswith("slow step: done in ")


# ---- grammar-file edge cases ---------------------------------------------------------------
def test_empty_word_is_one_error_line(tmp_path, capsys, monkeypatch):
    _no_sampling(monkeypatch)
    path = tmp_path / "g.pcfg"
    path.write_text('root S\nS -> A A 1.0\nA -> "a" 0.5\nA -> "" 0.5\n')
    code, _, err = _describe(path, capsys)
    _one_error_line(code, err, f"{path}:4: empty word", "at least one character")
    with pytest.raises(InputFileError, match=":1: empty word"):
        Grammar.from_text('words "a" ""\nroot S\nS -> "a" 1.0\n', source="<g>")


@pytest.mark.parametrize("text", ["# only a comment\n\n   # and another\n", "", "\n  \n"], ids=["comments", "empty", "blank"])
def test_comments_only_grammar_says_no_rules(text, tmp_path, capsys, monkeypatch):
    _no_sampling(monkeypatch)
    path = tmp_path / "g.pcfg"
    path.write_text(text)
    code, _, err = _describe(path, capsys)
    _one_error_line(code, err, f"{path}: the grammar has no rules")


@pytest.mark.parametrize("text", [RECURSIVE, "S A B 1.0\nA a 1.0\nB b 1.0\n"], ids=["ours", "released"])
def test_byte_order_mark_is_accepted(text, tmp_path, capsys):
    plain, bom = tmp_path / "plain.txt", tmp_path / "bom.txt"
    plain.write_text(text, encoding="utf-8")
    bom.write_bytes(b"\xef\xbb\xbf" + text.encode("utf-8"))
    a, b = Grammar.from_file(plain), Grammar.from_file(bom)
    assert a.nonterminals == b.nonterminals and a.words == b.words
    assert torch.equal(a.emission, b.emission) and torch.equal(a.rule_prob, b.rule_prob)
    code, out, err = _describe(bom, capsys, "--n-sentences", "32")
    assert code == 0 and err == "" and "language    pcfg" in out


# ---- the released grammar is unchanged ------------------------------------------------------
@pytest.mark.skipif(not ANCHOR.exists(), reason="shared/anchors not beside the checkout")
def test_released_grammar_length_numbers(capsys):
    lang = PCFG.from_file(ANCHOR)
    assert capsys.readouterr().err == ""  # no note, no progress: it is small and cheap
    r = lang.length_report
    assert r.fit == pytest.approx(1.0, abs=1e-12)  # every sentence has <= 16 words
    assert r.regime == "subcritical" and r.spectral_radius < 1e-6  # layered: nilpotent
    assert r.terminates == pytest.approx(1.0, abs=1e-12)
    assert r.expected_length == pytest.approx(float((torch.arange(17) * r.length_probs).sum()), rel=1e-12)
    assert r.shortest == 2


def test_unreachable_recursion_does_not_count():
    # the released format keeps unreachable symbols; a critical one (U: I - M singular
    # there) never occurs
    g = Grammar.from_text("S A A 1.0\nA a 1.0\nU U U 0.5\nU a 0.5\n")
    assert g.unreachable == ("U",)
    r = g.length_report(4)
    assert r.regime == "subcritical" and r.expected_length == pytest.approx(2.0, rel=1e-12)
    assert r.fit == pytest.approx(1.0, abs=1e-15) and r.terminates == pytest.approx(1.0, abs=1e-15)
