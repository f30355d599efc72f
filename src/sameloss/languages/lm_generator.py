"""The generator of a causal language (``lm_generated.py``): ``transformers`` loaded or one
line saying how to install it (``require_transformers``), a generator folder's shape and kind
read from its config before any weights (``generator_shape``, ``check_causal``), the dtype and
device a user names, and the model's KV cache across transformers releases (the keyword a
``forward`` takes it by, the cache it returns, its per-layer keys and values, a fresh one
holding given ones)."""

from __future__ import annotations

from pathlib import Path

import torch

from sameloss.errors import UserError
from sameloss.errors import first_line as _one_line
from sameloss.libraries import quiet_transformers


def require_transformers():
    try:
        import transformers
    except ImportError:
        raise UserError("the causal language needs the transformers package: pip install 'sameloss[hf]'") from None
    return transformers


def parse_dtype(value) -> torch.dtype:
    if isinstance(value, torch.dtype):
        return value
    names = {"float64": torch.float64, "double": torch.float64, "float32": torch.float32, "float": torch.float32,
             "bfloat16": torch.bfloat16, "float16": torch.float16, "half": torch.float16}
    if value not in names:
        raise UserError(f"unknown dtype {value!r}; choose from {', '.join(names)}")
    return names[value]


def parse_device(value) -> torch.device:
    if value == "auto":
        return torch.device("cuda" if torch.cuda.is_available() else "cpu")
    device = torch.device(value)
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError("device 'cuda' requested for the generator but no CUDA device is available")
    return device


def generator_shape(path) -> dict:
    """``positions``, ``layers``, ``hidden`` and ``vocab`` of a generator folder, read from
    its config alone (before any weights are loaded), for checks that must come first."""
    transformers = require_transformers()
    folder = Path(path)
    if not folder.is_dir():
        raise UserError(f"generator folder not found: {folder}")
    try:
        with quiet_transformers(transformers):
            config = transformers.AutoConfig.from_pretrained(str(folder), local_files_only=True)
    except Exception as exc:  # transformers raises OSError, ValueError, KeyError, ... for bad folders
        raise UserError(f"cannot load a causal LM from {folder}: {_one_line(exc)}") from None
    check_causal(config, folder)
    shape = {"positions": getattr(config, "max_position_embeddings", None),
             "layers": getattr(config, "num_hidden_layers", None), "hidden": getattr(config, "hidden_size", None),
             "vocab": getattr(config, "vocab_size", None)}
    missing = [k for k, v in shape.items() if isinstance(v, bool) or not isinstance(v, int) or v <= 0]
    if missing:
        raise UserError(f"the generator config in {folder} has no usable {', '.join(missing)}")
    return shape


def check_causal(config, folder: Path) -> None:
    """``UserError`` when the folder's config names a model that is not a causal LM (a
    BERT exported by ``sameloss export`` is a ``BertForMaskedLM``, which transformers
    would load as a causal one, with a warning, and sample nonsense from)."""
    architectures = [a for a in (getattr(config, "architectures", None) or []) if isinstance(a, str)]
    if architectures and not any(a.endswith(("ForCausalLM", "LMHeadModel")) for a in architectures):
        raise UserError(f"{folder} holds a {architectures[0]}, not a causal language model (a *ForCausalLM or "
                        "*LMHeadModel, e.g. one written by sameloss causal-lm train)")


# ---- KV caches across transformers versions (5.0 onwards: pyproject.toml) --------------------
def cache_keyword(model) -> str:
    """The keyword a model's ``forward`` takes its KV cache by: ``cache`` since transformers
    renamed it in 5.x (``past_key_values`` still works there but warns), else
    ``past_key_values`` (5.0 and the releases before the rename)."""
    import inspect

    try:
        params = inspect.signature(model.forward).parameters
    except (TypeError, ValueError):
        return "past_key_values"
    return "cache" if "cache" in params else "past_key_values"


def returned_cache(out):
    """The KV cache a model returned (``use_cache=True``), under its name of either era
    (``keys()``: asking an output of a newer release for the old name warns)."""
    keys = out.keys()
    return out["cache"] if "cache" in keys else out["past_key_values"]


def kv_pairs(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """Per-layer ``(keys, values)``, each ``[batch, heads, positions, head_dim]``."""
    if not hasattr(cache, "layers"):
        raise UserError(f"unsupported KV cache type {type(cache).__name__} from the generator")
    return [(layer.keys, layer.values) for layer in cache.layers]


def make_cache(pairs, like, config):
    """A fresh cache holding ``pairs``, of the kind the model returned (``like``), filled
    layer by layer through ``Cache.update`` (the constructor's ``ddp_cache_data`` put the
    layers after empty ones in some releases, 4.54 and 4.55: silently wrong results)."""
    try:
        cache = type(like)()
    except TypeError:
        cache = type(like)(config=config)
    for layer, (keys, values) in enumerate(pairs):
        cache.update(keys, values, layer)
    return cache
