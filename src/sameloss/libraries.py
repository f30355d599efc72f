"""The third-party libraries, quietly: their warnings and notices never reach a user's
terminal as noise, and never break the rule that an error is one line on stderr.

* ``quiet_libraries``: for the whole of a ``sameloss`` command (``cli.main``): Python
  warnings are ignored (unless ``-W`` or ``PYTHONWARNINGS`` asks for them — sameloss says
  what it has to say in its own lines, never through ``warnings``), and transformers logs
  only errors (``TRANSFORMERS_VERBOSITY``, unless set; inherited by the workers of
  ``reproduce``).
* ``quiet_transformers``: the one way sameloss loads and saves Hugging Face models and
  tokenizers. transformers logs notices of its own while it loads a folder (an unknown
  key, "add is_decoder=True", a weight-loading bar) and before it raises; what goes wrong
  is sameloss's to report, in one line (``errors.UserError``), and what goes right needs
  no notice. For the Python API's callers too; their settings are restored afterwards.

Where a warning can be fixed at its source it is (``languages/lm_generated.py`` passes the
KV cache by transformers' current keyword); these filter what cannot be.
"""

from __future__ import annotations

import contextlib
import os
import sys
import warnings


@contextlib.contextmanager
def quiet_libraries():
    """Inside the block: Python warnings ignored (unless asked for), transformers' log at
    errors only (unless ``TRANSFORMERS_VERBOSITY`` is set)."""
    os.environ.setdefault("TRANSFORMERS_VERBOSITY", "error")
    os.environ.setdefault("TRANSFORMERS_NO_ADVISORY_WARNINGS", "1")
    with warnings.catch_warnings():
        if not sys.warnoptions:
            warnings.simplefilter("ignore")
        yield


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


__all__ = ["quiet_libraries", "quiet_transformers"]
