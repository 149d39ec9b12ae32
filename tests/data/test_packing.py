"""Sequence packing: documents share full blocks, separated by eos, and no id is lost; the masks
never choose a separator; a text file's stream goes through the encoded-text cache."""

import numpy as np
import pytest
import torch

from aiayn.data import BOS_ID, EOS_ID, PAD_ID, SentencePieceTokenizer, encode_text, load_text
from aiayn.data.batching import collate_sequences
from aiayn.data.masking import Masking, mask_tokens
from aiayn.data.packing import DocumentIds, PackedBlocks, encode_documents, join_documents

MAX_LEN = 10  # blocks of 8 ids between bos and eos


def documents():
    """Ids >= 5 (no specials); lengths 3, 1, 12 (longer than a block), 5, 2."""
    rng = np.random.default_rng(0)
    return [rng.integers(5, 50, n).tolist() for n in (3, 1, 12, 5, 2)]


def split_at(stream, sep):
    docs, current = [], []
    for i in stream:
        if i == sep:
            docs.append(current)
            current = []
        else:
            current.append(int(i))
    assert not current, "the stream ends with a separator"
    return docs


def test_blocks_are_full_and_lose_no_document_token():
    docs = documents()
    stream = join_documents(docs, EOS_ID)
    assert len(stream) == sum(len(d) + 1 for d in docs)
    blocks = PackedBlocks(stream, MAX_LEN - 2)
    ids = collate_sequences(list(blocks), MAX_LEN)  # (B, T)
    assert ids.shape == (len(blocks), MAX_LEN)
    assert (ids[:, 0] == BOS_ID).all()
    assert (ids[:-1] != PAD_ID).all() and (ids[:-1, -1] == EOS_ID).all()  # all but the last block full
    inner = [row[1 : int((row != PAD_ID).sum()) - 1] for row in ids]  # bos and the closing eos off
    joined = torch.cat(inner).tolist()
    assert joined == stream.tolist()
    assert split_at(joined, EOS_ID) == docs  # every document whole, in order
    assert [t for t in joined if t != EOS_ID] == [t for d in docs for t in d]


def test_documents_share_a_block_across_a_separator_and_long_ones_continue():
    docs = documents()
    blocks = list(PackedBlocks(join_documents(docs, EOS_ID), MAX_LEN - 2))
    # block 0: doc 0 (3) + sep + doc 1 (1) + sep + the first 2 ids of doc 2
    assert blocks[0].tolist() == [*docs[0], EOS_ID, *docs[1], EOS_ID, *docs[2][:2]]
    assert blocks[1].tolist() == docs[2][2:10]  # doc 2 continues, no separator inside it
    assert blocks[2].tolist()[:3] == [*docs[2][10:], EOS_ID]


def test_masks_never_choose_a_separator_or_the_block_ends():
    stream = join_documents(documents() * 20, EOS_ID)
    ids = collate_sequences(list(PackedBlocks(stream, MAX_LEN - 2)), MAX_LEN)
    for whole_word in (False, True):
        starts = torch.zeros(60, dtype=torch.bool)
        starts[::2] = True
        inputs, targets = mask_tokens(ids, Masking(p=0.5, whole_word=whole_word), 4, 60,
                                      np.random.default_rng(1), starts)  # fmt: skip
        special = (ids == EOS_ID) | (ids == BOS_ID) | (ids == PAD_ID)
        assert (targets[special] == PAD_ID).all() and (inputs[special] == ids[special]).all()
        assert (targets != PAD_ID).any(1).all()  # every block teaches something


def test_empty_documents_and_an_empty_stream():
    assert join_documents([[], [7], []], EOS_ID).tolist() == [7, EOS_ID]
    assert len(PackedBlocks(join_documents([], EOS_ID), 4)) == 0
    with pytest.raises(ValueError, match="size=0"):
        PackedBlocks(np.zeros(3, np.int32), 0)
    with pytest.raises(IndexError):
        PackedBlocks(np.zeros(3, np.int32), 2)[2]


def test_a_text_file_streams_through_the_encoded_text_cache(tmp_path, write_lines):
    lines = [f"review {i}: the film was {'good' if i % 2 else 'dull'} and long" for i in range(40)]
    path = write_lines(tmp_path / "reviews.txt.gz", [lines[0], "", *lines[1:]])  # a blank line: no document
    tok = SentencePieceTokenizer.train(lines, 40, byte_fallback=False)
    corpus = load_text(path, "all")
    stream = encode_documents(corpus, tok, cache=tmp_path / "cache")
    assert isinstance(stream, np.memmap)
    assert stream.tolist() == join_documents(tok.encode_batch(lines), tok.eos_id).tolist()
    again = encode_documents(corpus, tok, cache=tmp_path / "cache")
    assert again.filename == stream.filename  # found in the cache, not encoded twice
    plain = encode_text(corpus, tok, cache=tmp_path / "cache")  # the LM's stream has no separators
    assert plain.tokens.filename != stream.filename and EOS_ID not in plain.tokens.tolist()
    assert DocumentIds(tok, EOS_ID).model_bytes() != tok.model_bytes()
