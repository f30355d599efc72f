"""transformers without its notices: the one way sameloss loads and saves Hugging Face
models and tokenizers (``quiet_transformers``).

transformers logs notices and warnings of its own while it loads a folder (an unknown
key, "add is_decoder=True", a weight-loading bar) and before it raises; what goes wrong
is sameloss's to report, in one line (``errors.UserError``), and what goes right needs no
notice. The command line also turns library warnings off for the whole process
(``cli.quiet_libraries``); this context does it for the Python API's callers too, and
restores their settings afterwards.
"""

from __future__ import annotations

import contextlib
import warnings


@contextlib.contextmanager
def quiet_transformers(transformers):
    """No progress bars, no logged notices below errors, no Python warnings inside the
    block (``transformers``: the imported module, which the caller has checked for)."""
    hf_logging = transformers.utils.logging
    bar, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


__all__ = ["quiet_transformers"]
