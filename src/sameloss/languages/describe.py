"""The text of ``sameloss language describe``: a language's summary (``Language.describe``)
as lines, and the notes on a PCFG's grammar. Imports no torch."""

from __future__ import annotations


def grammar_notes(grammar) -> list[str]:
    """What ``describe`` notes of a PCFG's grammar: rules renormalised, symbols never reached."""
    notes = []
    if grammar.renormalised:
        worst = max(grammar.renormalised, key=lambda kv: abs(kv[1] - 1))
        notes.append(f"rules of {len(grammar.renormalised)} symbols summed to 1 only up to rounding and were "
                     f"renormalised (worst: {worst[0]} summed to {worst[1]:.6f})")
    if grammar.unreachable:
        notes.append(f"unreachable symbols kept but never used: {', '.join(grammar.unreachable)}")
    return notes


def format_summary(s: dict) -> str:
    """``Language.describe``'s summary as the lines ``sameloss language describe`` prints."""
    ent, ent15, length = s["entropy"], s["entropy_masked"], s["length"]
    lines = [
        f"language    {s['language']} ({s['source']})",
        f"vocabulary  {s['n_words']} words + {s['vocab_size'] - s['n_words']} special tokens "
        f"(pad, mask, cls) = {s['vocab_size']}",
    ]
    if "nonterminals" in s:
        lines.append(f"grammar     {s['nonterminals']} non-terminals")
    lines += [
        f"length      {length['min']}-{length['max']} tokens, mean {length['mean']:.2f} ± sd {length['std']:.2f} "
        f"(max_len {s['max_len']}, {ent['n_sentences']} sentences)",
        f"entropy     {ent['mean']:.4f} ± {ent['stderr']:.4f} nats/token  "
        "(optimal MLM loss: one masked position, token-weighted)",
        f"            {ent15['mean']:.4f} ± {ent15['stderr']:.4f} nats/token  "
        f"(optimal MLM loss at {ent15['mask_rate']:.0%} masking)",
        "tasks",
        f"  {'name':<16}{'classes':>8}{'seen':>6}{'majority':>10}{'kept':>7}  description",
    ]
    for name, t in s["tasks"].items():
        lines.append(f"  {name:<16}{t['n_classes']:>8}{t['classes_seen']:>6}{t['majority_rate']:>10.3f}"
                     f"{t['kept_fraction']:>7.3f}  {t['description']}")
    lines.append("examples")
    lines += [f"  {e}" for e in s["examples"]]
    for note in s.get("notes", []):
        lines.append(f"note: {note}")
    return "\n".join(lines)
