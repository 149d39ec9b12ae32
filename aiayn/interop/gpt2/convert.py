"""GPT-2 checkpoints (``GPT2LMHeadModel``) as aiayn ``LanguageModel``s, and back.

GPT-2 is a decoder-only stack of our ``EncoderLayer`` under the look-ahead mask, with named
options: pre-norm (``norm_first=True``) and a final LayerNorm (``ln_f``), learned positions,
``gelu_new`` (= ``activation="gelu_tanh"``), no embedding scaling (``emb_scale="none"``) and the
output projection tied to the token embedding. Its ``Conv1D`` layers store weights as (in, out),
the transpose of ``nn.Linear``; ``c_attn`` already stacks [q | k | v] in our ``w_qkv`` order.

**Padding.** GPT-2 has no padding token (bos = eos = 50256) and aiayn needs one distinct from eos.
The model never reads it: it only names the embedding row that ``nn.Embedding(padding_idx=…)``
keeps out of gradients, the id that batching pads with and the loss ignores, and the one token
aiayn's searches never emit. So we take the config's ``pad_token_id`` if it differs from eos, else
the highest id that is not a special token (50255 in GPT-2: its last and so rarest BPE merge, the
one token that aiayn's generation cannot write where transformers' could), or whatever ``pad_id``
the caller passes. Exported back, such a stand-in is written as no padding token (``pad_token_id``
null, not banned from generation): it is a real token to transformers.
"""

from __future__ import annotations

import math
import os
from pathlib import Path

from torch import Tensor

from aiayn.errors import ModelDirError
from aiayn.interop import hf
from aiayn.models.config import LMConfig
from aiayn.models.io import check_float32
from aiayn.models.lm import LanguageModel
from aiayn.modules.embedding import sinusoidal_table

# GPT2Config's defaults, for fields a config.json leaves out
DEFAULTS = dict(
    vocab_size=50257, n_positions=1024, n_embd=768, n_layer=12, n_head=12, n_inner=None,
    activation_function="gelu_new", resid_pdrop=0.1, embd_pdrop=0.1, attn_pdrop=0.1, layer_norm_epsilon=1e-5,
    scale_attn_weights=True, scale_attn_by_inverse_layer_idx=False, add_cross_attention=False,
    bos_token_id=50256, eos_token_id=50256, pad_token_id=None, tie_word_embeddings=True,
)  # fmt: skip
BUFFERS = (".attn.bias", ".attn.masked_bias")  # causal-mask buffers that old checkpoints stored


def default_pad_id(vocab_size: int, specials: set[int]) -> int:
    """The highest id that is not a special token (see the module docstring)."""
    return next(i for i in range(vocab_size - 1, -1, -1) if i not in specials)


def config_from_gpt2(hf_config: dict, pad_id: int | None = None) -> LMConfig:
    hf_config = {**DEFAULTS, **{k: v for k, v in hf_config.items() if v is not None}}
    if not hf_config["scale_attn_weights"] or hf_config["scale_attn_by_inverse_layer_idx"]:
        raise ModelDirError("this GPT-2 scales attention other than by 1/√d_k; aiayn cannot load it")
    if hf_config["add_cross_attention"]:
        raise ModelDirError("this GPT-2 has cross-attention (add_cross_attention=True); aiayn cannot load it")
    bos, eos, vocab = hf_config["bos_token_id"], hf_config["eos_token_id"], hf_config["vocab_size"]
    if pad_id is None:
        pad = hf_config["pad_token_id"]
        pad_id = pad if pad is not None and pad != eos else default_pad_id(vocab, {bos, eos})
    return LMConfig(
        d_model=hf_config["n_embd"],
        n_heads=hf_config["n_head"],
        d_ff=hf_config["n_inner"] or 4 * hf_config["n_embd"],
        dropout=float(hf_config["resid_pdrop"]),  # one rate for embeddings and sublayers (HF: embd_pdrop too)
        attn_dropout=float(hf_config["attn_pdrop"]),
        activation=hf.activation_from_hf(hf_config["activation_function"]),
        norm_first=True,
        ln_eps=float(hf_config["layer_norm_epsilon"]),
        positional="learned",
        max_len=hf_config["n_positions"],
        emb_scale="none",
        pad_id=pad_id,
        bos_id=bos,
        eos_id=eos,
        unk_id=eos,  # GPT-2's unk token is <|endoftext|> too; byte-level BPE never needs it
        vocab_size=vocab,
        n_layers=hf_config["n_layer"],
        tie_output=hf_config["tie_word_embeddings"],
    )


