"""Sentences in, translations out: tokenize, batch by tokens, search, detokenize, restore order.

``Translator.from_dir(path)`` loads a translation model directory (``model_dir.py``); a training
loop can build one from the model and tokenizers it holds (``Translator(model, src_tok, tgt_tok)``)
to translate a validation set. Sources are encoded as the data module batches them for training
(``ids + [eos]``); the decoder starts from ``config.bos_id``. Blank lines are not decoded: they
translate to the empty string, so output line i always belongs to input line i.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable, Sequence

import torch
from torch import nn

from aiayn.data.batching import TokenBatchSampler, pad_rows
from aiayn.data.tokenizer import Tokenizer
from aiayn.decoding.bidirectional import adapter_for_translation
from aiayn.decoding.bleu import bleu
from aiayn.decoding.mbr import mbr_order
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.sampling import occurrences, sentence_streams
from aiayn.decoding.scoring import Hypothesis
from aiayn.decoding.search import search
from aiayn.errors import ConfigError, DataError, ModelDirError
from aiayn.interop.model_dir import load_translation_dir, model_meta
from aiayn.models.ensemble import Ensemble

DEFAULT_MAX_SRC_LEN = 1024  # source tokens (eos included) for sinusoidal models, which have no limit
DEFAULT_MAX_TOKENS = 4096  # source tokens per batch, padding included


def one_line(text: str) -> str:
    """A translation as one line of an output file, whatever pieces the model wrote: byte-fallback
    pieces decode to any character, and a line break (``<0x0A>``, ``<0x0D>``, or any separator that
    ``str.splitlines`` honours) would shift every later output line against its source; a tab would
    split ``--show-r2l``'s two columns. Each becomes a space."""
    return " ".join(text.replace("\t", " ").splitlines())


def language_pair(directory: str | os.PathLike) -> tuple[str, str]:
    """The ``(src_lang, tgt_lang)`` a model directory records ("" where it records none)."""
    meta = model_meta(directory)
    return tuple(meta.get(k) if isinstance(meta.get(k), str) else "" for k in ("src_lang", "tgt_lang"))


