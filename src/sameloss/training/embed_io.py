"""``sameloss embed``: write a checkpoint of a larger transformer that computes exactly
the function of a small checkpoint (App. B.4) — the run I/O around ``models.embed``."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import torch

from .. import config as configlib
from .. import files
from ..errors import UserError
from ..models.embed import check_embeddable, embed, target_plan
from . import checkpoint as ckpt
from . import runio
from .optim import build_optimizer


def embed_checkpoint(
    small_checkpoint_dir: str | Path,
    out_dir: str | Path,
    into: str | None = None,
    width_factor: int | None = None,
    extra_layers: int = 0,
    force: bool = False,
    optimizer: str = "fresh",
) -> Path:
    """Embed the transformer of a checkpoint and save it as a checkpoint of the large model.

    ``out_dir`` must be new (or an empty folder); ``force`` lets it replace a folder an
    earlier ``embed_checkpoint`` wrote (it holds ``.sameloss-embedded``). A folder that
    is, holds or lies inside a training run or a checkpoint is never written to. The
    folder is assembled under a temporary name and renamed into place.

    ``into``: a transformer size name (e.g. ``t4-1920``) whose shape is the target; the
    width factor and added layers follow from it. Without it: ``width_factor`` (default 1)
    and ``extra_layers`` (MLP width × the width factor). ``optimizer``: ``"fresh"`` (a new
    optimiser) or ``"embedded"`` (the small checkpoint's optimiser moments mapped onto the
    large parameters as gradients map — ``models.embed.embed_gradient`` — with its step
    count and RNG state, so a fork ``init_from`` it continues the small run's optimiser
    rather than restarting Adam from zero moments). Writes
    ``out_dir/checkpoints/step_<step of the small checkpoint>/`` (``model.safetensors``,
    ``state.pt`` with a fresh optimiser and schedule, ``meta.json`` with the small run's
    config describing the large model — ``model.size`` a size name when one has the large
    shape, else the small model's size with ``model.d_model``, ``n_heads``, ``n_layers``
    and ``d_inter`` set — the small checkpoint's evaluation, valid for the same
    function, and an ``embedded_from`` record) and
    ``out_dir/config.toml``; returns the checkpoint directory. ``UserError`` if the
    checkpoint is not a transformer's or the target cannot hold it.
    """
    optimizer_state = optimizer
    if optimizer_state not in ("fresh", "embedded"):
        raise UserError(f"optimizer must be 'fresh' or 'embedded', got {optimizer_state!r}")
    small_dir = Path(small_checkpoint_dir)
    if not (small_dir / "meta.json").exists():
        raise UserError(f"{small_dir} is not a checkpoint (no meta.json)")
    out_dir = Path(out_dir)
    _check_out_dir(out_dir, small_dir, force)
    # held from the checks to the rename: no other process writes --out meanwhile
    with files.folder_lock(out_dir, "embedded checkpoint"):
        _check_out_dir(out_dir, small_dir, force)
        return _embed(small_dir, out_dir, into, width_factor, extra_layers, optimizer_state)


_SHAPE_FIELDS = ("d_model", "n_heads", "n_layers", "d_inter")


def embedded_model_config(model_cfg, big, size_name: str | None):
    """The ``ModelConfig`` of the embedded model (``big``: its ``TransformerConfig``):
    ``size_name`` when a named size has its shape, else the small model's size with the
    large shape as overrides. ``sameloss plan`` names the shape it plans the same way."""
    if size_name is not None:  # a named size: no shape overrides
        return dataclasses.replace(model_cfg, size=size_name, **{n: None for n in _SHAPE_FIELDS})
    return dataclasses.replace(model_cfg, **{n: getattr(big, n) for n in _SHAPE_FIELDS})


def _embed(small_dir: Path, out_dir: Path, into: str | None, width_factor: int | None, extra_layers: int,
           optimizer_state: str) -> Path:
    small, language, cfg, small_meta = runio.load_checkpoint(small_dir)
    if cfg.model.kind != "transformer":
        raise UserError(f"only transformers can be embedded (App. B.4); {small_dir} holds a {cfg.model.kind}")
    plan, size_name = target_plan(check_embeddable(small), into, width_factor, extra_layers)
    large = embed(small, plan.width_factor, plan.extra_layers, plan.n_heads, plan.d_inter)
    big = large.config
    large_cfg = dataclasses.replace(cfg, model=embedded_model_config(cfg.model, big, size_name))
    # the config must rebuild exactly this model, as runio.load_checkpoint will
    # (built on the meta device: no memory, no initialisation, global RNG untouched)
    with torch.random.fork_rng(devices=[]), torch.device("meta"):
        rebuilt = runio.init_model(large_cfg, language, torch.device("meta"))
        optimizer, schedule = build_optimizer(large_cfg, rebuilt)
    want = {n: p.shape for n, p in large.state_dict().items()}
    if rebuilt.config != big or {n: p.shape for n, p in rebuilt.state_dict().items()} != want:
        raise RuntimeError(f"internal error: the config of the embedded model rebuilds {rebuilt.config}, not {big}")
    step = int(small_meta.get("step", 0))
    state = {"step": step, "optimizer": optimizer.state_dict(), "schedule": schedule.state_dict(),
             "rng": torch.get_rng_state(), "cuda_rng": None}
    if optimizer_state == "embedded":
        state.update(_embedded_optimizer_state(small, large, plan, cfg, large_cfg, small_dir))
    meta = {
        "config": configlib.to_dict(large_cfg),
        "eval": small_meta.get("eval"),
        "embedded_from": {
            "checkpoint": str(small_dir),
            "small_size": cfg.model.size,
            "small_shape": {n: getattr(small.config, n) for n in _SHAPE_FIELDS},
            "into": into,
            "width_factor": plan.width_factor,
            "extra_layers": plan.extra_layers,
            "d_inter": plan.d_inter,
            "n_heads": plan.n_heads,
            "construction": "App. B.4 replication: embeddings tiled, hidden weights (J/k)⊗W, LayerNorm "
                            "params tiled, decoder-input LayerNorm /k, identity blocks appended",
            "optimizer": optimizer_state,
        },
    }
    # built under a marked temporary sibling and renamed into place (files.building: a
    # full disk is one line and leaves nothing); an existing folder is replaced only when
    # _check_out_dir proved it an earlier embed's and --force was given
    replace = out_dir.exists() and not files.is_empty_dir(out_dir)
    with files.building(out_dir, replace=replace, what="embedded checkpoint") as tmp:
        files.mark(tmp, files.EMBEDDED_MARKER, f"sameloss embed of {small_dir}")
        ckpt.save(tmp, step, large, state, meta)
        files.atomic_write_text(tmp / "config.toml", f"{files.EMBEDDED_CONFIG_HEADER} {small_dir} (App. B.4)\n"
                                + configlib.to_toml(large_cfg))
    return ckpt.checkpoint_dir(out_dir, step)


def _embedded_optimizer_state(small, large, plan, cfg, large_cfg, small_dir: Path) -> dict:
    """The small checkpoint's optimiser state mapped onto the large model (module
    ``models.embed``: moments of gradients map as gradients, of squared gradients as their
    squares; entries of added blocks start at zero), its schedule and RNG state."""
    from ..models.embed import embed_gradient, embed_map, embed_second_moment
    from .objectives.sam import base_state

    saved = ckpt.load_state(small_dir)
    base, _ = build_optimizer(cfg, small)
    base.load_state_dict(base_state(saved["optimizer"]))  # (a SAM run's checkpoint: unwrapped)
    names = {id(p): n for n, p in small.named_parameters()}
    per_name = {names[id(p)]: st for p, st in base.state.items()}
    large_base, large_schedule = build_optimizer(large_cfg, large)
    m = embed_map(small, plan.width_factor, plan.extra_layers, plan.n_heads, plan.d_inter)
    shapes = {n: p.shape for n, p in large.named_parameters()}
    params = dict(large.named_parameters())
    keys = {k for st in per_name.values() for k in st}
    mapped = {}
    for key in keys:
        tensors = {n: per_name[n][key] for n in m.small_names}
        if key == "step":
            continue
        if key in ("exp_avg", "momentum_buffer"):
            mapped[key] = embed_gradient(m, tensors, shapes)
        elif key in ("exp_avg_sq", "max_exp_avg_sq"):
            mapped[key] = embed_second_moment(m, tensors, shapes)
        else:
            raise UserError(f"cannot embed the optimiser state {key!r} of {small_dir}; use a fresh optimiser")
    step_value = next(iter(per_name.values()))["step"] if per_name else None
    for n, p in params.items():
        st = {k: v[n].to(p.dtype) for k, v in mapped.items()}
        if step_value is not None:
            st["step"] = step_value.clone() if torch.is_tensor(step_value) else step_value
        large_base.state[p] = st
    large_schedule.load_state_dict(saved["schedule"])
    return {"optimizer": large_base.state_dict(), "schedule": large_schedule.state_dict(), "rng": saved["rng"],
            "cuda_rng": saved.get("cuda_rng")}


def _holds_run_or_checkpoint(folder: Path) -> bool:
    """Whether ``folder`` holds a training run or a checkpoint anywhere below it (an
    earlier embed's own checkpoint does not count)."""
    if files.is_run_dir(folder) or (folder / "meta.json").exists():
        return True
    if files.is_embedded_dir(folder):
        return any(True for _ in folder.rglob(files.RUN_MARKER)) or \
            any(files.is_run_dir(p.parent) for p in folder.rglob("config.toml"))
    return any(True for _ in folder.rglob("meta.json")) or any(True for _ in folder.rglob(files.RUN_MARKER))


def _check_out_dir(out_dir: Path, small_dir: Path, force: bool) -> None:
    """``UserError`` unless writing the embedded checkpoint to ``out_dir`` loses nothing."""
    resolved = out_dir.resolve()
    for folder in [resolved, *resolved.parents]:
        if folder.exists() and (files.is_run_dir(folder) or (folder / "meta.json").exists()):
            what = "a training run" if files.is_run_dir(folder) else "a checkpoint"
            where = "is" if folder == resolved else f"lies inside {folder}, which is"
            raise UserError(f"--out {out_dir} {where} {what}; embed never writes into a run: choose a new folder")
    if resolved == small_dir.resolve() or resolved in small_dir.resolve().parents:
        raise UserError(f"--out {out_dir} holds the checkpoint being embedded; choose a new folder")
    if not out_dir.exists():
        return
    if not out_dir.is_dir() or out_dir.is_symlink():
        raise UserError(f"--out {out_dir} exists and is not a folder; choose a new folder")
    if not any(out_dir.iterdir()):
        return
    if _holds_run_or_checkpoint(out_dir) and not files.is_embedded_dir(out_dir):
        raise UserError(f"--out {out_dir} holds a training run or checkpoint; embed never writes into a run: "
                        "choose a new folder")
    if not force:
        raise UserError(f"--out {out_dir} already exists; choose a new folder, or pass --force to replace an "
                        "earlier embed's output")
    if not files.is_embedded_dir(out_dir):
        raise UserError(f"--out {out_dir} was not written by sameloss embed (no {files.EMBEDDED_MARKER}); "
                        "--force replaces only an earlier embed's output: choose a new folder")
    runio.check_only_ours(out_dir, "--force")  # a user's notes put in the earlier output stay
