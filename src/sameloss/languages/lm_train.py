"""Generators and token pools for the causal language (``sameloss causal-lm``).

``train_generator(files, out, GeneratorTraining(vocab=K, size=S))`` (``sameloss causal-lm
train``), for users without OPT weights: trains a byte-level BPE (``tokenizers``) and a
small GPT-2-style model (``transformers.GPT2LMHeadModel`` from a config) on local text and
writes a normal Hugging Face folder (``save_pretrained`` + tokenizer files).
``CausalLM.from_pretrained`` reads it exactly as it reads a downloaded OPT-125M. Training:
documents joined into one token stream (``<|endoftext|>`` after each), random windows of
``context`` tokens drawn from a generator seeded by ``seed``, AdamW; the model's initial
weights are drawn under ``torch.manual_seed(seed)``, so a folder is a pure function of
(text, settings).

``write_pool(generator, out, k=K, length=T, n=N, seed=S)`` (``sameloss causal-lm
sample``) draws N sentences of the causal language by ancestral sampling and writes
``out/tokens.npy`` (language ids ``[N, T]``) and ``out/meta.json`` (the generator, K, T,
the allowed generator ids, the seed, sha256 of the tokens and of the generator's
weights). ``language.pool=POOL`` then makes pre-training draw its *training* sentences
by index from the pool (``CausalLM.sample_train``): the indices come from the step's
generator, so a batch is still a pure function of (seed, step). The pool holds samples
of the same joint, so the exact conditionals, the held-out evaluation (fresh ancestral
samples) and every measure are unchanged; the pool only saves the generator's
forward passes during training.
"""

from __future__ import annotations

import json
import math
import time
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..files import building, is_empty_dir
from ..files import sha256_of as _sha256
from ..libraries import quiet_transformers
from .lm_generated import POOL_META, POOL_TOKENS, SAMPLE_BLOCK, CausalLM
from .lm_generator import generator_shape, require_transformers
from .text import _gib

EOS = "<|endoftext|>"
# GPT-2-style shapes for generators trained here (n_embd, n_layer, n_head)
GENERATOR_SIZES = {"micro": (32, 1, 2), "tiny": (64, 2, 2), "small": (128, 4, 4)}
MIN_BPE_VOCAB = 257  # the 256 bytes + <|endoftext|>
# Memory a command may plan to use, refused beyond (with the estimate) before anything is
# allocated. A training step materialises its attention scores (batch x layers x heads x
# context^2, about 4 copies with softmax, dropout and gradients: measured 4.2 GB for the
# tiny generator at context 2048, batch 16) and its logits (3 copies of batch x context x
# vocab); 8 GiB is a third of this 24 GiB machine, and a step that size takes minutes on
# a CPU. GPT-2 itself trains with 1024 positions.
MAX_TRAIN_BYTES = 8 * 2**30
# Sampling holds the pool twice while it is drawn (float64 uniforms + int64 ids, 16 bytes
# a token) plus one block's KV cache and next-token probabilities: the same 8 GiB bound.
MAX_SAMPLE_BYTES = 8 * 2**30


def _new_folder(out) -> Path:
    """``out`` as a new folder to build (``files.building``): missing or empty."""
    out = Path(out)
    if out.is_symlink() or (out.exists() and not out.is_dir()):
        raise UserError(f"--out {out} is a file, not a folder; not overwriting it (choose a new --out)")
    if out.exists() and not is_empty_dir(out):
        raise UserError(f"{out} exists; not overwriting it (choose a new --out)")
    return out


def train_step_bytes(size: str, vocab: int, context: int, batch_size: int) -> int:
    """An estimate of the memory one training step of a generator takes (see
    ``MAX_TRAIN_BYTES``): attention scores, logits and per-layer activations."""
    d, layers, heads = GENERATOR_SIZES[size]
    tokens = batch_size * context
    attention = 4 * batch_size * layers * heads * context ** 2 * 4
    logits = 3 * tokens * vocab * 4
    activations = 24 * tokens * d * layers * 4
    params = 16 * (vocab * d + context * d + 12 * layers * d * d)  # weights, gradients, two AdamW moments
    return attention + logits + activations + params


def _check_lr(lr) -> None:
    if isinstance(lr, bool) or not isinstance(lr, (int, float)) or not math.isfinite(lr) or lr <= 0:
        raise UserError(f"--lr must be a finite number > 0, got {lr!r}")


