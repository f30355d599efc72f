"""A language search's tables (``search.py``): the markdown it prints and keeps in
``search.md``, and ``search.csv``, every stage's rows."""

from __future__ import annotations

import math

from ... import files, storage


def write_files(study, result: dict) -> None:
    """``search.csv`` (every stage's rows) and ``search.md`` (the tables as printed)."""
    from ..reports.document import write_csv

    rows = [{"stage": stage, **r} for stage in ("screen", "train", "gate") for r in result[stage]]
    write_csv(rows, study.root / "search.csv")
    path = study.root / "search.md"
    from ..engine.folder import record_output

    with storage.storage_errors(path):
        record_output(path)
        files.atomic_write_text(path, result["text"] + "\n")


def _f(value, fmt: str = ".1f") -> str:
    return "" if value is None or (isinstance(value, float) and math.isnan(value)) else format(value, fmt)


def tables(result: dict, family: str, task: str, design) -> str:
    """The search's tables as markdown, and the specs that pass (or that none do)."""
    lines = [f"Screen: {len(result['screen'])} draws, no training; probe at n = the study's primary size "
             f"({design.screen_subsets} subsets, {design.screen_test} test sentences); points; gap = oracle − "
             f"max(look-up, random-init); promising: gap ≥ {design.min_gap:g}", "",
             "| draw | majority | random-init | look-up | oracle | gap | promising | CPU s |",
             "|---|---|---|---|---|---|---|---|"]
    for r in result["screen"]:
        if "note" in r:
            lines.append(f"| `{r['spec']}` | refused: {r['note']} | | | | | | |")
            continue
        lines.append(f"| `{r['spec']}` | {_f(r['majority'])} | {_f(r['random_init'])} | {_f(r['lookup'])} | "
                     f"{_f(r['oracle'])} | {_f(r['gap'])} | {'yes' if r['promising'] else ''} | {_f(r['cpu_s'], '.0f')} |")
    if design.screen_only:
        lines += ["", "(--screen-only: nothing trained)"]
        return "\n".join(lines)
    lines += ["", f"Trained (seed 0, isoloss scale {design.scale}: the study's base and its adamw fork; the gate on "
                  "the base, the study's probe design; margins in points: trained − look-up, trained − random-init, "
                  "oracle − trained)", "",
              "| draw | KL base | fork min KL | random-init | look-up | trained (base) | oracle | margins | gate | "
              "trained (fork end) | CPU s |", "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["train"]:
        lines.append(f"| `{r['spec']}` | {_f(r['base_kl'], '.4f')} | {_f(r.get('fork_min_kl'), '.4f')} | "
                     f"{_f(r['random_init'])} | {_f(r['lookup'])} | {_f(r['trained'])} | {_f(r['oracle'])} | "
                     f"{r['above_lookup']:+.1f} / {r['above_random_init']:+.1f} / {r['below_oracle']:+.1f} | "
                     f"{'passed' if r['ok'] else 'failed'} | {_f(r.get('trained_end'))} | {_f(r['cpu_s'], '.0f')} |")
    if not result["train"]:
        lines.append(f"| (no draw reached a gap of {design.min_gap:g}) | | | | | | | | | | |")
    if design.gate_seeds > 1:
        lines += ["", f"Gate per seed (the bases of seeds 0..{design.gate_seeds - 1}; a draw passes with ≥ "
                      f"{design.gate_pass:.4g} of them; stopped once it cannot)", "",
                  "| draw | seed | KL base | random-init | look-up | trained | oracle | margins | gate |",
                  "|---|---|---|---|---|---|---|---|---|"]
        for r in result["gate"]:
            lines.append(f"| `{r['spec']}` | {r['seed']} | {_f(r['base_kl'], '.4f')} | {_f(r['random_init'])} | "
                         f"{_f(r['lookup'])} | {_f(r['trained'])} | {_f(r['oracle'])} | {r['above_lookup']:+.1f} / "
                         f"{r['above_random_init']:+.1f} / {r['below_oracle']:+.1f} | "
                         f"{'passed' if r['ok'] else 'FAILED'} |")
        for spec in dict.fromkeys(r["spec"] for r in result["gate"]):
            mine = [r for r in result["gate"] if r["spec"] == spec]
            lines.append(f"\n`{spec}`: {sum(r['ok'] for r in mine)} of {len(mine)} seeds passed")
    lines.append("")
    what = f"on ≥ {design.gate_pass:.4g} of {design.gate_seeds} seeds" if design.gate_seeds > 1 else "on seed 0"
    if result["passed"]:
        lines.append(f"Pass the headroom gate {what}:")
        lines += [f"    --language {spec}" for spec in result["passed"]]
    else:
        lines.append(f"No draw passes the headroom gate {what}: no language with headroom among these "
                     f"{len(result['screen'])} draws of {family} (task {task}).")
    return "\n".join(lines)


__all__ = ["tables", "write_files"]
