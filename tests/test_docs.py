"""The documentation site's reference and generated outputs (issue 50): every public module
is in the API reference, and every output a page shows as printed by sameloss is a block
that ``scripts/docs_outputs.py`` fills."""

from __future__ import annotations

import importlib.util
import re
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
PACKAGE = ROOT / "src" / "sameloss"


def _script():
    spec = importlib.util.spec_from_file_location("docs_outputs", ROOT / "scripts" / "docs_outputs.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_every_public_module_is_in_the_api_reference():
    documented = set()
    for page in (ROOT / "docs" / "reference" / "api").glob("*.md"):
        documented |= set(re.findall(r"^::: (\S+)$", page.read_text(encoding="utf-8"), flags=re.M))
    modules = set()
    for path in PACKAGE.rglob("*.py"):
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        parts = parts[:-1] if parts[-1] == "__init__" else parts
        if not any(p.startswith("_") for p in parts):
            modules.add(".".join(parts))
    assert sorted(modules - documented) == []
    assert sorted(documented - modules) == []  # no page names a module that is gone


def test_generated_blocks_parse_and_the_tutorial_shows_only_generated_output():
    docs = _script()
    pages = {p.relative_to(ROOT).as_posix(): p.read_text(encoding="utf-8") for p in docs.pages()}
    specs = [m["spec"] for text in pages.values() for m in docs.blocks(text)]
    assert [s for s in specs if docs.check_spec(s)] == []
    assert docs.main(["--check"]) == 0
    tutorial = pages["docs/tutorial/index.md"]
    # every ```text / ```markdown block of the tutorial is inside a generated block
    outside = docs.BLOCK.sub("", tutorial)
    assert "```text" not in outside and "```markdown" not in outside
    for kind in ("command --version", "command plan", "log tutorial", "report-lead tutorial", "figures tutorial img"):
        assert kind in specs, kind


def test_a_command_block_is_what_the_command_prints(tmp_path):
    """The generator runs the command and fences what it printed (here: the version)."""
    from sameloss import __version__

    docs = _script()
    assert docs.run_command(["--version"]) == f"```text\nsameloss {__version__}\n```\n"


def test_figures_are_copied_with_their_captions(tmp_path):
    docs = _script()
    run = tmp_path / "run"
    run.mkdir()
    (run / "forest.png").write_bytes(b"\x89PNG fake")
    (run / "report.md").write_text("# R\n\n![Forest plot](forest.png)  \n**Figure 1.** Forest plot: the caption.\n\n"
                                   "![Missing](gone.png)  \n**Figure 2.** not there.\n", encoding="utf-8")
    page = tmp_path / "docs" / "page.md"
    page.parent.mkdir()
    text = docs.figures_block(run, "tiny", page, "img")
    assert (tmp_path / "docs" / "img" / "tiny-forest.png").read_bytes() == b"\x89PNG fake"
    assert text == "![Forest plot](img/tiny-forest.png)\n\n*Figure 1. Forest plot: the caption.*\n"


def test_the_docstring_examples_run():
    """Every ``Example:`` (``>>>``) of a docstring gives what it shows: the API reference
    renders them, so a stale one would mislead a reader."""
    import doctest
    import importlib

    failed, ran = [], 0
    for path in sorted(PACKAGE.rglob("*.py")):
        if ">>> " not in path.read_text(encoding="utf-8"):
            continue
        parts = path.relative_to(PACKAGE.parent).with_suffix("").parts
        module = importlib.import_module(".".join(parts[:-1] if parts[-1] == "__init__" else parts))
        result = doctest.testmod(module, optionflags=doctest.ELLIPSIS)
        ran += result.attempted
        if result.failed:
            failed.append(module.__name__)
    assert ran > 0 and failed == []
