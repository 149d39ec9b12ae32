"""``aiayn export``: write a model directory in another library's layout (today: Hugging Face)."""

from __future__ import annotations

import argparse

from aiayn.atomic import atomic_dir, check_output
from aiayn.interop import export_hf, from_pretrained
from aiayn.models.io import resolve_model_dir

EXAMPLES = """examples:
  aiayn export --model runs/de-en --to hf de-en-hf     # a Transformer -> MarianMTModel directory
  aiayn export --model runs/lm --to hf lm-hf           # a LanguageModel -> GPT2LMHeadModel directory

A Transformer must be post-norm with sinusoidal positions (either layout) and LayerNorm ε 1e-5;
a LanguageModel must be pre-norm. Anything else is refused with the reason.

OUT is written whole or not at all. It may not be the model being exported (nor contain it); a
directory that already holds a model is replaced only with --force, and any other non-empty
directory is refused.
"""


def add_parser(sub) -> None:
    p = sub.add_parser("export", help="write a model as a Hugging Face (transformers) directory",
                       epilog=EXAMPLES, formatter_class=argparse.RawDescriptionHelpFormatter)  # fmt: skip
    p.add_argument("--model", required=True, metavar="DIR", help="model directory (aiayn's or HF's)")
    p.add_argument("--to", choices=["hf"], default="hf", help="the layout to write (default: hf)")
    p.add_argument("out", metavar="OUT", help="directory to write (created if missing)")
    p.add_argument("--force", action="store_true", help="replace OUT if it already holds a model")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    out = check_output(
        args.out, (resolve_model_dir(args.model),), directory=True, force=args.force, option="OUT"
    )
    model = from_pretrained(args.model)
    with atomic_dir(out) as tmp:
        export_hf(model, tmp)
    print(f"wrote {type(model).__name__} as {out / 'config.json'} + model.safetensors")
    return 0
