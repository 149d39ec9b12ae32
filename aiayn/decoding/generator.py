"""A prompt in, continuations out, for a decoder-only ``LanguageModel``.

``Generator.from_dir(path)`` loads a language-model directory (``model_dir.py``); a training loop
can build one from the model and tokenizer it holds to print samples. The prompt is encoded as
the data module feeds LM training (content ids, no bos), so it must not be empty.

The model reads at most its *context*: the positions it was trained on (``trained_max_len``, the
run's ``block_size``; for learned positions never more than ``max_len``). A longer text is cut to
its last ``context`` tokens before each step, as nanoGPT samples (``LMAdapter``'s ``window``), so
a continuation may be as long as asked, while no token is read at a position it never trained.
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import torch
from torch import nn

from aiayn.data.tokenizer import Tokenizer
from aiayn.decoding.adapters import LMAdapter
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis
from aiayn.decoding.search import search
from aiayn.errors import ConfigError, ModelDirError
from aiayn.interop.model_dir import load_lm_dir


class Generator:
    """A language model with its tokenizer; ``trained_max_len``: the context it was trained on
    (None: unknown, as for a run saved before it was recorded); ``never``: ids it never had as
    targets (``untrained_ids``, which an LM run records: bos, unk and eos are not in its text), which
    it therefore never emits: it continues for as many tokens as asked."""

    def __init__(
        self,
        model: nn.Module,
        tokenizer: Tokenizer,
        trained_max_len: int | None = None,
        never: tuple[int, ...] = (),
    ):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.context = context(model.config, trained_max_len)
        self.never = never

    @classmethod
    def from_dir(cls, directory: str | os.PathLike, device: str | torch.device = "cpu") -> Generator:
        model, tokenizer, meta = load_lm_dir(directory, device)
        trained, untrained = meta.get("trained_max_len"), meta.get("untrained_ids")
        if trained is not None and not (isinstance(trained, int) and trained >= 1):
            raise ModelDirError(f"{directory}: config.json's trained_max_len={trained!r} is not a positive "
                                "number of tokens; correct it, or remove it")  # fmt: skip
        vocab = model.config.vocab_size
        if untrained is not None and not (
            isinstance(untrained, list) and all(isinstance(i, int) and 0 <= i < vocab for i in untrained)
        ):
            raise ModelDirError(f"{directory}: config.json's untrained_ids are not ids of its {vocab}-token "
                                "vocabulary; correct them, or remove them")  # fmt: skip
        return cls(model, tokenizer, trained, tuple(untrained or ()))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def adapter(self, use_cache: bool = True) -> LMAdapter:
        """The search's view of the model, reading at most ``context`` tokens."""
        return LMAdapter(self.model, use_cache, window=self.context, never=self.never)

    def encode(self, prompt: str) -> list[int]:
        """The prompt's ids; an empty prompt is an error (the model predicts from a token), and so is
        one with characters the vocabulary lacks (a character-level model's: read as unknown, an
        input the model never trained on, while the prompt printed back would show them)."""
        tok = self.tokenizer
        ids = tok.encode(prompt)
        if not ids:
            raise ConfigError("the prompt is empty; give at least one character (e.g. a newline)")
        if tok.unk_id != tok.eos_id and tok.unk_id in ids:
            unknown = sorted({ch for ch in prompt if tok.encode(ch) == [tok.unk_id]})
            shown = ", ".join(map(repr, unknown))  # quoted: a "," or a space stays readable, "\t" escaped
            raise ConfigError(f"the prompt has characters this model's vocabulary lacks "
                              f"({shown}); leave them out or replace them")  # fmt: skip
        return ids

    def complete(
        self, prompt: str, max_new_tokens: int, config: SearchConfig | None = None
    ) -> list[Hypothesis]:
        """Continuations of ``prompt`` (``config.nbest`` of them; default: one sample at T = 1), each
        step reading the last ``context`` tokens at most."""
        config = config or SearchConfig(sample=True, beam=1)
        prompt_ids = torch.tensor([self.encode(prompt)], dtype=torch.long, device=self.device)
        return search(self.adapter(config.use_cache), prompt_ids, config, max_new_tokens)[0]

    def continuation(self, prompt_ids: Sequence[int], tokens: list[int]) -> str:
        """The text ``tokens`` add after the prompt's ids: decoded after the prompt's last piece and cut
        after that piece's own text (the rest of the prompt cannot change how they read, and a stream
        decodes at every token). Decoded alone, a sentencepiece continuation's first piece loses its
        word-start space ("A man" + "▁rides" read "A manrides")."""
        last = list(prompt_ids[-1:])
        head, whole = self.tokenizer.decode(last), self.tokenizer.decode([*last, *tokens])
        return whole[len(head) :] if whole.startswith(head) else self.tokenizer.decode(tokens)

    def generate(self, prompt: str, max_new_tokens: int, config: SearchConfig | None = None) -> list[str]:
        """``prompt`` followed by each continuation, as text."""
        ids, hypotheses = self.encode(prompt), self.complete(prompt, max_new_tokens, config)
        return [prompt + self.continuation(ids, h.tokens) for h in hypotheses]


def context(config, trained_max_len: int | None) -> int | None:
    """The most tokens a language model reads: the context it was trained on, and for learned
    positions never more than its ``max_len`` rows; None (no limit) for a model with computed
    positions whose training context is unknown."""
    limits = [n for n in (trained_max_len, config.max_len if config.positional == "learned" else None) if n]
    return min(limits) if limits else None
