"""Random-initialised HF models (no downloads) saved as the directories aiayn reads, and inputs."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from tests.helpers import randomise_  # noqa: F401  -- the HF builders' models are randomised alike

transformers = pytest.importorskip("transformers")
transformers.logging.set_verbosity_error()
transformers.logging.disable_progress_bar()


def marian(tmp: Path, fmt: str = "safetensors", seed: int = 0, **overrides):
    """A MarianMTModel saved to ``tmp``: ``fmt="bin"`` writes pytorch_model.bin the way transformers
    4.x did (every name, tied duplicates and positional tables included)."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=61, d_model=32, encoder_layers=2, decoder_layers=2, encoder_attention_heads=4,
              decoder_attention_heads=4, encoder_ffn_dim=64, decoder_ffn_dim=64, activation_function="swish",
              max_position_embeddings=64, scale_embedding=True, pad_token_id=60, decoder_start_token_id=60,
              eos_token_id=0, forced_eos_token_id=None)  # fmt: skip
    kw.update(overrides)
    model = randomise_(transformers.MarianMTModel(transformers.MarianConfig(**kw)), seed)
    save(model, tmp, fmt)
    return model


def gpt2(tmp: Path, fmt: str = "safetensors", seed: int = 0, **overrides):
    """A GPT2LMHeadModel saved to ``tmp``; ``fmt="original"`` mimics the hub's first GPT-2 files:
    pytorch_model.bin without the ``transformer.`` prefix, with the attn.bias mask buffers."""
    torch.manual_seed(seed)
    kw = dict(vocab_size=53, n_embd=32, n_layer=2, n_head=4, n_positions=40, bos_token_id=52, eos_token_id=52)
    kw.update(overrides)
    model = randomise_(transformers.GPT2LMHeadModel(transformers.GPT2Config(**kw)), seed)
    if fmt == "original":
        tmp.mkdir(parents=True, exist_ok=True)
        model.config.to_json_file(tmp / "config.json")
        state = {
            k.removeprefix("transformer."): v for k, v in model.state_dict().items() if k != "lm_head.weight"
        }
        n = kw["n_positions"]
        for i in range(kw["n_layer"]):
            state[f"h.{i}.attn.bias"] = torch.ones(n, n, dtype=torch.bool).tril()[None, None]
            state[f"h.{i}.attn.masked_bias"] = torch.tensor(-1e4)
        torch.save(state, tmp / "pytorch_model.bin")
    else:
        save(model, tmp, fmt)
    return model


def save(model, tmp: Path, fmt: str) -> None:
    model.save_pretrained(tmp)
    if fmt == "bin":  # transformers 5 writes safetensors only
        (tmp / "model.safetensors").unlink()
        state = dict(model.state_dict())
        for name in ("model.encoder.embed_positions.weight", "model.decoder.embed_positions.weight"):
            if hasattr(model, "model"):
                state[name] = model.get_submodule(name.removesuffix(".weight")).weight
        torch.save(state, tmp / "pytorch_model.bin")


def padded_ids(lengths: list[int], low: int, high: int, pad: int, seed: int = 1) -> tuple:
    """(ids, attention_mask): random ids in [low, high), right-padded with ``pad`` to the longest."""
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(low, high, (len(lengths), max(lengths)), generator=g)
    mask = torch.arange(max(lengths))[None, :] < torch.tensor(lengths)[:, None]
    return ids.masked_fill(~mask, pad), mask.long()
