"""Right-to-left translations of a training corpus, made once and cached (``r2l_memory_from="cache"``).

ABDNMT-Transformer (Su et al. 2019) trains its bidirectional decoder on a third file: a right-to-left
translation of every training source by a separately trained right-to-left model, made before training,
so that a training step costs one teacher-forced pass more than a plain one instead of a search.
``pseudo_targets`` makes that file for an encoded corpus: each source through a model trained with
``reverse_target=true``, by greedy or beam search, the best hypothesis kept in the model's own
(right-to-left) order, eos dropped, at most ``R2L_MARGIN`` tokens longer than its source (``memory_search``,
which decoding repeats: a weak model's runaway repetitions would otherwise fill the cache with
sequences 50 tokens longer than their sources, each padding its whole batch). With two models (a
jackknife: trained with ``train_half=1`` and ``train_half=2``) each translates only the pairs of the
half it did not train on, so that no cached translation comes from a model that saw its pair: a small
model nearly learns its training set by heart, and a left-to-right decoder trained on such memories
would trust them more than the memory it gets at test time.

The result is cached beside the encoded corpora (``aiayn.data.cache.cache_sequences``), keyed by the
encoded corpus (its text, tokenizers and filter), each model's weights (SHA-256 of the safetensors file)
and half, and the search: a second run reuses it; a retrained model or another corpus makes a new one.
"""

from __future__ import annotations

import dataclasses
import hashlib
import os
import sys
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from aiayn.data.cache import EncodedParallel, EncodedSequences, cache_sequences
from aiayn.data.files import record_file
from aiayn.data.tokenizer import Tokenizer
from aiayn.data.views import halves
from aiayn.decoding.bidirectional import R2L_MARGIN, memory_search
from aiayn.decoding.translator import Translator
from aiayn.errors import ConfigError
from aiayn.interop.model_dir import load_translation_dir, model_meta
from aiayn.models.bidirectional import BidirectionalTransformer
from aiayn.models.io import WEIGHTS_FILE, load_model, resolve_model_dir
from aiayn.textfiles import absent

CHUNK = 2048  # sources per chunk written (and per progress line)


