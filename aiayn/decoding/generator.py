"""A prompt in, continuations out, for a decoder-only ``LanguageModel``.

``Generator.from_dir(path)`` loads a language-model directory (``model_dir.py``); a training loop
can build one from the model and tokenizer it holds to print samples. The prompt is encoded as
the data module feeds LM training (content ids, no bos), so it must not be empty.
"""

from __future__ import annotations

import os
import warnings
from collections.abc import Callable

import torch
from torch import nn

from aiayn.data.tokenizer import Tokenizer
from aiayn.decoding.adapters import LMAdapter
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.scoring import Hypothesis
from aiayn.decoding.search import search
from aiayn.errors import ConfigError
from aiayn.interop.model_dir import load_lm_dir


class Generator:
    """A language model with its tokenizer."""

    def __init__(self, model: nn.Module, tokenizer: Tokenizer):
        self.model = model.eval()
        self.tokenizer = tokenizer

    @classmethod
    def from_dir(cls, directory: str | os.PathLike, device: str | torch.device = "cpu") -> Generator:
        return cls(*load_lm_dir(directory, device))

    @property
    def device(self) -> torch.device:
        return next(self.model.parameters()).device

    def complete(
        self,
        prompt: str,
        max_new_tokens: int,
        config: SearchConfig | None = None,
        warn: Callable[[str], None] | None = None,
    ) -> list[Hypothesis]:
        """Continuations of ``prompt`` (``config.nbest`` of them; default: one sample at T = 1).

        With learned positions the prompt and continuation must fit in ``config.max_len``
        positions: ``max_new_tokens`` is lowered to fit, with a warning (``warn``).
        """
        config = config or SearchConfig(sample=True, beam=1)
        ids = self.tokenizer.encode(prompt)
        if not ids:
            raise ConfigError("the prompt is empty; give at least one character (e.g. a newline)")
        c = self.model.config
        room = c.max_len - len(ids) + 1  # the last new token is never fed back to the model
        if c.positional == "learned" and max_new_tokens > room:
            if room < 1:
                raise ConfigError(
                    f"the prompt has {len(ids)} tokens; this model reads at most {c.max_len}: shorten it"
                )
            (warn or warnings.warn)(
                f"max_new_tokens lowered from {max_new_tokens} to {room}: the model has {c.max_len} positions"
            )
            max_new_tokens = room
        prompt_ids = torch.tensor([ids], dtype=torch.long, device=self.device)
        return search(LMAdapter(self.model, config.use_cache), prompt_ids, config, max_new_tokens)[0]

    def generate(
        self, prompt: str, max_new_tokens: int, config: SearchConfig | None = None, **kw
    ) -> list[str]:
        """``prompt`` followed by each continuation, as text."""
        return [
            prompt + self.tokenizer.decode(h.tokens)
            for h in self.complete(prompt, max_new_tokens, config, **kw)
        ]
