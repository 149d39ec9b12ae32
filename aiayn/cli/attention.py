"""``aiayn attention``: heat-maps of every layer's and head's attention weights for one sentence."""

from __future__ import annotations

import argparse

import torch

from aiayn.cli.commands import summary
from aiayn.cli.decode_options import add_model_argument, formatter
from aiayn.decoding.bidirectional import BidirectionalAdapter
from aiayn.decoding.generator import Generator
from aiayn.decoding.maps import decoder_read, token_labels
from aiayn.decoding.options import SearchConfig
from aiayn.decoding.search import search
from aiayn.decoding.translator import Translator
from aiayn.errors import ConfigError
from aiayn.interop.model_dir import check_kind, load_encoder_dir
from aiayn.outputs import check_figure_dir
from aiayn.viz.attention import is_attention_map, save_attention_maps

EXAMPLES = """examples:
  aiayn attention --model runs/de-en --src "Ein Mann fährt Fahrrad." --out plots/
  aiayn attention --model runs/de-en --src "Ein Mann fährt Fahrrad." --tgt "A man rides a bike." --out plots/
  aiayn attention --model runs/shakespeare --src "ROMEO: But soft" --out plots/   # a language model
  aiayn attention --model runs/sst2-finetune --src "a gorgeous movie ." --out plots/  # an encoder

Writes encoder_layer{l}.png, decoder_self_layer{l}.png and cross_layer{l}.png (a language model:
decoder_self only; an encoder-only model: encoder only, over <s> + the text + </s>), each a grid
of heads with query tokens as rows and key tokens as columns.
Without --tgt the target is the model's greedy translation. The decoder rows are the tokens it
reads: <s> then the target, each predicting the next. A bidirectional model adds its right-to-left
decoder (r2l_self, r2l_cross) and the fourth sublayer (cross_r2l: the decoder reading the
right-to-left decoder's states, of its own greedy translation or of the reversed --tgt).
A map holds at most 256 tokens on an axis (and no more than the model reads): a longer --src or --tgt
is refused, a greedy translation is cut there. Every weight reads off one colour scale (0 to 1).
"""