class Translator:
    """A translation model with its tokenizers.

    ``max_src_len`` (tokens, eos included) is ``config.max_len`` for learned positions — the most
    the model can read — and ``DEFAULT_MAX_SRC_LEN`` (or the argument) for sinusoidal ones.
    """

    def __init__(
        self,
        model: nn.Module,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        max_src_len: int | None = None,
        reverse: bool = False,
        r2l_beam: int | None = None,
        tgt_lang: str = "",
    ):
        self.model = model.eval()
        self.tgt_lang = tgt_lang  # how minimum Bayes risk's BLEU tokenizes (sacreBLEU's, "": 13a)
        self.reverse = reverse  # the model writes the target right to left (trained with reverse_target)
        # a bidirectional model trained on cached translations: the right-to-left search that made them,
        # which decoding uses for the memory unless a SearchConfig says r2l_beam
        self.r2l_beam = r2l_beam
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        c = model.config
        if c.r2l_memory and not c.bidirectional:
            raise ConfigError("this model's decoder reads a right-to-left memory that only its caller gives "
                              "(model.r2l_memory, the tutorial's module); aiayn decodes models trained with "
                              "model.bidirectional=true, which make their own")  # fmt: skip
        learned = c.positional == "learned"
        if max_src_len is not None and (isinstance(max_src_len, bool) or max_src_len < 2):
            raise ConfigError(f"max_src_len={max_src_len} must leave room for a token and eos (≥ 2)")
        self.max_src_len = min(max_src_len or c.max_len, c.max_len) if learned else max_src_len
        self.max_src_len = self.max_src_len or DEFAULT_MAX_SRC_LEN
        self.max_tgt_len = c.max_len if learned else None  # decoder positions: bos + output - 1
        if self.max_src_len < 2:
            raise ConfigError(f"max_src_len={self.max_src_len} must leave room for a token and eos")

    @classmethod
    def from_dir(
        cls, directory: str | os.PathLike, device: str | torch.device = "cpu", max_src_len: int | None = None
    ) -> Translator:
        model, src_tok, tgt_tok = load_translation_dir(directory, device)
        meta = model_meta(directory)
        b = meta.get("r2l_beam")
        r2l_beam = b if type(b) is int and b >= 1 else None
        lang = meta.get("tgt_lang") if isinstance(meta.get("tgt_lang"), str) else ""
        return cls(model, src_tok, tgt_tok, max_src_len, meta.get("reverse_target") is True, r2l_beam, lang)

    @classmethod
    def from_dirs(
        cls,
        directories: Sequence[str | os.PathLike],
        device: str | torch.device = "cpu",
        max_src_len: int | None = None,
    ) -> Translator:
        """One model directory (``from_dir``), or an ``Ensemble`` of several that were trained with
        the same tokenizers, for the same language pair where their directories name it, and read the
        target in the same direction (``ModelDirError`` naming the first that does not: a joint
        vocabulary can be the same file in both directions). Bidirectional members decode their
        memories with the first member's right-to-left beam (``r2l_beam``) unless the search config
        gives one."""
        first = cls.from_dir(directories[0], device, max_src_len)
        if len(directories) == 1:
            return first
        vocabularies = [t.model_bytes() for t in (first.src_tokenizer, first.tgt_tokenizer)]
        members, pair = [first.model], language_pair(directories[0])
        for d in directories[1:]:
            other = cls.from_dir(d, device, max_src_len)
            theirs = language_pair(d)
            if any(a and b and a != b for a, b in zip(pair, theirs)):
                raise ModelDirError(f"{d}: it translates {'→'.join(theirs)}, {directories[0]} "
                                    f"{'→'.join(pair)}; ensemble models of one language pair")  # fmt: skip
            if [t.model_bytes() for t in (other.src_tokenizer, other.tgt_tokenizer)] != vocabularies:
                raise ModelDirError(f"{d}: its tokenizers differ from those of {directories[0]}; an "
                                    "ensemble's models must be trained with the same tokenizers")  # fmt: skip
            if other.reverse != first.reverse:
                raise ModelDirError(f"{d}: it writes the target in the other direction than {directories[0]} "
                                    "(reverse_target); ensemble models of one direction")  # fmt: skip
            members.append(other.model)
        return cls(Ensemble(members), first.src_tokenizer, first.tgt_tokenizer, max_src_len, first.reverse,
                   first.r2l_beam, first.tgt_lang)  # fmt: skip

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def encode(self, lines: Sequence[str], strict: bool = False) -> tuple[list[list[int]], list[int]]:
        """Source ids per line (``[]`` for a blank line), and the indices of lines cut to fit.

        A line longer than ``max_src_len`` tokens (eos included) is truncated, or is a ``DataError``
        naming it (1-based) when ``strict``.
        """
        sources, cut = [], []
        keep = self.max_src_len - 1  # room for eos
        for i, (line, ids) in enumerate(zip(lines, self.src_tokenizer.encode_batch(list(lines)))):
            if not line.strip():
                ids = []
            elif len(ids) > keep:
                if strict:
                    raise DataError(
                        f"line {i + 1} has {len(ids) + 1} source tokens, over the maximum of "
                        f"{self.max_src_len} (max_src_len); shorten it, or truncate it (strict=False)"
                    )
                cut.append(i)
                ids = ids[:keep]
            sources.append(ids)
        return sources, cut

    def resolved(self, config: SearchConfig) -> SearchConfig:
        """``config`` as this translator searches with it: a bidirectional model's memories built with
        the right-to-left beam it recorded (its cache's search) where ``config`` gives none."""
        if config.r2l_beam is None and self.r2l_beam is not None:
            return dataclasses.replace(config, r2l_beam=self.r2l_beam)
        return config

    def search(
        self,
        sources: Sequence[list[int]],
        config: SearchConfig,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        repeats: Sequence[int] | None = None,
    ) -> list[list[Hypothesis]]:
        """Hypotheses for encoded sources (``encode``), batched by source tokens; [] for blank ones.
        With ``config.seed`` each sentence's samples are drawn from streams of its own, seeded by the seed,
        its ids and ``repeats`` (how many times they came before it: ``sampling.occurrences`` of
        ``sources``, or a caller's count over a whole file or request), so that a text gives the same
        samples in any batch (``sampling.sentence_streams``); without a seed, from torch's global RNG.

        Sentences are sorted by length so that a batch has little padding; each batch holds at
        most ``max_tokens`` source tokens, padding included (more for a single longer sentence).
        With ``config.mbr`` the search keeps all ``beam`` hypotheses and returns the ``nbest`` with
        the highest expected utility (``mbr.py``), best first; each keeps the model's own score.
        """
        if isinstance(max_tokens, bool) or not isinstance(max_tokens, int) or max_tokens < 1:
            raise ConfigError(f"max_tokens={max_tokens!r} must be ≥ 1 (source tokens per batch)")
        vocab = self.model.config.tgt_vocab_size
        if not config.sample and config.beam > vocab:  # before a (beam · vocabulary) step is allocated
            raise ConfigError(f"beam={config.beam} exceeds the vocabulary ({vocab} tokens); use less")
        if config.mbr == "bleu":
            bleu(self.tgt_lang)  # a tokenizer it lacks (MeCab's) is an error now, not after the search
        if config.mbr:
            beam = self.search(sources, dataclasses.replace(config, mbr=None, nbest=config.beam), max_tokens)
            texts = [[self.detokenize(h) for h in hyps] for hyps in beam]
            order = [mbr_order(t, config.mbr, self.tgt_lang) for t in texts]
            return [[hyps[i] for i in o][: config.nbest] for hyps, o in zip(beam, order)]
        config = self.resolved(config)
        if repeats is None:  # only seeded sampling reads them
            seeded = config.sample and config.seed is not None
            repeats = occurrences(sources) if seeded else [0] * len(sources)
        results: list[list[Hypothesis]] = [[] for _ in sources]
        todo = [i for i, s in enumerate(sources) if s]
        if not todo:
            return results
        lengths = [len(sources[i]) for i in todo]  # the sampler adds eos
        sampler = TokenBatchSampler(lengths, lengths, max(max_tokens, max(lengths) + 1), shuffle=False)
        for batch in sampler.global_batches(0):
            index = [todo[j] for j in batch]
            src, limits = self.batch([sources[i] for i in index], config)
            adapter = adapter_for_translation(self.model, config, limits)
            streams = sentence_streams(config, [sources[i] for i in index], [repeats[i] for i in index])
            hyps = search(adapter, src, config, limits, streams=streams)
            backward = getattr(adapter, "r2l_hypotheses", None)  # a bidirectional model's memory
            for row, (i, h) in enumerate(zip(index, hyps)):
                if backward is not None:
                    for hyp in h:
                        hyp.r2l = backward[row][0]
                results[i] = h
        return results

    def batch(self, sources: Sequence[list[int]], config: SearchConfig) -> tuple[torch.Tensor, torch.Tensor]:
        """Non-blank encoded sources as the model reads them, and each one's limit on output tokens.

        Shape: B sources -> src (B, S) right-padded ids + eos, on the model's device; limits (B,)
        """
        c = self.model.config
        src = torch.full((len(sources), max(map(len, sources)) + 1), c.pad_id, dtype=torch.long)
        for r, ids in enumerate(sources):
            src[r, : len(ids) + 1] = torch.tensor([*ids, c.eos_id])
        limits = torch.tensor([config.output_limit(len(ids)) for ids in sources])
        if self.max_tgt_len is not None:
            limits = limits.clamp(max=self.max_tgt_len)
        return src.to(self.device), limits

    def detokenize(self, hyp: Hypothesis) -> str:
        return one_line(self.tgt_tokenizer.decode(self.forward_order(hyp.tokens)))

    def detokenize_r2l(self, hyp: Hypothesis) -> str:
        """A bidirectional model's right-to-left translation that ``hyp`` read, left to right; ""
        for a hypothesis of any other model."""
        if hyp.r2l is None:
            return ""
        return one_line(
            self.tgt_tokenizer.decode([t for t in hyp.r2l.tokens if t != self.model.config.eos_id][::-1])
        )

    def forward_order(self, tokens: Sequence[int]) -> list[int]:
        """A hypothesis's tokens left to right, eos dropped (reversed for a right-to-left model)."""
        tokens = [t for t in tokens if t != self.model.config.eos_id]
        return tokens[::-1] if self.reverse else tokens

    @torch.no_grad()
    def log_probs(
        self,
        sources: Sequence[list[int]],
        targets: Sequence[list[int]],
        complete: Sequence[bool] | None = None,
    ) -> list[float]:
        """Σ log p(target (+ eos) | source) under this model, teacher-forced, for left-to-right
        ``targets`` (a right-to-left model reads them reversed). eos is scored where ``complete``
        (default: everywhere); a search hypothesis cut at the length limit has none. Batches of 64.

        Shape: N sources and N targets (ids, no specials) -> N floats
        """
        c, out = self.model.config, []
        if c.bidirectional:
            raise ConfigError(
                "scoring with a bidirectional model is not supported; use a plain or right-to-left one"
            )
        complete = [True] * len(targets) if complete is None else list(complete)
        for start in range(0, len(sources), 64):
            part = slice(start, start + 64)
            src_rows = [list(s)[: self.max_src_len - 1] for s in sources[part]]
            tgt_rows = [(list(t)[::-1] if self.reverse else list(t)) + [c.eos_id] * end
                        for t, end in zip(targets[part], complete[part], strict=True)]  # fmt: skip
            src = pad_rows(src_rows, c.pad_id, last=c.eos_id).to(self.device)
            tgt_out = pad_rows(tgt_rows, c.pad_id).to(self.device)
            tgt_in = torch.cat([torch.full_like(tgt_out[:, :1], c.bos_id), tgt_out[:, :-1]], 1)
            tgt_in = tgt_in.masked_fill(tgt_out == c.pad_id, c.pad_id)
            lp = self.model(src, tgt_in).float().log_softmax(-1)  # (B, T, V)
            picked = lp.gather(-1, tgt_out.unsqueeze(-1)).squeeze(-1).masked_fill(tgt_out == c.pad_id, 0.0)
            out += picked.sum(1).tolist()
        return out

    def translate(
        self,
        lines: Sequence[str],
        config: SearchConfig | None = None,
        max_tokens: int = DEFAULT_MAX_TOKENS,
        warn: Callable[[str], None] | None = None,
        search_fn: Callable[..., list[list[Hypothesis]]] | None = None,
    ) -> list[str]:
        """The best translation of every line (``""`` for a blank line); long lines are truncated
        with a warning (``warn``, default ``warnings.warn``). ``search_fn(sources, config, max_tokens)``
        replaces ``self.search`` (e.g. ``rerank.reranked_search``)."""
        sources, cut = self.encode(lines)
        for i in cut:
            (warn or warnings.warn)(f"line {i + 1} truncated to {self.max_src_len} source tokens")
        nbest = (search_fn or self.search)(sources, config or SearchConfig(), max_tokens)
        return [self.detokenize(h[0]) if h else "" for h in nbest]
