"""What the encoder recipes' reproduce scripts share: time-budgeted runs, the IMDb masked-LM
pre-training (run once, reused), dev scores from a saved model and published test predictions.

``pretrain(imdb)`` trains ``recipes/imdb-mlm.toml`` on ``imdb/unsup.txt.gz`` (validation: the first
dev reviews' text) into ``runs/reproduce-encoder/imdb-mlm`` and records it there
(``pretraining.json``); a later call with the same recipe file, data and overrides reuses that run
instead of training again, so `make reproduce-sst2` and `make reproduce-imdb` fine-tune one encoder
and its minutes are counted once, where they were spent.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import time
from pathlib import Path

from reproduce import check_names, git_commit, machine

from aiayn.atomic import atomic_path, write_bytes, write_json
from aiayn.data.sentences import load_examples
from aiayn.decoding.classifier import TextClassifier
from aiayn.models.common import count_parameters
from aiayn.training.recipe import load_recipe
from aiayn.training.trainer import Trainer
from aiayn.viz.curves import plot_curves, read_metrics

ROOT = Path(__file__).resolve().parents[1]
RUNS = ROOT / "runs" / "reproduce-encoder"
PRETRAINING_FILE = "pretraining.json"


def train(recipe: str, run_dir: Path, overrides: list[str], metric: str = "accuracy") -> dict:
    """Train one recipe into ``run_dir`` from nothing; its record for the results (``metric``: the
    validation figure that picks the best checkpoint)."""
    cfg = load_recipe(ROOT / "recipes" / f"{recipe}.toml", [*overrides, f"out_dir={run_dir}"])
    if run_dir.exists():  # an earlier run of it, replaced once the overrides are known to be good
        shutil.rmtree(run_dir)
    t0 = time.perf_counter()
    result = Trainer(cfg).fit()
    if result["reason"] in ("SIGINT", "SIGTERM"):
        raise SystemExit(f"interrupted ({result['reason']}): no results written")
    valid = [r for r in read_metrics(run_dir) if r.get("split") == "valid"]
    best = max(valid, key=lambda r: r[metric])
    minutes = (time.perf_counter() - t0) / 60
    keys = ("step", "elapsed", "accuracy", "macro_f1", "f1", "loss")
    return {"name": run_dir.name, "recipe": f"recipes/{recipe}.toml", "overrides": overrides,
            "seed": cfg.seed, "updates": result["step"], "stopped_by": result["reason"],
            "minutes": round(minutes, 2),
            "updates_per_minute": round(result["step"] / minutes, 1), "best_step": best["step"],
            "run_dir": str(run_dir.relative_to(ROOT)), "machine": machine(), "commit": git_commit(),
            "valid_curve": [{k: r[k] for k in keys if k in r} for r in valid]}  # fmt: skip


TAG_HELP = (
    "ends the results' and fine-tuning runs' names with -TAG (letters, digits, '.', '_', '-'), e.g. "
    "the machine, so that this run's files sit beside those already in results/"
)


def tagged(name: str, tag: str | None, error) -> str:
    """``name-tag`` (``error``, argparse's, for a tag that cannot name files), or ``name``."""
    check_names(error, ("--tag", tag))
    return name if tag is None else f"{name}-{tag}"


def check(recipe: str, overrides: list[str]) -> None:
    """A later stage's overrides checked now, before the stages that come first train for an hour
    (a ``ConfigError`` naming the key, as ``aiayn train`` would print it)."""
    load_recipe(ROOT / "recipes" / f"{recipe}.toml", [*overrides, "out_dir=runs/reproduce-encoder/check"])


# what each pre-training objective's validation reports, and the figure its record keeps
PRETRAINING_SCORE = {"mlm": ("accuracy", "masked_token_accuracy"), "rtd": ("f1", "detection_f1"),
                     "clm": ("accuracy", "next_piece_accuracy"),
                     "sentiment": ("accuracy", "imdb_dev_accuracy"),
                     "clm-sentiment": ("accuracy", "imdb_dev_accuracy")}  # fmt: skip
# "sentiment" is supervised intermediate training (STILTs, Phang et al. 2018): IMDb's 22,500 labelled
# reviews, classified from scratch by recipes/imdb-finetune.toml for this many minutes
SENTIMENT_MINUTES = 30
# "clm-sentiment": the causal LM ("clm") first, then the same supervised stage from it (look-ahead mask
# kept) for this many minutes, so that the two stages together stay inside the hour
CLM_SENTIMENT_MINUTES = 20
# fine-tuning recipe fields for an encoder of each objective (and its from-scratch twin): the
# detection-trained encoder has no BERT vocabulary-head transform (a classifier never reads it)
FINETUNE_OVERRIDES = {
    "mlm": [],
    "rtd": ["model.head_transform=false", "model.output_bias=false"],
    "clm": [],
    "sentiment": [],
    "clm-sentiment": [],
}


# --precision of the reproduce scripts: the recipes' own fp32, or autocast's (aiayn.training.config)
PRECISIONS = ("fp32", "bf16", "auto")


def precision_overrides(precision: str) -> list[str]:
    """The recipe field for ``precision``: none for the recipes' fp32, so default runs keep their keys."""
    return [] if precision == "fp32" else [f"precision={precision}"]


def precision_tag(precision: str) -> str:
    """What ``precision`` adds to run and results names: ``-bf16``, nothing for fp32."""
    return "" if precision == "fp32" else f"-{precision}"


def results_name(dataset: str, objective: str) -> str:
    """The prefix of a dataset's results files and run directories: ``sst2`` for masked-LM
    pre-training (the first objective, whose files keep their names), ``sst2-rtd`` and so on."""
    return dataset if objective == "mlm" else f"{dataset}-{objective}"


def pretrain(
    imdb: Path, overrides: list[str] = (), objective: str = "mlm", name: str = "", precision: str = "fp32"
) -> dict:
    """The IMDb encoder pre-trained by ``recipes/imdb-{objective}.toml`` on the unlabelled reviews (or,
    ``"sentiment"``, by ``recipes/imdb-finetune.toml`` from scratch on the labelled ones;
    ``"clm-sentiment"``, by that recipe from the causal LM): its record (``reused``: trained by an
    earlier call with the same recipe and arguments; ``minutes``: all its stages'). ``name`` is the
    run directory's, ``imdb-{objective}`` by default: a run with other ``overrides`` names its own,
    so that it does not replace the default one. ``precision`` other than the recipes' fp32 (e.g.
    bf16 autocast) holds for every stage and is added to the default names (``imdb-clm-bf16``)."""
    unsup, dev = imdb / "unsup.txt.gz", imdb / "dev.tsv.gz"
    supervised = objective in ("sentiment", "clm-sentiment")
    needs = (imdb / "train.tsv.gz", dev) if supervised else (unsup, dev)
    for path in needs:
        if not path.is_file():
            raise SystemExit(
                f"{path}: not found (IMDB: the folder holding unsup.txt.gz, train.tsv.gz and dev.tsv.gz)"
            )
    earlier = None  # the stage this one starts from
    if objective == "clm-sentiment":  # the causal LM's own (lowercasing) tokenizer comes with it
        earlier = pretrain(imdb, objective="clm", precision=precision)
        start = [f"init_from={ROOT / earlier['run_dir']}", f"max_minutes={CLM_SENTIMENT_MINUTES}"]
    elif objective == "sentiment":
        start = ["init_from=", "lowercase=true", f"max_minutes={SENTIMENT_MINUTES}"]
    if supervised:
        recipe_name = "imdb-finetune"
        args = [f"dataset={imdb.resolve()}", *start]
    else:
        recipe_name = f"imdb-{objective}"
        args = [f"dataset={unsup.resolve()}", f"valid_dataset={dev.resolve()}"]
    args += [*overrides, *precision_overrides(precision)]
    recipe = (ROOT / "recipes" / f"{recipe_name}.toml").read_bytes()
    stage = earlier["key"] if earlier else ""  # another first stage makes the second one stale
    key = hashlib.sha256(recipe + json.dumps(args).encode() + stage.encode()).hexdigest()[:16]
    run_dir = RUNS / (name or f"imdb-{objective}{precision_tag(precision)}")
    record_file = run_dir / PRETRAINING_FILE
    if record_file.is_file() and (not earlier or earlier["reused"]):  # a retrained first stage: stale too
        record = json.loads(record_file.read_text(encoding="utf-8"))
        if record.get("key") == key:
            print(f"reusing the pre-trained encoder in {run_dir} ({record['minutes']} minutes)", flush=True)
            return {**record, "reused": True}
    metric, name = PRETRAINING_SCORE[objective]
    record = train(recipe_name, run_dir, args, metric)
    record.update(key=key, objective=objective, **{name: max(r[metric] for r in record["valid_curve"])})
    if earlier:  # the time counted against pre-training is both stages'
        record.update(stage_minutes=record["minutes"], first_stage=earlier["run_dir"],
                      minutes=round(record["minutes"] + earlier["minutes"], 2))  # fmt: skip
    write_json(record_file, record)
    return {**record, "reused": False}


def dev_scores(run_dir: Path, dev: Path) -> dict:
    """Accuracy and macro-F1 of the run's best checkpoint on ``dev``, recomputed from the saved model."""
    classifier = TextClassifier.from_dir(run_dir)
    data = load_examples(dev, "all")
    m, _ = classifier.score(data)
    return {**m, "parameters": count_parameters(classifier.model), "examples": len(data)}


def publish_predictions(run_dir: Path, test: Path, out: Path, text_column: str) -> dict:
    """The run's labels for the unlabelled ``test`` table, one per line in its order, written to
    ``out`` (gzipped if it ends in .gz) for separate scoring; what was written, for the results."""
    texts = load_examples(test, "all", text_column, labelled=False).texts
    labels = [top[0][0] for top in TextClassifier.from_dir(run_dir).predict(texts)]
    text = "".join(f"{label}\n" for label in labels)
    with atomic_path(out) as tmp:
        tmp.write_bytes(gzip.compress(text.encode(), mtime=0) if out.suffix == ".gz" else text.encode())
    return {"file": str(out.relative_to(ROOT)), "rows": len(labels), "model": str(run_dir.relative_to(ROOT))}


def curves(run_dir: Path, prefix: str) -> None:
    """The run's learning curves as ``results/{prefix}-*.png``."""
    for png in plot_curves(run_dir, run_dir / "plots"):
        write_bytes(ROOT / "results" / f"{prefix}-{png.name}", png.read_bytes())