def name_map(c: LMConfig, tie: bool | None = None) -> hf.NameMap:
    m = hf.NameMap()
    m.add("embed.tokens.embedding.weight", "transformer.wte.weight")
    m.add("embed.positions.weight", "transformer.wpe.weight")
    tie = c.tie_output if tie is None else tie
    m.add("head.proj.weight", "transformer.wte.weight" if tie else "lm_head.weight")
    for i in range(c.n_layers):
        ours, theirs = f"layers.layers.{i}", f"transformer.h.{i}"
        m.linear(f"{ours}.self_attn_res.norm", f"{theirs}.ln_1")
        m.linear(f"{ours}.self_attn.w_qkv", f"{theirs}.attn.c_attn", conv1d=True)
        m.linear(f"{ours}.self_attn.w_o", f"{theirs}.attn.c_proj", conv1d=True)
        m.linear(f"{ours}.ff_res.norm", f"{theirs}.ln_2")
        m.linear(f"{ours}.ff.w_1", f"{theirs}.mlp.c_fc", conv1d=True)
        m.linear(f"{ours}.ff.w_2", f"{theirs}.mlp.c_proj", conv1d=True)
    m.linear("layers.norm", "transformer.ln_f")
    return m


def _canonical(state: dict[str, Tensor], c: LMConfig, source: str = "") -> dict[str, Tensor]:
    """Names as ``GPT2LMHeadModel.save_pretrained`` writes them: the ``transformer.`` prefix that
    the original checkpoints lack added, mask buffers dropped, a tied ``lm_head`` folded into wte."""
    state = {
        (k if k.startswith("transformer.") or k == "lm_head.weight" else f"transformer.{k}"): v
        for k, v in state.items()
        if not k.endswith(BUFFERS)
    }
    if c.tie_output:
        wte = hf.take_alias(
            state, ("transformer.wte.weight", "lm_head.weight"), "tie_word_embeddings", source
        )
        if wte is not None:
            state["transformer.wte.weight"] = wte
    return state


def load_gpt2(directory: str | os.PathLike, pad_id: int | None = None) -> LanguageModel:
    """A GPT2LMHeadModel directory as an aiayn ``LanguageModel`` (float32, CPU, eval mode).

    A config.json aiayn cannot read or weights that do not fit it are a ``ModelDirError`` naming
    the file."""
    directory = Path(directory)
    hf_config = hf.read_hf_config(directory)
    hf.check_architectures(hf_config, ("GPT2LMHeadModel", "GPT2Model"), directory / hf.HF_CONFIG)
    try:
        cfg = config_from_gpt2(hf_config, pad_id)
    except (TypeError, ValueError) as e:  # ConfigError included: a field of the wrong type or range
        raise ModelDirError(f"{directory / hf.HF_CONFIG}: {e}") from None
    state = hf.read_hf_weights(directory)
    hf.check_depth(cfg, state, directory / hf.HF_CONFIG)
    state = _canonical(state, cfg, str(directory))
    return name_map(cfg).load(lambda: LanguageModel(cfg), state, str(directory))


def check_exportable(c: LMConfig) -> None:
    problems = []
    if not c.norm_first:
        problems.append("it is post-norm (norm_first=False) and GPT-2 is pre-norm")
    head = c.d_model // c.n_heads
    if c.d_model % c.n_heads or (c.d_k or head) != head or (c.d_v or head) != head:
        problems.append(f"its heads are not d_model/n_heads wide (d_k={c.d_k}, d_v={c.d_v})")
    if problems:
        raise ModelDirError("cannot export as GPT-2: " + "; ".join(problems))