def add_parser(sub) -> None:
    p = sub.add_parser(
        "attention",
        help=summary("attention"),
        description="Plot attention weights for one sentence.",
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    add_model_argument(p, quantize=False)
    p.add_argument("--src", required=True, help="source sentence (a language model: the text)")
    p.add_argument("--tgt", help="target sentence (default: the model's greedy translation)")
    p.add_argument("--out", required=True, metavar="DIR",
                   help="folder for the PNG files: new, empty, or holding only attention maps")  # fmt: skip
    p.set_defaults(run=run)


# tokens on a map's axis at most: a longer sentence's labels are unreadable, and its figures take
# minutes and gigabytes to draw
MAX_MAP_TOKENS = 256


def check_length(option: str, n: int, limit: int, what: str) -> None:
    """A ``ConfigError`` where ``option`` gives more than ``limit`` tokens (counted ``what``)."""
    if n > limit:
        why = "a map is drawn for" if limit == MAX_MAP_TOKENS else "this model reads"
        raise ConfigError(f"{option} has {n} tokens{what}; {why} at most {limit}: give a shorter one")


def _translation_maps(args: argparse.Namespace) -> tuple[dict, dict]:
    translator = Translator.from_dir(args.model, args.device)
    model, c, device = translator.model, translator.model.config, translator.device
    (src,), cut = translator.encode([args.src])
    if not src:
        raise ConfigError("--src is blank; give a sentence")
    if cut:  # a map of part of the sentence would pass for the whole one's
        n = len(translator.src_tokenizer.encode(args.src)) + 1
        check_length("--src", n, translator.max_src_len, " with </s>")
    check_length("--src", len(src) + 1, MAX_MAP_TOKENS, " with </s>")
    src = src + [c.eos_id]
    r2l_in = None
    if args.tgt is not None:
        out = translator.tgt_tokenizer.encode(args.tgt)
        if translator.reverse:  # a right-to-left model reads its target backwards, as it writes it
            out = out[::-1]
        check_length(
            "--tgt", len(out) + 1, min(MAX_MAP_TOKENS, translator.max_tgt_len or MAX_MAP_TOKENS), " with <s>"
        )
        r2l_in = [c.bos_id, *out[::-1]]  # a bidirectional model reads the given target backwards too
    elif c.bidirectional:  # both passes of greedy decoding: the right-to-left one makes the memory
        # with the right-to-left search the model was trained with (r2l_beam), as aiayn translate
        greedy = SearchConfig(beam=1, r2l_beam=translator.r2l_beam)
        limit = greedy.output_limit(len(src) - 1)  # eos excluded, as Translator counts
        limit = min(limit, translator.max_tgt_len or limit)  # learned positions: the decoder's table
        limit = min(limit, MAX_MAP_TOKENS - 1)  # a map's axis: [bos] + the memory's tokens
        adapter = BidirectionalAdapter(model, greedy, limit)
        with torch.inference_mode():
            out = search(adapter, torch.tensor([src], device=device), greedy, limit)[0][0].tokens
        r2l_in = [c.bos_id] + [t for t in adapter.r2l_hypotheses[0][0].tokens if t != c.eos_id]
    else:
        out = translator.search([src[:-1]], SearchConfig(beam=1, max_len_cap=MAX_MAP_TOKENS))[0][0].tokens
    tgt_in = [c.bos_id, *out] if args.tgt is not None else decoder_read(out, c.bos_id)
    extra = {"r2l_tgt": torch.tensor([r2l_in], device=device)} if c.bidirectional else {}
    src_t, tgt_t = torch.tensor([src], device=device), torch.tensor([tgt_in], device=device)
    with torch.inference_mode():
        maps = model.attention_weights(src_t, tgt_t, **extra)
    labels = {
        "src": token_labels(translator.src_tokenizer, src, c),
        "tgt": token_labels(translator.tgt_tokenizer, tgt_in, c),
    }
    if c.bidirectional:
        labels["r2l"] = token_labels(translator.tgt_tokenizer, r2l_in, c)
    return maps, labels


def _lm_maps(args: argparse.Namespace) -> tuple[dict, dict]:
    if args.tgt is not None:
        raise ConfigError("--tgt is for translation models; a language model plots --src only")
    generator = Generator.from_dir(args.model, args.device)
    if not generator.tokenizer.encode(args.src):
        raise ConfigError("--src is empty; give some text")
    try:  # characters the vocabulary lacks are refused, as generate refuses them
        ids = generator.encode(args.src)
    except ConfigError as e:
        raise ConfigError(f"--src: {e}") from None
    check_length("--src", len(ids), min(MAX_MAP_TOKENS, generator.context or MAX_MAP_TOKENS), "")
    with torch.inference_mode():
        maps = generator.model.attention_weights(torch.tensor([ids], device=generator.device))
    return maps, {"tgt": token_labels(generator.tokenizer, ids, generator.model.config)}


def _encoder_maps(args: argparse.Namespace) -> tuple[dict, dict]:
    if args.tgt is not None:
        raise ConfigError("--tgt is for translation models; an encoder-only model plots --src only")
    model, tok, meta = load_encoder_dir(args.model, args.device)
    c = model.config
    trained = meta.get("trained_max_len") if c.positional == "learned" else None  # rows past it: untrained
    ids = tok.encode(args.src)
    if not ids or not args.src.strip():  # blank: no text, as classify reads it
        raise ConfigError("--src is blank; give some text")
    ids = [c.bos_id, *ids, c.eos_id]
    limit = min(MAX_MAP_TOKENS, c.max_len, trained if isinstance(trained, int) and trained > 0 else c.max_len)
    check_length("--src", len(ids), limit, " with <s> and </s>")
    with torch.inference_mode():
        maps = model.attention_weights(torch.tensor([ids], device=args.device))
    return maps, {"src": token_labels(tok, ids, c)}


def run(args: argparse.Namespace) -> int:
    check_figure_dir(args.out, is_attention_map, (args.model,))
    kind = check_kind(args.model, ("transformer", "lm", "encoder"))
    read = {"transformer": _translation_maps, "lm": _lm_maps, "encoder": _encoder_maps}[kind]
    maps, labels = read(args)
    for path in save_attention_maps(maps, labels, args.out):
        print(path)
    return 0
