"""The isoloss designs the claims-first rule chooses (``allocation.choose_design``) from the
preset's prior paired SDs and the planner's costs at this project's CPU, printed as the
literals ``pinned.py`` and ``across.py`` pin (a test checks the pins are the rule's):

    python scripts/isoloss_designs.py          # ~1 CPU-min: one dry plan for the costs
"""

from __future__ import annotations

from sameloss.experiments.engine.hardware import REFERENCE_CPU_PEAK
from sameloss.experiments.recipes import isoloss
from sameloss.experiments.recipes.isoloss.across import LANGUAGES_BUDGET_MINUTES, LANGUAGES_WORKERS, languages_preset
from sameloss.experiments.recipes.isoloss.allocation import _unplanned, choose_design, planned_costs


def main() -> None:
    full = _unplanned(isoloss.PRESETS["tiny"])
    costs = planned_costs(full, "cpu", REFERENCE_CPU_PEAK, 2)
    languages = len(languages_preset().replicate)
    for name, minutes, n_lang in (("QUICK", isoloss.QUICK_BUDGET_MINUTES, 1), ("TINY", isoloss.TINY_BUDGET_MINUTES, 1),
                                  ("LANGUAGES", LANGUAGES_BUDGET_MINUTES, languages)):
        d = choose_design(full, costs, 60 * minutes, LANGUAGES_WORKERS, languages=n_lang)
        print(f"# {name}: {d.wall / 60:.1f} min forecast, claims {', '.join(d.claims)}")
        print(f"{name}_PLAN = {tuple(d.seeds.items())!r}")
        print(f"{name}_LEFT = {tuple(d.left.items())!r}")
        for t, (detect, null) in d.power.items():
            print(f"#   {t}: power {detect:.2f} to detect, {null:.2f} to show none")


if __name__ == "__main__":
    main()
