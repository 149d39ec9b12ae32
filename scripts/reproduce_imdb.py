"""Reproduce the IMDb result: fine-tune the IMDb masked-LM encoder on the labelled reviews.

    python scripts/reproduce_imdb.py PATH/imdb                   # make reproduce-imdb IMDB=PATH/imdb
    python scripts/reproduce_imdb.py PATH/imdb max_minutes=30    # recipe fields override
    python scripts/reproduce_imdb.py PATH/imdb --objective rtd   # on the replaced-token detector
    python scripts/reproduce_imdb.py PATH/imdb --long-text head+tail   # the recipe before windows
    python scripts/reproduce_imdb.py PATH/imdb --objective clm --pretrain-minutes 60   # an hour's LM
    python scripts/reproduce_imdb.py PATH/imdb --objective clm --pretrain-minutes 60 --precision bf16

``PATH/imdb`` holds the Large Movie Review Dataset (Maas et al. 2011) as ``unsup.txt.gz``
(unlabelled reviews), ``train.tsv.gz`` and ``dev.tsv.gz`` (``label<TAB>text``); it is not bundled
(research use only). Steps, each a time-budgeted recipe:

1. ``recipes/imdb-mlm.toml`` pre-trains the encoder on the unlabelled reviews, unless
   ``reproduce_sst2.py`` (or an earlier run of this script) already did with the same recipe and data:
   the run is then reused (``encoder_runs.pretrain``) and its minutes reported, not spent again;
2. ``recipes/imdb-finetune.toml`` fine-tunes it on the 22,500 training reviews, each read as
   overlapping windows of 126 pieces (``long_text=windows``: every window a training example, a
   review's logits the mean of its windows' at validation and prediction; ``eval_every=800``, as a
   validation now reads every window; ``max_steps=20000``, so that the clock ends it), choosing the
   checkpoint on dev accuracy. ``--long-text head+tail`` keeps the recipe's own policy (each review's
   head and tail), measured lower, and names its files without the ``-windows`` suffix, as they were.
   (The recipe file itself is unchanged: the SST-2 route's supervised stage reads it, and its bytes key
   that stage's reuse.)

Dev accuracy and macro-F1 are recomputed from the saved best checkpoint, which then labels the
official test reviews (``PATH/imdb/test-unlabelled.tsv.gz`` when present) into
``results/imdb-windows-test-predictions.txt.gz`` for separate scoring. Writes
``results/imdb-windows.json`` and ``results/imdb-windows-*.png`` learning curves (``--objective clm``:
``recipes/imdb-clm.toml``'s encoder, files named ``imdb-clm-windows*``; overrides that change results
add themselves to the name: ``max_minutes=30`` writes ``imdb-windows-max_minutes30.json``).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

import encoder_runs  # noqa: E402
from encoder_runs import FINETUNE_OVERRIDES, RUNS, curves, dev_scores, pretrain, publish_predictions, train  # noqa: E402
from reproduce import command_line, git_commit, machine, named_overrides, names_a_file  # noqa: E402

from aiayn.atomic import write_json  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402

# --long-text: the results' name suffix and the recipe overrides (none: the recipe's own head+tail); the
# clock, not the recipe's cap of 6,000 updates, ends the windows hour, which bf16 on a fast CPU passes
LONG_TEXT = {
    "windows": ("-windows", ["long_text=windows", "eval_every=800", "max_steps=20000"]),
    "head+tail": ("", []),
}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("imdb", type=Path, help="folder with unsup.txt.gz, train.tsv.gz and dev.tsv.gz")
    ap.add_argument("overrides", nargs="*", help="fine-tuning recipe fields (key=value), e.g. seed=2")
    ap.add_argument(
        "--objective",
        choices=("mlm", "rtd", "clm"),
        default="mlm",
        help="pre-training: masked-LM (recipes/imdb-mlm.toml), replaced-token detection or causal LM",
    )
    ap.add_argument("--long-text", choices=tuple(LONG_TEXT), default="windows",
                    help="how fine-tuning reads a review (default: windows, measured best)")  # fmt: skip
    ap.add_argument("--pretrain-minutes", type=float, default=0,
                    help="the pre-training budget (default: the recipe's max_minutes); another budget names "
                         "its own runs and results, e.g. imdb-clm60-windows")  # fmt: skip
    ap.add_argument("--precision", choices=encoder_runs.PRECISIONS, default="fp32",
                    help="both stages' arithmetic (default: the recipes' fp32); bf16 autocast makes more "
                         "updates where the CPU has fast bfloat16, and names its own runs and results, "
                         "e.g. imdb-clm60-bf16-windows")  # fmt: skip
    ap.add_argument("--tag", help=encoder_runs.TAG_HELP)
    args = ap.parse_args()
    if not args.pretrain_minutes >= 0:
        ap.error(f"--pretrain-minutes {args.pretrain_minutes:g}: give minutes ≥ 0 (0: the recipe's)")
    dev, test = args.imdb / "dev.tsv.gz", args.imdb / "test-unlabelled.tsv.gz"
    if not (args.imdb / "train.tsv.gz").is_file():
        ap.error(f"{args.imdb} must hold train.tsv.gz, dev.tsv.gz and unsup.txt.gz")
    started = time.perf_counter()
    out = {"task": "IMDb (Maas et al. 2011) dev accuracy", "machine": machine(), "commit": git_commit(),
           "command": command_line()}  # fmt: skip
    suffix, reading = LONG_TEXT[args.long_text]
    prefix = encoder_runs.results_name("imdb", args.objective)
    budget, pre_name = [], ""
    if args.pretrain_minutes:
        budget, pre_name = [f"max_minutes={args.pretrain_minutes:g}"], f"{prefix}{args.pretrain_minutes:g}"
    precision = encoder_runs.precision_overrides(args.precision)
    tag = encoder_runs.precision_tag(args.precision)
    pre_name += tag if pre_name else ""  # unnamed: pretrain()'s directory, shared with SST-2
    # the overrides that change what is trained name it too: another command never replaces these results
    name = (pre_name or prefix + tag) + suffix + named_overrides(args.overrides)
    if not names_a_file(name):  # an override holding a path: said now, not after an hour
        ap.error(f"the name made from the overrides, {name!r}, cannot name a file (letters, digits, '.', "
                 "'_', '-' only): leave such values out of the overrides")  # fmt: skip
    name = encoder_runs.tagged(name, args.tag, ap.error)
    tuning = [f"dataset={args.imdb.resolve()}", *FINETUNE_OVERRIDES[args.objective], *reading, *precision,
              *args.overrides]  # fmt: skip
    encoder_runs.check("imdb-finetune", [*tuning, "init_from=PRETRAINED"])  # before the pre-training's hour
    pre = pretrain(args.imdb, budget, objective=args.objective, name=pre_name, precision=args.precision)
    out["pretraining"] = pre
    overrides = [*tuning[:1], f"init_from={ROOT / pre['run_dir']}", *tuning[1:]]
    run = train("imdb-finetune", RUNS / f"{name}-finetune", overrides)
    run["dev"] = dev_scores(ROOT / run["run_dir"], dev)
    run["total_minutes"] = round(run["minutes"] + pre["minutes"], 2)  # pre-training counted
    out["finetune"] = run
    write_json(ROOT / "results" / f"{name}.json", out)
    if test.is_file():
        predictions = ROOT / "results" / f"{name}-test-predictions.txt.gz"
        out["test_predictions"] = publish_predictions(ROOT / run["run_dir"], test, predictions, "text")
    out["end_to_end_minutes"] = round((time.perf_counter() - started) / 60, 2)
    curves(RUNS / f"{name}-finetune", f"{name}-finetune")
    write_json(ROOT / "results" / f"{name}.json", out)
    print(json.dumps({"dev": run["dev"], "minutes": run["minutes"], "updates": run["updates"]}, indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AiaynError as e:  # a recipe, override, dataset or run directory that is wrong: one line
        sys.exit(f"{Path(__file__).name}: error: {e}")