def fingerprint(directory: str | os.PathLike) -> dict:
    """What identifies a right-to-left model for the cache: its weights' SHA-256 and its half. The
    weights count among the files a run reads (``record_file``): a run resumed after that model was
    retrained (a run directory's ``best`` moved) would train on other translations, and is refused."""
    h, weights = hashlib.sha256(), Path(directory) / WEIGHTS_FILE
    with open(weights, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    record_file(weights, h.hexdigest())
    return {"weights": h.hexdigest(), "train_half": train_half(directory)}


def train_half(directory: str | os.PathLike) -> int:
    """The half of the training pairs a jackknife's model trained on (``train_half``; 0 = all)."""
    return int(model_meta(directory).get("train_half", 0))


def load_r2l_models(paths: Sequence[str | os.PathLike]) -> tuple[list[Path], list[Translator]]:
    """The model directories (a run directory means its best checkpoint) and their translators;
    ``ConfigError`` naming the one that is not a right-to-left model, or a jackknife that is not one
    model per half, or two models with different vocabularies."""
    dirs = [resolve_model_dir(p) for p in paths]
    translators = []
    for given, d in zip(paths, dirs):
        if not (d / WEIGHTS_FILE).is_file():
            raise ConfigError(
                f"r2l_model={str(given)!r}: no model there ({d / WEIGHTS_FILE} {absent(d / WEIGHTS_FILE)})"
            )
        t = Translator.from_dir(d)
        if not t.reverse:
            raise ConfigError(f"r2l_model={str(given)!r} writes left to right: train it with "
                              "reverse_target=true")  # fmt: skip
        translators.append(t)
    if len(dirs) == 2:
        found = sorted(train_half(d) for d in dirs)
        if found != [1, 2]:
            raise ConfigError(f"a jackknifed cache needs one model trained with train_half=1 and one with "
                              f"train_half=2; these were trained with train_half={found}")  # fmt: skip
        if translators[0].tgt_tokenizer.model_bytes() != translators[1].tgt_tokenizer.model_bytes():
            raise ConfigError("r2l_model and r2l_jackknife have different vocabularies: train both on "
                              "the same training set (train_half picks pairs after the tokenizer is "
                              "trained)")  # fmt: skip
    return dirs, translators


def translator_of(corpus: EncodedParallel, dirs: Sequence[Path]) -> np.ndarray:
    """(N,) which model translates each pair: the only one, or the one not trained on its half."""
    if len(dirs) == 1:
        return np.zeros(len(corpus), np.int64)
    trained_on = [train_half(d) for d in dirs]  # 1 or 2 each
    return np.where(halves(corpus) == trained_on[0], 1, 0)


def pseudo_targets(
    corpus: EncodedParallel,
    paths: Sequence[str | os.PathLike],
    beam: int = 1,
    max_tokens: int = 4096,
    cache: str | os.PathLike | None = None,
) -> EncodedSequences:
    """The right-to-left translation of every source of ``corpus`` (ids, right to left, no eos), by
    the model at ``paths[0]`` or, given two, jackknifed (``translator_of``); read from the cache
    when these models already translated this corpus with this search."""
    dirs, translators = load_r2l_models(paths)
    key = {"corpus": corpus.directory.name, "models": [fingerprint(d) for d in dirs], "beam": beam,
           "max_len_b": R2L_MARGIN}  # fmt: skip
    who = translator_of(corpus, dirs)
    search, c = memory_search(beam), translators[0].model.config
    if c.positional == "learned":  # [bos] + a translation cut at its limit (no eos) fits the positions,
        search = dataclasses.replace(search, max_len_cap=c.max_len - 1)  # as decoding's memory does
        key["max_len_cap"] = search.max_len_cap

    def make() -> Iterator[list[list[int]]]:
        t0, n = time.perf_counter(), len(corpus)
        for start in range(0, n, CHUNK):
            rows = range(start, min(start + CHUNK, n))
            out: list[list[int]] = [[] for _ in rows]
            for k, t in enumerate(translators):
                mine = [i for i in rows if who[i] == k]
                hyps = t.search([corpus.src[i].tolist() for i in mine], search, max_tokens)
                eos = t.model.config.eos_id
                for i, h in zip(mine, hyps):
                    out[i - start] = [tok for tok in h[0].tokens if tok != eos] if h else []
            print(f"r2l cache: {rows.stop}/{n} sources translated ({time.perf_counter() - t0:.0f} s)",
                  file=sys.stderr, flush=True)  # fmt: skip
            yield out

    vocab = translators[0].model.config.tgt_vocab_size
    return cache_sequences(f"r2l-{corpus.meta['name']}", key, vocab, make, cache)


def r2l_tokenizers(path: str | os.PathLike, lowercase: bool) -> tuple[Tokenizer, Tokenizer]:
    """The right-to-left model's tokenizers, which a run reading its translations must use;
    ``ConfigError`` when the run asks for the other case than that vocabulary has."""
    _, src_tok, tgt_tok = load_translation_dir(path)
    if tgt_tok.lowercase != lowercase:
        fix = str(tgt_tok.lowercase).lower()
        raise ConfigError(f"lowercase={str(lowercase).lower()} but r2l_model={str(path)!r} has a vocabulary "
                          f"with lowercase={fix}: set lowercase={fix}")  # fmt: skip
    return src_tok, tgt_tok


def init_from_r2l(model: BidirectionalTransformer, path: str | os.PathLike, freeze: bool = False) -> None:
    """Copy the right-to-left model's encoder, embeddings and output layer into ``model``, and its
    decoder into ``model.r2l_decoder`` (the left-to-right decoder, with its extra sublayer, starts
    fresh); with ``freeze`` the right-to-left decoder is not trained further."""
    r2l = load_model(resolve_model_dir(path))
    shape = ("d_model", "n_heads", "d_ff", "n_encoder_layers", "n_decoder_layers")
    if any(getattr(r2l.config, f) != getattr(model.config, f) for f in shape):
        raise ConfigError(f"r2l_init: r2l_model={str(path)!r} has another shape (d_model, layers) than "
                          "[model]: give [model] its shape, or r2l_init=false")  # fmt: skip
    state = {}  # the left-to-right model's decoder becomes the right-to-left decoder
    for name, tensor in r2l.state_dict().items():
        state[("r2l_" + name) if name.startswith("decoder.") else name] = tensor
    missing, unexpected = model.load_state_dict(state, strict=False)
    if unexpected or any(not k.startswith("decoder.") for k in missing):
        raise ConfigError(f"r2l_init: r2l_model={str(path)!r} does not fit [model] (missing "
                          f"{[k for k in missing if not k.startswith('decoder.')][:3]}, unexpected "
                          f"{unexpected[:3]}): give [model] the right-to-left model's fields")  # fmt: skip
    for p in model.r2l_decoder.parameters() if freeze else ():
        p.requires_grad_(False)
