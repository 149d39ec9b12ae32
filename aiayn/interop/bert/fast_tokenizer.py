"""HF's tokenizer files for an encoder trained with aiayn's sentencepiece vocabulary.

A sentencepiece vocabulary has no ``vocab.txt`` form, so an exported encoder gets what transformers'
fast tokenizers read instead: ``tokenizer.json`` (a ``tokenizers.Tokenizer``) and
``tokenizer_config.json`` naming it ``PreTrainedTokenizerFast``, so ``AutoTokenizer.from_pretrained``
loads it. The tokenizer is built by transformers' own sentencepiece converter
(``SpmConverter.build_tokenizer_from_spm_proto``: the model's normalisation rules, lowercasing included,
its BPE merges or unigram scores, byte fallback, ``<mask>`` kept whole), so it splits text as
sentencepiece does; a template adds ``bos … eos`` around each text, as aiayn's batches do (BERT's
``[CLS] … [SEP]``). ``<mask>`` is a special token matched in the normalised text, where sentencepiece
finds its user-defined piece; one difference remains, in a text that starts with it: sentencepiece
writes a lone ``▁`` before the mask, HF's tokenizer does not. transformers is an optional dependency:
without it no ``tokenizer.json`` is written, and the export still carries aiayn's own tokenizer. Nor is
one written when the converter of the installed transformers splits differently from sentencepiece
(5.17 leaves out the dummy-prefix ``▁`` of a text's first word and the BPE merges): the built tokenizer
is checked on ``PROBES`` first, and a mismatch is a warning that says to upgrade, never a silently
wrong file. Either way ``tokenizer_config.json`` still names ``PreTrainedTokenizerFast``, so that
``AutoTokenizer.from_pretrained`` fails for want of ``tokenizer.json`` instead of falling back to a
``BertTokenizer`` with no vocabulary, which reads every word as ``[UNK]``.
"""

from __future__ import annotations

import warnings
from pathlib import Path

from aiayn.atomic import write_text
from aiayn.data.tokenizer import BOS_ID, EOS_ID, PAD_ID, UNK_ID, SentencePieceTokenizer
from aiayn.interop.hf import write_tokenizer_config

# texts the built tokenizer must split as sentencepiece does: first words, runs of spaces, tabs and
# newlines, accents, case
PROBES = ("a film", "  two  spaces ", "tab\tand\nnewline", "Naïve café ÉTÉ", "x")


def save_fast_tokenizer(tok: SentencePieceTokenizer, directory: Path, max_len: int) -> bool:
    """Write ``tokenizer.json`` + ``tokenizer_config.json`` for ``tok`` into ``directory``; False
    (``tokenizer_config.json`` alone) without transformers (5 or later) or when its converter splits
    ``PROBES`` differently from ``tok`` (a warning names the first such text)."""
    fast = _converted(tok)
    if fast is None:
        write_tokenizer_config(directory, max_len)
        return False
    from tokenizers import AddedToken, processors

    name = tok.sp.id_to_piece
    bos, eos = name(BOS_ID), name(EOS_ID)
    fast.post_processor = processors.TemplateProcessing(
        single=f"{bos} $A {eos}",
        pair=f"{bos} $A {eos} $B {eos}",
        special_tokens=[(bos, BOS_ID), (eos, EOS_ID)],
    )
    if tok.mask_id is not None:  # matched in the normalised text, where sentencepiece finds it
        fast.add_special_tokens([AddedToken(name(tok.mask_id), normalized=True, special=True)])
    write_text(directory / "tokenizer.json", fast.to_str(pretty=True))
    specials = {"bos_token": bos, "eos_token": eos, "cls_token": bos, "sep_token": eos,
                "unk_token": name(UNK_ID), "pad_token": name(PAD_ID)}  # fmt: skip
    if tok.mask_id is not None:
        specials["mask_token"] = name(tok.mask_id)
    write_tokenizer_config(directory, max_len, **specials)
    return True


def _converted(tok: SentencePieceTokenizer):
    """transformers' converter's ``tokenizers.Tokenizer`` for ``tok``; None without transformers 5 or
    later, or when it splits one of ``PROBES`` unlike ``tok`` (warned)."""
    try:
        from transformers import __version__ as transformers_version
        from transformers.convert_slow_tokenizer import SpmConverter, import_protobuf
    except ImportError:
        return None
    if not hasattr(SpmConverter, "build_tokenizer_from_spm_proto"):  # transformers before 5
        return None
    proto = import_protobuf().ModelProto()
    proto.ParseFromString(tok.model_bytes())
    unigram = proto.trainer_spec.model_type == 1  # the converter takes (piece, score) pairs, BPE piece ids
    vocab = (
        [(p.piece, p.score) for p in proto.pieces]
        if unigram
        else {p.piece: i for i, p in enumerate(proto.pieces)}
    )
    fast = SpmConverter.build_tokenizer_from_spm_proto(proto, vocab)
    for text in PROBES:
        if fast.encode(text, add_special_tokens=False).ids != tok.encode(text):
            warnings.warn(
                f"no tokenizer.json written: transformers {transformers_version}'s sentencepiece "
                f"converter splits {text!r} unlike sentencepiece; upgrade transformers (the export keeps "
                "aiayn's own tokenizer)",
                stacklevel=3,
            )
            return None
    return fast
