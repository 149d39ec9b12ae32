"""sacreBLEU's BLEU for a target language, tokenized as sacreBLEU chooses for that language.

``sacrebleu -l SRC-TGT`` picks the tokenizer by the target language: ``zh`` for Chinese,
``ja-mecab`` and ``ko-mecab`` for Japanese and Korean, ``13a`` (the WMT default) for the rest. Scored
with 13a, a Chinese, Japanese or Korean sentence is a handful of tokens (13a splits at spaces and
punctuation), and BLEU is near zero for good translations and bad ones alike. Validation BLEU (which
picks the best checkpoint) and ``aiayn evaluate`` both read their metric from here.
"""

from __future__ import annotations

from typing import Any

from aiayn.errors import ConfigError


def bleu(tgt_lang: str = "", **kwargs: Any):
    """``sacrebleu.metrics.BLEU`` for ``tgt_lang`` (e.g. ``"zh"``; ``""``: 13a), with ``kwargs`` passed
    on (``lowercase=True``, …). A language whose tokenizer needs one of sacreBLEU's extras (Japanese,
    Korean: MeCab) is a one-line error naming the extra, rather than a score that means nothing."""
    from sacrebleu.metrics import BLEU  # here: importing the decoding package should not load sacreBLEU

    try:
        return BLEU(trg_lang=tgt_lang, **kwargs)
    except RuntimeError as e:  # sacreBLEU's MeCab tokenizers without their extra
        raise ConfigError(f"BLEU for target language {tgt_lang!r} needs sacreBLEU's tokenizer for it: "
                          f"pip install 'sacrebleu[{tgt_lang}]'") from e  # fmt: skip
