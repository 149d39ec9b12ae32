"""Reproduce the SST-2 result: IMDb masked-LM pre-training, fine-tuning, and the from-scratch baseline.

    python scripts/reproduce_sst2.py PATH/sst2 PATH/imdb                # make reproduce-sst2 SST2=… IMDB=…
    python scripts/reproduce_sst2.py PATH/sst2 PATH/imdb --seeds 1 2 3  # more fine-tuning seeds
    python scripts/reproduce_sst2.py PATH/sst2 PATH/imdb --seeds 2      # add seed 2 to results/sst2.json
    python scripts/reproduce_sst2.py PATH/sst2 PATH/imdb --objective rtd  # replaced-token detection
    python scripts/reproduce_sst2.py PATH/sst2 PATH/imdb --objective clm-sentiment --precision bf16
    python scripts/reproduce_sst2.py PATH/sst2 PATH/imdb --objective clm-sentiment --precision bf16 \
        --dropout 0.2                                                   # both arms at dropout 0.2
    python scripts/reproduce_sst2.py PATH/sst2 PATH/imdb --objective clm-sentiment --precision bf16 \
        --dropout 0.2 --max-steps 1000                        # both arms annealed by update 1,000

``PATH/sst2`` holds GLUE's ``train.tsv`` (or ``.tsv.gz``) and ``dev.tsv``; ``PATH/imdb`` holds the
Large Movie Review Dataset's unlabelled reviews (``unsup.txt.gz``) and ``dev.tsv.gz``. Neither is
bundled (their terms: research use). Steps, each a time-budgeted recipe (the learning-rate schedule
spans its minutes on whatever machine runs it):

1. ``recipes/imdb-mlm.toml`` (``--objective rtd``: ``recipes/imdb-rtd.toml``, ELECTRA's replaced-token
   detection) pre-trains the encoder on the unlabelled reviews, once: a later run
   (this script or ``reproduce_imdb.py``) with the same recipe and data reuses it
   (``encoder_runs.pretrain``);
2. ``recipes/sst2-finetune.toml`` fine-tunes it on SST-2's labelled phrases, once per seed;
3. the same fine-tuning recipe with ``init_from=""`` trains from scratch, once per seed, with the
   same fine-tuning budget: what pre-training buys is the difference.

Every model is chosen on dev accuracy during training (the only labelled split GLUE publishes);
dev accuracy and macro-F1 are then recomputed from the saved best checkpoint. The fine-tuned model
with the best dev accuracy labels the unlabelled test sentences (``--test``, default
``PATH/sst2/test-unlabelled.tsv`` when present) into ``results/sst2-test-predictions.txt`` for
separate scoring. Writes ``results/sst2.json`` (every run: accuracy, macro-F1, minutes, updates,
machine) and ``results/sst2-*.png`` learning curves; with ``--objective rtd`` the files and run
directories are named ``sst2-rtd-*`` and both arms drop BERT's vocabulary-head transform, which the
detection-trained encoder does not have (it shapes no tensor a classifier reads). With ``--objective
clm`` (``recipes/imdb-clm.toml``, a causal language model) the fine-tuned arm keeps the pre-trained
look-ahead mask, while the scratch arm is the default encoder, which sees both ways: the baseline a
user has without pre-training. ``--objective clm-sentiment`` trains the causal LM (reused when present),
then IMDb's labelled reviews from it (``encoder_runs.CLM_SENTIMENT_MINUTES``), and fine-tunes from that
at half the recipe's learning rate (``PRETRAINED_ARM``; run directories
``sst2-clm-sentiment-finetune-lr1.5e-4-seed*``); the pre-training minutes counted are both stages'.
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
from reproduce import command_line, git_commit, machine  # noqa: E402

from aiayn.atomic import write_json  # noqa: E402
from aiayn.data.labelled import find_table  # noqa: E402
from aiayn.errors import AiaynError  # noqa: E402

# the fine-tuned arm's own recipe fields, by objective (the scratch arm keeps the recipe's): the encoder
# that read IMDb's labels after the causal LM fine-tunes at half the recipe's learning rate, the one
# variant tried on it (docs/results.md)
PRETRAINED_ARM = {"clm-sentiment": ["lr=1.5e-4"]}


def arms(
    objective: str,
    pretrained: Path,
    sst2: Path,
    precision: str = "fp32",
    dropout: float | None = None,
    max_steps: int | None = None,
) -> dict[str, tuple[str, list[str]]]:
    """Each arm's run-name infix and recipe overrides (without the seed): ``finetune`` from the
    ``pretrained`` encoder (``-lr1.5e-4`` and so on when ``PRETRAINED_ARM`` changes its recipe),
    ``scratch`` from nothing; both in ``precision`` and, when given, with ``dropout`` instead of the
    recipe's and ``max_steps`` instead of its cap (the cosine ends at that update or at the budget,
    whichever comes first) — the same for both arms, so that the comparison stays one of starting
    points."""
    data = [f"dataset={sst2.resolve()}", *FINETUNE_OVERRIDES[objective]]
    data += encoder_runs.precision_overrides(precision)
    data += [] if dropout is None else [f"model.dropout={dropout:g}"]
    data += [] if max_steps is None else [f"max_steps={max_steps}"]
    extra = PRETRAINED_ARM.get(objective, [])
    infix = "".join(f"-{o.replace('=', '')}" for o in extra)
    return {"finetune": (f"finetune{infix}", [*data, f"init_from={pretrained}", *extra]),
            "scratch": ("scratch", [*data, "init_from="])}  # fmt: skip


def earlier_runs(pre: dict, seeds: list[int], path: Path, overrides: dict[str, list[str]]) -> list[dict]:
    """The runs of other seeds that ``path`` (results/sst2.json) holds from the same pre-training and
    with the same recipe overrides per kind (so that ``--seeds 2`` after a run of seed 1 adds to
    it); none if it was made from another pre-training."""
    if not path.is_file():
        return []
    old = json.loads(path.read_text())
    # the same pre-training: its directory, its recipe's key and its own time (an encoder trained
    # again in that directory, after a changed first stage say, differs in these)
    if any(old.get("pretraining", {}).get(k) != pre.get(k) for k in ("run_dir", "key", "minutes")):
        return []

    def same_recipe(run: dict) -> bool:
        unseeded = [o for o in run.get("overrides", []) if not o.startswith("seed=")]
        return unseeded == overrides.get(run.get("kind"))

    return [r for r in old.get("runs", []) if r.get("seed") not in seeds and same_recipe(r)]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sst2", type=Path, help="folder with SST-2's train.tsv[.gz] and dev.tsv")
    ap.add_argument("imdb", type=Path, help="folder with IMDb's unsup.txt.gz and dev.tsv.gz (pre-training)")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument(
        "--objective",
        choices=("mlm", "rtd", "clm", "sentiment", "clm-sentiment"),
        default="mlm",
        help="pre-training: masked-LM (recipes/imdb-mlm.toml), replaced-token detection (imdb-rtd.toml), "
        "causal LM (imdb-clm.toml), supervised, IMDb's labelled reviews (sentiment: imdb-finetune.toml "
        "from scratch) or both (clm-sentiment: the causal LM, then imdb-finetune.toml from it)",
    )
    ap.add_argument("--precision", choices=encoder_runs.PRECISIONS, default="fp32",
                    help="every stage's and arm's arithmetic (default: the recipes' fp32); bf16 autocast "
                         "makes more updates where the CPU has fast bfloat16, and names its own runs and "
                         "results, e.g. sst2-clm-sentiment-bf16")  # fmt: skip
    ap.add_argument("--dropout", type=float,
                    help="both arms' dropout instead of the recipe's 0.1 (runs and results named "
                         "…-dropout0.2 and so on)")  # fmt: skip
    ap.add_argument("--max-steps", type=int,
                    help="both arms' schedule ends by this update instead of at the 15-minute budget (runs "
                         "and results named …-steps1000 and so on)")  # fmt: skip
    ap.add_argument("--test", type=Path, help="unlabelled test table (default: SST2/test-unlabelled.tsv)")
    ap.add_argument("--tag", help=encoder_runs.TAG_HELP)
    args = ap.parse_args()
    train_file, dev = find_table(args.sst2, "train"), find_table(args.sst2, "valid")
    if train_file is None or dev is None:
        ap.error(f"{args.sst2} must hold train.tsv (or .tsv.gz) and dev.tsv")
    test = args.test or args.sst2 / "test-unlabelled.tsv"
    if args.test and not args.test.is_file():
        ap.error(f"--test {args.test}: no such file")
    if args.dropout is not None and not 0 <= args.dropout < 1:
        ap.error(f"--dropout {args.dropout:g}: give a probability in [0, 1)")
    if args.max_steps is not None and args.max_steps < 1:
        ap.error(f"--max-steps {args.max_steps}: give a positive number of updates")
    started = time.perf_counter()
    out = {"task": "SST-2 (GLUE) dev accuracy", "machine": machine(), "commit": git_commit(), "runs": [],
           "command": command_line()}  # fmt: skip
    name = encoder_runs.results_name("sst2", args.objective)
    name += encoder_runs.precision_tag(args.precision)
    name += "" if args.dropout is None else f"-dropout{args.dropout:g}"
    name += "" if args.max_steps is None else f"-steps{args.max_steps}"
    name = encoder_runs.tagged(name, args.tag, ap.error)
    results = ROOT / "results" / f"{name}.json"
    setting = (args.precision, args.dropout, args.max_steps)
    planned = arms(args.objective, RUNS / "pre-trained", args.sst2, *setting)
    for _, overrides in planned.values():  # both arms' fine-tuning, checked before the pre-training's hour
        encoder_runs.check("sst2-finetune", [*overrides, f"seed={args.seeds[0]}"])
    pre = out["pretraining"] = pretrain(args.imdb, objective=args.objective, precision=args.precision)
    runs = arms(args.objective, ROOT / pre["run_dir"], args.sst2, *setting)
    out["runs"] = earlier_runs(pre, args.seeds, results, {kind: o for kind, (_, o) in runs.items()})
    for seed in args.seeds:  # seed by seed, so that an early stop leaves both kinds of the first seeds
        for kind, (infix, overrides) in runs.items():
            record = train("sst2-finetune", RUNS / f"{name}-{infix}-seed{seed}", [*overrides, f"seed={seed}"])
            record.update(kind=kind, dev=dev_scores(ROOT / record["run_dir"], dev))
            before = pre["minutes"] if kind == "finetune" else 0  # pre-training counted where it is used
            record["total_minutes"] = round(record["minutes"] + before, 2)
            out["runs"].append(record)
            write_json(results, out)  # kept up to date as runs finish
    for kind in ("finetune", "scratch"):
        accs = [r["dev"]["accuracy"] for r in out["runs"] if r["kind"] == kind]
        out[f"{kind}_mean_accuracy"] = round(sum(accs) / len(accs), 2)
    best = max((r for r in out["runs"] if r["kind"] == "finetune"), key=lambda r: r["dev"]["accuracy"])
    if test.is_file():
        predictions = ROOT / "results" / f"{name}-test-predictions.txt"
        out["test_predictions"] = publish_predictions(ROOT / best["run_dir"], test, predictions, "sentence")
    out["end_to_end_minutes"] = round((time.perf_counter() - started) / 60, 2)
    # imdb-clm-sentiment-bf16 and so on; -TAG too: another machine's pre-training keeps its own curves
    curves(ROOT / pre["run_dir"], encoder_runs.tagged(Path(pre["run_dir"]).name, args.tag, ap.error))
    for infix, _ in runs.values():
        curves(RUNS / f"{name}-{infix}-seed{args.seeds[0]}", f"{name}-{infix}-seed{args.seeds[0]}")
    write_json(results, out)
    summary = {k: v for k, v in out.items() if k not in ("runs", "pretraining")}
    summary["runs"] = [(r["name"], r["dev"]["accuracy"], r["total_minutes"]) for r in out["runs"]]
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    try:
        sys.exit(main())
    except AiaynError as e:  # a recipe, override, dataset or run directory that is wrong: one line
        sys.exit(f"{Path(__file__).name}: error: {e}")
