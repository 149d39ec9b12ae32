"""``aiayn generate``: continue a prompt with a language model directory."""

from __future__ import annotations

import argparse

from aiayn.cli.commands import summary
from aiayn.cli.decode_options import add_model_argument, formatter, quantized
from aiayn.decoding.generator import Generator
from aiayn.decoding.options import SAMPLING_DEFAULTS, SearchConfig
from aiayn.errors import ConfigError

EXAMPLES = """examples:
  aiayn generate --model runs/shakespeare --prompt "ROMEO:" --max-new-tokens 300
  aiayn generate --model runs/shakespeare --prompt "ROMEO:" --temperature 0.8 --top-k 40 --seed 1
  aiayn generate --model runs/shakespeare --num-samples 3 --top-p 0.9
  aiayn generate --model runs/shakespeare --prompt "To be" --greedy

Each sample is printed as prompt + continuation; samples are separated by a line of dashes.
"""


MAX_GENERATED = 1 << 24  # tokens one run writes at most (samples × length): 128 MiB of ids, minutes of CPU


def add_parser(sub) -> None:
    p = sub.add_parser(
        "generate",
        help=summary("generate"),
        description="Continue a prompt with a language model.",
        epilog=EXAMPLES,
        formatter_class=formatter,
    )
    add_model_argument(p)
    p.add_argument("--prompt", default="\n", help="text to continue (default: a newline)")
    p.add_argument("--max-new-tokens", type=int, default=200, help="tokens to generate (default: 200)")
    p.add_argument("--num-samples", type=int, default=1, help="continuations to draw (default: 1)")
    p.add_argument(
        "--temperature", type=float, default=1.0, help="divide log-probs by T in [1e-4, 1e4] (default: 1)"
    )
    p.add_argument("--top-k", type=int, default=None, help="sample among the k most probable tokens")
    p.add_argument("--top-p", type=float, default=None, help="sample within the top-p probability nucleus")
    p.add_argument("--seed", type=int, default=None, help="random seed (default: unseeded)")
    p.add_argument("--greedy", action="store_true", help="take the most probable token each step")
    p.add_argument("--stop-at-eos", action="store_true", help="end a sample when the model emits eos "
                   "(one trained by aiayn on a text stream never does: eos is not in its text; GPT-2 "
                   "does)")  # fmt: skip
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    if args.max_new_tokens < 1 or args.num_samples < 1:
        raise ConfigError("--max-new-tokens and --num-samples must be at least 1")
    if args.max_new_tokens * args.num_samples > MAX_GENERATED:  # the search holds them all at once
        asked = f"--num-samples {args.num_samples} × --max-new-tokens {args.max_new_tokens}"
        raise ConfigError(f"{asked} is over {MAX_GENERATED:,} tokens; ask for fewer (or run several times)")
    if args.greedy and args.num_samples > 1:
        raise ConfigError("--greedy gives one continuation; drop --num-samples")
    given = [f"--{n.replace('_', '-')}" for n, d in SAMPLING_DEFAULTS.items() if getattr(args, n) != d]
    if args.greedy and given:
        raise ConfigError(
            f"--greedy takes the most probable token, so {' and '.join(given)} would be ignored; drop it"
        )
    config = SearchConfig(
        beam=1,
        sample=not args.greedy,
        nbest=args.num_samples,
        temperature=args.temperature,
        top_k=args.top_k,
        top_p=args.top_p,
        seed=args.seed,
        min_len=0 if args.stop_at_eos else args.max_new_tokens,
    )
    generator = quantized(args, Generator.from_dir(args.model, args.device))
    texts = generator.generate(args.prompt, args.max_new_tokens, config)
    print("\n---------------\n".join(texts))
    return 0
