import random

import pytest


def make_corpus(tmp_path):
    """A tiny synthetic de-en corpus as a folder of train/valid files."""
    rng = random.Random(0)
    words = ["hund", "katze", "mann", "frau", "kind", "läuft", "springt", "sitzt", "rot", "blau"]
    eng = {"hund": "dog", "katze": "cat", "mann": "man", "frau": "woman", "kind": "child",
           "läuft": "runs", "springt": "jumps", "sitzt": "sits", "rot": "red", "blau": "blue"}  # fmt: skip
    folder = tmp_path / "corpus"
    folder.mkdir()
    for split, n in (("train", 400), ("valid", 30)):
        de, en = [], []
        for _ in range(n):
            sent = [rng.choice(words) for _ in range(rng.randint(3, 9))]
            de.append(" ".join(sent))
            en.append(" ".join(eng[w] for w in sent))
        (folder / f"{split}.de").write_text("\n".join(de) + "\n", encoding="utf-8")
        (folder / f"{split}.en").write_text("\n".join(en) + "\n", encoding="utf-8")
    return folder


@pytest.fixture
def corpus(tmp_path):
    """A tiny synthetic de-en corpus as a folder of train/valid files."""
    return make_corpus(tmp_path)


@pytest.fixture(scope="module")
def corpus_module(tmp_path_factory):
    """The same corpus, shared by a module's tests."""
    return make_corpus(tmp_path_factory.mktemp("corpus"))


def tiny_args(corpus, out_dir, *extra):
    # a run reading another's tokenizer (r2l_model, init_from) takes its vocabulary: no vocab_size
    reads = any(e.startswith(("r2l_model=", "init_from=")) and not e.endswith("=") for e in extra)
    return [
        f"dataset={corpus}", f"out_dir={out_dir}", *([] if reads else ["vocab_size=300"]), "max_tokens=256",
        "eval_bleu=false",
        "model.d_model=32", "model.n_heads=2", "model.d_ff=64", "model.n_encoder_layers=1",
        "model.n_decoder_layers=1", "model.dropout=0.1", "schedule=constant", "lr=0.003", "warmup=5",
        "log_every=1", "progress=false", "threads=1", *extra,
    ]  # fmt: skip
