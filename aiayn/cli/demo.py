"""``aiayn demo`` (``make demo``): the main job on the bundled data, start to finish on a CPU.

Trains the Multi30k German→English recipe for a bounded time, then translates a few test
sentences and scores the whole test set (test2016) with sacreBLEU.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import math
import os
import platform
import signal
import sys
import time
from pathlib import Path

import torch

from aiayn.atomic import write_text
from aiayn.cli.commands import summary
from aiayn.decoding.options import SearchConfig
from aiayn.device import cpu_flags
from aiayn.errors import ConfigError, DataError
from aiayn.outputs import check_output
from aiayn.temporaries import remove_tree
from aiayn.training.config import MAX_MINUTES
from aiayn.training.rundir import RunLock

RECIPE = Path(__file__).resolve().parents[2] / "recipes" / "multi30k-de-en.toml"
DEMO_MARK = ".aiayn-demo"  # marks a run directory that ``aiayn demo`` made (and may replace)
REFERENCE = RECIPE.parents[1] / "results" / "demo.json"  # the README's demo figures and their machines
# Variables that make ATen, fbgemm (int8), MKL and oneDNN use a lesser instruction set (e.g. AVX2 on an
# AVX-512 CPU): a way to measure what a slower CPU gets, which a result must then say it was measured under.
ISA_LIMITS = ("ATEN_CPU_CAPABILITY", "FBGEMM_ENABLE_INSTRUCTIONS", "MKL_ENABLE_INSTRUCTIONS",
              "ONEDNN_MAX_CPU_ISA")  # fmt: skip
# /proc/cpuinfo flags, widest first, and how results name them: a CPU's model name alone does not tell
# its speed (one name covers generations with and without AVX-512, far apart on the tiny model).
VECTOR_ISAS = (("amx_bf16", "AMX"), ("avx512_bf16", "AVX-512 BF16"), ("avx512f", "AVX-512"), ("avx2", "AVX2"))


def demo_config(out: Path, minutes: float):
    """The de→en recipe as the demo trains it: the inverse-√ schedule by steps, with a long, low
    warm-up (1,000 updates) whose learning rate is still rising when a budget of minutes ends. A run
    cut that short learns more so than with the recipe's cosine spread over the budget
    (``horizon="budget"``), whether that warms up briefly or for most of the budget: annealing does
    not pay before the model has learned much (docs/results.md, "make demo")."""
    from aiayn.training.recipe import load_recipe

    overrides = [f"out_dir={out}", f"max_minutes={minutes}", "schedule=inverse_sqrt", "horizon=steps",
                 "warmup=1000", "eval_every=1000", "eval_max_sentences=300"]  # fmt: skip
    return load_recipe(RECIPE, overrides)


def add_parser(sub) -> None:
    p = sub.add_parser(
        "demo",
        help=summary("demo"),
        epilog="example:\n  aiayn demo --minutes 10 --out runs/demo",
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--minutes", type=float, default=10.0, help="training time budget (default 10)")
    p.add_argument("--out", default="runs/demo", help="run directory; a previous demo's is replaced")
    p.add_argument("--force", action="store_true", help="replace --out even if it holds another run")
    p.add_argument(
        "--json", metavar="FILE", help="write the figures (BLEU, updates, updates/s, machine) to FILE"
    )
    p.add_argument("--beam", type=int, default=4, help="beam size for the test set (default 4)")
    p.set_defaults(run=run)


def run(args: argparse.Namespace) -> int:
    from aiayn.cli.evaluate import score
    from aiayn.data.corpus import load_parallel
    from aiayn.decoding.translator import Translator
    from aiayn.training.budget import SPEED_UPDATES
    from aiayn.training.trainer import Trainer

    if not (math.isfinite(args.minutes) and 0 < args.minutes <= MAX_MINUTES):
        raise ConfigError(f"--minutes={args.minutes} must be a number in (0, {MAX_MINUTES:g}]")
    search = SearchConfig(beam=args.beam)  # every check before the training, and before --out is replaced
    references = read_references(REFERENCE)
    out = Path(args.out)
    if not (out / DEMO_MARK).is_file():  # a previous demo's run is ours to replace; nothing else is
        check_output(out, directory=True, force=args.force, option="--out")
    if args.json:
        check_output(args.json, (RECIPE, REFERENCE), option="--json")
        if out.resolve() in Path(args.json).resolve().parents:  # the run replaces --out as a whole
            raise ConfigError(f"--json {args.json} is inside --out {out}, which the demo replaces (and whose "
                              "files it would write over); give a file elsewhere")  # fmt: skip
    cfg = demo_config(out, args.minutes)  # the recipe and the test set read before the old run goes
    if args.beam > cfg.vocab_size:  # the search refuses it, but only after the minutes of training
        raise ConfigError(f"--beam {args.beam} exceeds the vocabulary the demo trains ({cfg.vocab_size} "
                          "tokens); use less")  # fmt: skip
    test = load_parallel("multi30k", "test", "de", "en")
    if out.exists():  # the last demo's run goes, unless a demo still trains there (its lock says so)
        RunLock(out, str(out)).release()
        remove_tree(out)  # a delete cut short leaves a temporary, not half a run
    print(f"aiayn demo: training {RECIPE.name} for {args.minutes:g} minutes into {out}", file=sys.stderr)
    t0 = time.perf_counter()
    trainer = Trainer(cfg)
    (out / DEMO_MARK).write_text("a run of aiayn demo: the next demo replaces it\n", encoding="utf-8")
    result = trainer.fit()
    updates = result["step"]
    if result["reason"] in ("SIGINT", "SIGTERM"):  # the user stopped it: no decoding, as aiayn train
        print(f"aiayn demo: stopped by {result['reason']} after {updates} updates; the run is in {out}",
              file=sys.stderr)  # fmt: skip
        return 128 + getattr(signal, result["reason"])
    # the speed in updates of the recipe's size, which the README's figures count: where the budget was
    # too short for them (short_budget), it is what the run measured before it went on in smaller ones
    train_s, speed = time.perf_counter() - t0, updates / max(trainer.elapsed, 1e-9)
    halved = trainer.max_tokens != cfg.max_tokens
    recipe_speed = trainer.checked_rate if halved else speed  # the trainer times updates before halving

    translator = Translator.from_dir(out)
    srcs, refs = (list(side) for side in zip(*test))
    t0 = time.perf_counter()
    hyps = translator.translate(srcs, search)
    decode_s = time.perf_counter() - t0
    print("\nexample translations (test2016):")
    for i in (0, 1, 2, 3, 4):
        print(f"  de:  {srcs[i]}\n  ref: {refs[i]}\n  hyp: {hyps[i]}\n")
    scores, signatures = score(hyps, refs)
    print(f"test2016 BLEU {scores['bleu']:.2f} (lowercased {scores['bleu_lc']:.2f}), "
          f"chrF {scores['chrf']:.2f}, beam {args.beam}")  # fmt: skip
    print(f"signature: {signatures['bleu']}")
    print(f"training {train_s / 60:.1f} min, decoding 1,000 sentences {decode_s:.1f} s; model in {out}/best")
    print(f"this machine: {speed:.2f} updates/s, {updates:,} updates in {args.minutes:g} minutes of training")
    if halved:
        print(f"  in batches of max_tokens={trainer.max_tokens} after the first {SPEED_UPDATES}: at the "
              f"recipe's {cfg.max_tokens} this machine ran {recipe_speed:.2f} updates/s, and the budget held "
              "under a third of max_steps (short_budget)")  # fmt: skip
    for line in against_references(recipe_speed, references):
        print(line)
    if args.json:
        report = {**scores, "beam": args.beam, "updates": updates, "minutes": args.minutes,
                  "updates_per_s": round(recipe_speed, 3),  # of the recipe's max_tokens (README's figures)
                  "max_tokens": trainer.max_tokens, "updates_per_s_as_run": round(speed, 3),
                  "training_minutes": round(train_s / 60, 2),
                  "machine": machine(), "signature": signatures["bleu"]}  # fmt: skip
        write_text(args.json, json.dumps(report, indent=2) + "\n")
    print(f"\nserve it (an API and a page that shows its attention): .venv/bin/aiayn serve --model {out}")
    return 0


REFERENCE_FIELDS = {"bleu": float, "updates": int, "minutes": float, "updates_per_s": float, "machine": str}


def read_references(path: Path) -> list[dict]:
    """The README's demo runs (``results/demo.json``: a list of their figures), or [] where there is no
    such file; a ``DataError`` naming the file for one that is not that list."""
    if not path.is_file():
        return []
    try:
        runs = json.loads(path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as e:
        raise DataError(f"{path} is not valid JSON ({e}); restore it (git checkout {path.name})") from None
    if not isinstance(runs, list) or not all(map(_is_reference, runs)):
        raise DataError(f"{path} is not a list of demo runs with {', '.join(REFERENCE_FIELDS)}; restore it")
    return runs


def _is_reference(run: object) -> bool:
    """Whether ``run`` holds every ``REFERENCE_FIELDS`` field, of its type (an int for a float)."""
    if not isinstance(run, dict):
        return False
    kinds = {k: (int, float) if kind is float else kind for k, kind in REFERENCE_FIELDS.items()}
    return all(isinstance(run.get(k), kind) and not isinstance(run.get(k), bool) for k, kind in kinds.items())


def against_references(speed: float, references: list[dict]) -> list[str]:
    """How this machine's updates/s compares with each of the README's demo runs; where it is slower than
    the first (the README's figure), the --minutes that make that run's updates here. The demo's schedule
    counts updates, not time (inverse-√), so equal updates follow the same learning-rate curve."""
    lines = []
    for ref in references:
        figure = f"{ref['bleu']:.2f} BLEU, {ref['updates']:,} updates in {ref['minutes']:g} minutes"
        ratio = speed / ref["updates_per_s"]
        lines.append(f"the README's {figure} came from {ref['updates_per_s']:.2f} updates/s on "
                     f"{ref['machine']}: this machine ran {ratio:.2f}× as fast")  # fmt: skip
    if references and speed < 0.9 * references[0]["updates_per_s"]:
        first = references[0]
        minutes = math.ceil(first["updates"] / max(speed, 1e-9) / 60)
        lines.append(f"to train the README run's {first['updates']:,} updates at this machine's speed: "
                     f".venv/bin/aiayn demo --minutes {minutes}")  # fmt: skip
    return lines


def machine() -> str:
    """The CPU model and its widest vector instructions, its core count, the torch build and any
    instruction-set limit in force (ISA_LIMITS): what a time-bounded figure depends on."""
    cpuinfo = ""
    with contextlib.suppress(OSError):
        cpuinfo = Path("/proc/cpuinfo").read_text(encoding="utf-8")
    limits = " ".join(f"{k}={os.environ[k]}" for k in ISA_LIMITS if os.environ.get(k))
    described = f"{describe_cpu(cpuinfo)}, {os.cpu_count()} cores, torch {torch.__version__}"
    return f"{described}, limited by {limits}" if limits else described


def describe_cpu(cpuinfo: str) -> str:
    """MODEL family F model M (ISA) from the text of /proc/cpuinfo: the first processor's model name,
    its x86 family and model numbers (a virtual machine's model name is often generic, one name for
    several generations of a vendor's CPUs: the numbers tell them apart) and the widest vector
    instructions its flags list; what is not known is left out."""
    block = cpuinfo.split("\n\n", 1)[0]  # the first processor's
    pairs = (line.partition(":") for line in block.splitlines())
    fields = {key.strip(): value.strip() for key, _, value in pairs}
    model = fields.get("model name") or platform.processor() or platform.machine()
    if fields.get("cpu family") and fields.get("model"):
        model += f" family {fields['cpu family']} model {fields['model']}"
    flags = cpu_flags(cpuinfo)
    isa = next((name for flag, name in VECTOR_ISAS if flag in flags), None)
    return f"{model} ({isa})" if isa else model