def export_gpt2(
    model: LanguageModel,
    directory: str | os.PathLike,
    trained_max_len: int | None = None,
    untrained_ids: tuple[int, ...] = (),
    tokenizer_config: bool = True,
) -> Path:
    """Write ``model`` as a GPT2LMHeadModel directory that HF loads; ``trained_max_len`` (the context
    an aiayn run trained on) is kept as ``aiayn_trained_max_len``, so that aiayn's generation reads
    no more of the export than of the original (``decoding/generator.py``), and ``untrained_ids``
    (the special ids an aiayn LM run never had as targets) as ``aiayn_untrained_ids`` and in
    generation_config.json's ``bad_words_ids``: neither aiayn nor transformers emits them.
    ``tokenizer_config`` (an aiayn model, which has no GPT-2 byte BPE) writes a ``tokenizer_config.json``
    that makes ``AutoTokenizer`` fail instead of building an empty ``GPT2Tokenizer``; ``False`` for a
    model whose own GPT-2 tokenizer files are to be copied beside it.

    Sinusoidal positions become GPT-2's learned table (``max_len`` rows, or the trained context where
    that is more: a hard limit in HF).
    Embedding scaling, which GPT-2 lacks, is folded into untied matrices: ``"emb"`` writes
    wte = E·√d_model with lm_head = E; ``"prj"`` writes lm_head = E/√d_model.
    """
    check_float32(model, "export")
    c = model.config
    check_exportable(c)
    state = {k: v.detach() for k, v in model.state_dict().items()}
    rows = c.max_len
    if c.positional != "learned":  # as many rows as the context it trained on, which may pass max_len
        rows = max(c.max_len, trained_max_len or 0)
        table = sinusoidal_table(rows, c.d_model, halves=c.positional == "sinusoidal_halves")
        state["embed.positions.weight"] = table.to(state["embed.tokens.embedding.weight"])
    root = math.sqrt(c.d_model)
    if c.emb_scale == "emb":
        state["embed.tokens.embedding.weight"] = state["embed.tokens.embedding.weight"] * root
    elif c.emb_scale == "prj" and c.tie_output:
        state["head.proj.weight"] = state["head.proj.weight"] / root
    tie = c.tie_output and c.emb_scale == "none"
    tensors = name_map(c, tie).to_hf(state)
    # a GPT-2 read without a padding token pads with a real token (the module docstring): written as
    # pad_token_id, transformers would mask it out of prompts and generation_config would ban it
    stand_in = c.bos_id == c.eos_id and c.pad_id == default_pad_id(c.vocab_size, {c.bos_id, c.eos_id})
    pad = None if stand_in else c.pad_id
    config = {
        "architectures": ["GPT2LMHeadModel"],
        "model_type": "gpt2",
        "vocab_size": c.vocab_size,
        "n_positions": rows,
        "n_embd": c.d_model,
        "n_layer": c.n_layers,
        "n_head": c.n_heads,
        "n_inner": c.d_ff,
        "activation_function": hf.ACTIVATIONS_TO_HF[c.activation],
        "resid_pdrop": c.dropout,
        "embd_pdrop": c.dropout,
        "attn_pdrop": c.attn_dropout,
        "layer_norm_epsilon": c.ln_eps,
        "bos_token_id": c.bos_id,
        "eos_token_id": c.eos_id,
        "pad_token_id": pad,
        "tie_word_embeddings": tie,
        "dtype": str(state["head.proj.weight"].dtype).removeprefix("torch."),
    }
    if trained_max_len is not None:
        config["aiayn_trained_max_len"] = trained_max_len
    if untrained_ids:
        config["aiayn_untrained_ids"] = list(untrained_ids)
    out = hf.write_hf_directory(directory, config, tensors)
    hf.write_generation_config(out, pad, untrained_ids, bos_token_id=c.bos_id, eos_token_id=c.eos_id)
    if tokenizer_config:
        hf.write_tokenizer_config(out, trained_max_len or c.max_len)
    return out
