"""Generators and token pools for the causal language (``sameloss causal-lm``).

``train_generator(files, out, vocab=K, size=S)`` (``sameloss causal-lm train``), for users
without OPT weights: trains a byte-level BPE (``tokenizers``) and a small GPT-2-style
model (``transformers.GPT2LMHeadModel`` from a config) on local text and writes a normal
Hugging Face folder (``save_pretrained`` + tokenizer files). ``CausalLM.from_pretrained``
reads it exactly as it reads a downloaded OPT-125M. Training: documents joined into one
token stream (``<|endoftext|>`` after each), random windows of ``context`` tokens drawn
from a generator seeded by ``seed``, AdamW; the model's initial weights are drawn under
``torch.manual_seed(seed)``, so a folder is a pure function of (text, arguments).

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

import contextlib
import json
import time
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch

from ..errors import UserError
from ..files import sha256_of as _sha256
from .lm_generated import POOL_META, POOL_TOKENS, CausalLM, _transformers

EOS = "<|endoftext|>"
# GPT-2-style shapes for generators trained here (n_embd, n_layer, n_head)
GENERATOR_SIZES = {"micro": (32, 1, 2), "tiny": (64, 2, 2), "small": (128, 4, 4)}
MIN_BPE_VOCAB = 257  # the 256 bytes + <|endoftext|>


def _new_folder(out) -> Path:
    out = Path(out)
    if out.exists() or out.is_symlink():
        raise UserError(f"{out} exists; not overwriting it (choose a new --out)")
    return out


@contextlib.contextmanager
def _quiet_hf(transformers):
    """No weight-writing bars or config notices from transformers in our output."""
    hf_logging = transformers.utils.logging
    bar, level = hf_logging.is_progress_bar_enabled(), hf_logging.get_verbosity()
    hf_logging.disable_progress_bar()
    hf_logging.set_verbosity_error()
    try:
        yield
    finally:
        hf_logging.set_verbosity(level)
        if bar:
            hf_logging.enable_progress_bar()


def generator_config(size: str, vocab: int, positions: int, eos_id: int):
    """The ``GPT2Config`` of a named generator size."""
    if size not in GENERATOR_SIZES:
        raise UserError(f"unknown generator size {size!r}; choose from {', '.join(GENERATOR_SIZES)}")
    d, layers, heads = GENERATOR_SIZES[size]
    return _transformers().GPT2Config(vocab_size=vocab, n_positions=positions, n_embd=d, n_layer=layers, n_head=heads,
                                      bos_token_id=eos_id, eos_token_id=eos_id)


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


def train_generator(files: Sequence[str], out, vocab: int = 1000, size: str = "tiny", steps: int = 500,
                    batch_size: int = 16, context: int = 64, lr: float = 3e-3, seed: int = 0,
                    doc_per: str = "line", log=print) -> dict:
    """Train a BPE and a GPT-2-style model on ``files``; write the HF folder ``out``
    (``steps=0``: the model stays at its seeded initialisation)."""
    from .text import read_documents

    out = _new_folder(out)
    if size not in GENERATOR_SIZES:
        raise UserError(f"unknown generator size {size!r}; choose from {', '.join(GENERATOR_SIZES)}")
    for label, value in (("steps", steps + 1), ("batch size", batch_size), ("context", context)):
        if value < 1:  # steps=0: the tokenizer and an untrained model of the size (a random generator)
            raise UserError(f"{label} must be positive, got {value}")
    transformers = _transformers()
    documents = [d for f in files for d in read_documents(f, doc_per)]
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
    with _quiet_hf(transformers):
        model = transformers.GPT2LMHeadModel(config)
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.01)
    gen = torch.Generator().manual_seed(seed)
    log(f"corpus: {len(documents)} documents, {stream.numel()} tokens; BPE vocabulary {n_vocab}; "
        f"model {size} ({sum(p.numel() for p in model.parameters())} parameters)")
    model.train()
    start, every, losses = time.monotonic(), max(1, steps // 10), []
    for step in range(1, steps + 1):
        starts = torch.randint(stream.numel() - context, (batch_size,), generator=gen)
        batch = stream[starts[:, None] + torch.arange(context + 1)[None, :]]
        logits = model(input_ids=batch[:, :-1]).logits
        loss = torch.nn.functional.cross_entropy(logits.reshape(-1, logits.shape[-1]), batch[:, 1:].reshape(-1))
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        losses.append(float(loss.detach()))
        if step % every == 0 or step == steps:
            log(f"step {step}/{steps}  loss {sum(losses[-every:]) / len(losses[-every:]):.4f}  "
                f"({time.monotonic() - start:.1f} s)")
    model.eval()
    out.mkdir(parents=True)
    with _quiet_hf(transformers):
        model.save_pretrained(str(out))
        fast = transformers.PreTrainedTokenizerFast(tokenizer_object=tok, bos_token=EOS, eos_token=EOS, unk_token=EOS)
        fast.save_pretrained(str(out))
    record = {"files": [str(Path(f).resolve()) for f in files], "sources_sha256": [_sha256(Path(f)) for f in files],
              "vocab": n_vocab, "size": size, "steps": steps, "batch_size": batch_size, "context": context, "lr": lr,
              "seed": seed, "final_loss": sum(losses[-every:]) / len(losses[-every:]) if losses else None}
    (out / "sameloss-generator.json").write_text(json.dumps(record, indent=2), encoding="utf-8")
    return record


def _weights_sha256(folder: Path) -> str | None:
    for name in ("model.safetensors", "pytorch_model.bin"):
        if (folder / name).is_file():
            return _sha256(folder / name)
    return None


def write_pool(generator, out, k: int, length: int, n: int, seed: int = 0, device: str = "cpu",
               tokens=None) -> dict:
    """Sample ``n`` sentences of the causal language and write a pool folder ``out``."""
    out = _new_folder(out)
    if n < 1:
        raise UserError(f"--n must be positive, got {n}")
    lm = CausalLM.from_pretrained(generator, k=k, length=length, tokens=tokens, device=device)
    sentences = lm.sample(n, torch.Generator().manual_seed(seed)).tokens.numpy()
    dtype = np.uint16 if k <= np.iinfo(np.uint16).max else np.int32
    out.mkdir(parents=True)
    np.save(out / POOL_TOKENS, sentences.astype(dtype))
    meta = {"format": 1, "generator": str(Path(generator).resolve()), "generator_sha256": _weights_sha256(Path(generator)),
            "k": k, "length": length, "n": n, "seed": seed, "tokens": lm.tokens.tolist(),
            "tokens_sha256": _sha256(out / POOL_TOKENS)}
    (out / POOL_META).write_text(json.dumps(meta, indent=2), encoding="utf-8")
    return meta
