"""Reproduce the SST-2 result: masked-LM pre-training, fine-tuning, and the from-scratch baseline.

    python scripts/reproduce_sst2.py PATH/sst2                 # make reproduce-sst2 SST2=PATH/sst2
    python scripts/reproduce_sst2.py PATH/sst2 --seeds 1 2 3   # more fine-tuning seeds

``PATH/sst2`` holds GLUE's ``train.tsv`` (or ``.tsv.gz``) and ``dev.tsv``; SST-2 is not bundled
(its terms are unclear; GLUE distributes it: https://gluebenchmark.com/tasks). Steps, each a
time-budgeted recipe (the learning-rate schedule spans its minutes on whatever machine runs it):

1. ``recipes/sst2-mlm.toml`` pre-trains the encoder on the training sentences (text only);
2. ``recipes/sst2-finetune.toml`` fine-tunes it, once per seed;
3. the same fine-tuning recipe with ``init_from=""`` trains from scratch, once per seed, with the
   same fine-tuning budget: what pre-training buys is the difference.

Every model is chosen on dev accuracy during training (the only labelled split GLUE publishes);
dev accuracy and macro-F1 are then recomputed from the saved best checkpoint with
``TextClassifier``. Writes ``results/sst2.json`` (every run: accuracy, macro-F1, minutes, updates,
parameters, machine) and ``results/sst2-*.png`` learning curves.
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from reproduce import git_commit, machine  # noqa: E402

from aiayn.atomic import write_json  # noqa: E402
from aiayn.data.labelled import find_table  # noqa: E402
from aiayn.data.sentences import load_examples  # noqa: E402
from aiayn.decoding.classifier import TextClassifier  # noqa: E402
from aiayn.models.common import count_parameters  # noqa: E402
from aiayn.training.recipe import load_recipe  # noqa: E402
from aiayn.training.trainer import Trainer  # noqa: E402
from aiayn.viz.curves import plot_curves, read_metrics  # noqa: E402

RUNS = ROOT / "runs" / "reproduce-sst2"


def train(recipe: str, name: str, overrides: list[str]) -> dict:
    """Train one recipe into ``RUNS/name`` from nothing; its record for the results."""
    run_dir = RUNS / name
    if run_dir.exists():
        shutil.rmtree(run_dir)
    cfg = load_recipe(ROOT / "recipes" / f"{recipe}.toml", [*overrides, f"out_dir={run_dir}"])
    t0 = time.time()
    result = Trainer(cfg).fit()
    if result["reason"] in ("SIGINT", "SIGTERM"):
        raise SystemExit(f"interrupted ({result['reason']}): no results written")
    valid = [r for r in read_metrics(run_dir) if r.get("split") == "valid"]
    best = max(valid, key=lambda r: r["accuracy"])
    keys = ("step", "elapsed", "accuracy", "macro_f1", "loss")
    return {"name": name, "recipe": f"recipes/{recipe}.toml", "overrides": overrides, "seed": cfg.seed,
            "updates": result["step"], "stopped_by": result["reason"],
            "minutes": round((time.time() - t0) / 60, 2), "best_step": best["step"],
            "run_dir": str(run_dir.relative_to(ROOT)),
            "valid_curve": [{k: r[k] for k in keys if k in r} for r in valid]}  # fmt: skip


def dev_scores(run_dir: Path, dev: Path) -> dict:
    """Accuracy and macro-F1 of the run's best checkpoint on ``dev``, recomputed from the saved model."""
    classifier = TextClassifier.from_dir(run_dir)
    data = load_examples(dev, "all")
    m, _ = classifier.score(data)
    return {**m, "parameters": count_parameters(classifier.model), "examples": len(data)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("sst2", type=Path, help="folder with SST-2's train.tsv[.gz] and dev.tsv")
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    args = ap.parse_args()
    train_file, dev = find_table(args.sst2, "train"), find_table(args.sst2, "valid")
    if train_file is None or dev is None:
        ap.error(f"{args.sst2} must hold train.tsv (or .tsv.gz) and dev.tsv")
    started, commit = time.time(), git_commit()
    out = {"task": "SST-2 (GLUE) dev accuracy", "machine": machine(), "commit": commit, "runs": []}
    data = [f"dataset={args.sst2.resolve()}"]
    pre = train("sst2-mlm", "mlm", [f"dataset={train_file.resolve()}", f"valid_dataset={dev.resolve()}"])
    pre["masked_token_accuracy"] = max(r["accuracy"] for r in pre["valid_curve"])
    out["pretraining"] = pre
    for kind, init in (("finetune", RUNS / "mlm"), ("scratch", "")):
        for seed in args.seeds:
            record = train(
                "sst2-finetune", f"{kind}-seed{seed}", [*data, f"init_from={init}", f"seed={seed}"]
            )
            record.update(kind=kind, dev=dev_scores(ROOT / record["run_dir"], dev))
            record["total_minutes"] = round(
                record["minutes"] + (pre["minutes"] if kind == "finetune" else 0), 2
            )
            out["runs"].append(record)
            write_json(ROOT / "results" / "sst2.json", out)  # kept up to date as runs finish
    for kind in ("finetune", "scratch"):
        accs = [r["dev"]["accuracy"] for r in out["runs"] if r["kind"] == kind]
        out[f"{kind}_mean_accuracy"] = round(sum(accs) / len(accs), 2)
    out["end_to_end_minutes"] = round((time.time() - started) / 60, 2)
    for name in ("mlm", f"finetune-seed{args.seeds[0]}", f"scratch-seed{args.seeds[0]}"):
        for png in plot_curves(RUNS / name, RUNS / name / "plots"):
            shutil.copy(png, ROOT / "results" / f"sst2-{name}-{png.name}")
    write_json(ROOT / "results" / "sst2.json", out)
    summary = {k: v for k, v in out.items() if k not in ("runs", "pretraining")}
    summary["runs"] = [
        (r["name"], r["dev"]["accuracy"], r["dev"]["macro_f1"], r["total_minutes"]) for r in out["runs"]
    ]
    print(json.dumps(summary, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