def generator_config(size: str, vocab: int, positions: int, eos_id: int):
    """The ``GPT2Config`` of a named generator size."""
    if size not in GENERATOR_SIZES:
        raise UserError(f"unknown generator size {size!r}; choose from {', '.join(GENERATOR_SIZES)}")
    d, layers, heads = GENERATOR_SIZES[size]
    return require_transformers().GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=d, n_layer=layers,
                                             n_head=heads, bos_token_id=eos_id, eos_token_id=eos_id)


def train_bpe(documents: Sequence[str], vocab: int):
    """A byte-level BPE (GPT-2's scheme) with the one special token ``<|endoftext|>``."""
    from .text import _require_tokenizers

    tk = _require_tokenizers()
    from tokenizers import decoders, models, pre_tokenizers, processors, trainers

    if vocab < MIN_BPE_VOCAB:
        raise UserError(f"--vocab must be at least {MIN_BPE_VOCAB} for a byte-level BPE (256 bytes + {EOS})")
    tok = tk.Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    trainer = trainers.BpeTrainer(vocab_size=vocab, special_tokens=[EOS], show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator(documents, trainer=trainer)
    return tok


@dataclass(frozen=True)
class GeneratorTraining:
    """How ``train_generator`` trains (``sameloss causal-lm train``'s options): a BPE of
    ``vocab`` tokens, a model of ``size`` (``GENERATOR_SIZES``), ``steps`` AdamW steps at
    ``lr`` on ``batch_size`` random windows of ``context`` tokens, ``seed`` for the initial
    weights and the windows; ``doc_per`` splits the files into documents
    (``text.read_documents``)."""

    vocab: int = 1000
    size: str = "tiny"
    steps: int = 500
    batch_size: int = 16
    context: int = 64
    lr: float = 3e-3
    seed: int = 0
    doc_per: str = "line"


def train_generator(files: Sequence[str], out, training: GeneratorTraining = GeneratorTraining(), log=print) -> dict:
    """Train a BPE and a GPT-2-style model on ``files``; write the HF folder ``out``
    (``training.steps=0``: the model stays at its seeded initialisation)."""
    from .text import read_documents

    vocab, size, steps, batch_size, context, lr, seed = (training.vocab, training.size, training.steps,
                                                         training.batch_size, training.context, training.lr,
                                                         training.seed)
    out = _new_folder(out)
    if size not in GENERATOR_SIZES:
        raise UserError(f"unknown generator size {size!r}; choose from {', '.join(GENERATOR_SIZES)}")
    for label, value in (("steps", steps + 1), ("batch size", batch_size), ("context", context)):
        if value < 1:  # steps=0: the tokenizer and an untrained model of the size (a random generator)
            raise UserError(f"{label} must be positive, got {value}")
    _check_lr(lr)
    need = train_step_bytes(size, vocab, context, batch_size)
    if need > MAX_TRAIN_BYTES:
        raise UserError(f"a training step with --context {context}, --batch-size {batch_size}, --size {size} and "
                        f"--vocab {vocab} needs about {_gib(need)} (attention scores grow as context^2); the limit "
                        f"is {_gib(MAX_TRAIN_BYTES)}: use a shorter --context or a smaller --batch-size")
    transformers = require_transformers()
    documents = [d for f in files for d in read_documents(f, training.doc_per)]
    if not documents:
        raise UserError("the corpus has no text")
    tok = train_bpe(documents, vocab)
    eos = tok.token_to_id(EOS)
    ids = [np.asarray(e.ids + [eos], dtype=np.int64) for e in tok.encode_batch(documents)]
    stream = torch.from_numpy(np.concatenate(ids))
    if stream.numel() < context + 1:
        context = int(stream.numel()) - 1
        if context < 2:
            raise UserError("the corpus is too short to train a generator (fewer than 3 tokens)")
    n_vocab = tok.get_vocab_size()
    config = generator_config(size, n_vocab, max(context, 64) + 1, eos)
    torch.manual_seed(seed)
    with quiet_transformers(transformers):
        model = transformers.GPT2LMHeadModel(config)
    log(f"corpus: {len(documents)} documents, {stream.numel()} tokens; BPE vocabulary {n_vocab}; "
        f"model {size} ({sum(p.numel() for p in model.parameters())} parameters)")
    losses, every = _fit(model, stream, replace(training, context=context), log)  # context: as cut to the stream
    model.eval()
    bad = [name for name, p in model.named_parameters() if not torch.isfinite(p).all()]
    if bad:
        raise UserError(f"training diverged: parameter {bad[0]} is not finite after {steps} steps (--lr {lr}); "
                        "lower --lr. Nothing was written")
    record = {"files": [str(Path(f).resolve()) for f in files], "sources_sha256": [_sha256(Path(f)) for f in files],
              "vocab": n_vocab, "size": size, "steps": steps, "batch_size": batch_size, "context": context, "lr": lr,
              "seed": seed, "final_loss": sum(losses[-every:]) / len(losses[-every:]) if losses else None}
    with building(out, what="generator") as tmp, quiet_transformers(transformers):
        model.save_pretrained(str(tmp))
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS)
        fast.save_pretrained(str(tmp))
        (tmp / "sameloss-generator.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    return record


# Why not ``training/loop.py``: that loop trains a sameloss masked LM on fresh sentences of a
# ``Language`` drawn per step (exact conditionals, held-out exact KL, SAM, DDP) into a run
# folder it can resume bit for bit. A generator is a Hugging Face causal LM fitted to
# windows of one fixed token stream, with no language behind it yet (it is what makes
# one), no evaluation and no run folder: the folder is written once at the end and is a
# pure function of (text, arguments), rebuilt in seconds to minutes rather than resumed.
def _fit(model, stream: torch.Tensor, training: GeneratorTraining, log) -> tuple[list[float], int]:
    """AdamW on next-token cross-entropy over random ``context``-token windows of ``stream``
    (drawn from a generator seeded by ``seed``); the per-step losses, and how many steps
    one log line covers."""
    steps, batch_size, context, lr = training.steps, training.batch_size, training.context, training.lr
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(training.seed)
    model.train()
    start, every, losses = time.monotonic(), max(1, steps // 10), []
    for step in range(1, steps + 1):
        starts = torch.randint(stream.numel() - context, (batch_size,), generator=gen)
        batch = stream[starts[:, None] + torch.arange(context + 1)[None, :]]
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        if not torch.isfinite(loss.detach()):  # a diverged run is an error, not a generator
            raise UserError(f"training diverged: the loss is {float(loss.detach())} at step {step} of {steps} "
                            f"(--lr {lr}); lower --lr. Nothing was written")
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step % every == 0 or step == steps:
            log(f"step {step}/{steps}  loss {sum(losses[-every:]) / len(losses[-every:]):.4f}  "
                f"({time.monotonic() - start:.1f} s)")
    return losses, every


def _weights_sha256(folder: Path) -> str | None:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return _sha256(folder / name)
    return None


def write_pool(generator, out, k: int, length: int, n: int, seed: int = 0, device: str = "cpu",
               tokens=None) -> dict:
    """Sample ``n`` sentences of the causal language and write a pool folder ``out``."""
    out = _new_folder(out)
    for label, value in (("--n", n), ("--k", k), ("--length", length)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise UserError(f"{label} must be a positive integer, got {value!r}")
    shape = generator_shape(generator)  # the config alone: checked before the weights load
    if length + 1 > shape["positions"]:
        raise UserError(f"--length {length} + the bos token exceeds the generator's {shape['positions']} positions "
                        f"(at most --length {shape['positions'] - 1})")
    block = min(n, SAMPLE_BLOCK)
    need = 16 * n * length + block * length * shape["layers"] * 2 * shape["hidden"] * 4 + 2 * block * shape["vocab"] * 8
    if need > MAX_SAMPLE_BYTES:
        raise UserError(f"sampling --n {n} sentences of --length {length} from this generator needs about {_gib(need)} "
                        f"(16 bytes a token, and a KV cache of {min(n, SAMPLE_BLOCK)} sentences); the limit is "
                        f"{_gib(MAX_SAMPLE_BYTES)}: write several smaller pools or a shorter --length")
    lm = CausalLM.from_pretrained(generator, k=k, length=length, tokens=tokens, device=device)
    sentences = lm.sample(n, torch.Generator().manual_seed(seed)).tokens.numpy()
    dtype = np.uint16 if k <= np.iinfo(np.uint16).max else np.int32
    with building(out, what="token pool") as tmp:
        np.save(tmp / POOL_TOKENS, sentences.astype(dtype))
        meta = {"format": 1, "generator": str(Path(generator).resolve()),
                "generator_sha256": _weights_sha256(Path(generator)), "k": k, "length": length, "n": n, "seed": seed,
                "tokens": lm.tokens.tolist(), "tokens_sha256": _sha256(tmp / POOL_TOKENS)}
        (tmp / POOL_META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta
