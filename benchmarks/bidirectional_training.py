"""Does the bidirectional model earn its place? Four arms at equal total wall-clock on Multi30k.

Each direction and seed runs, one arm at a time on the same machine, every arm under the same
training budget ``--minutes``: the plain arm's clock counts its updates only (evaluations excluded, as in
``scripts/reproduce.py``), while the right-to-left stage of the other arms is charged its whole process,
start-up and evaluations included (``scripts/reproduce_bidirectional.py``): a bias against them, about 0.2 of
10 minutes in ``results/bidirectional-cache.json``:

1. ``plain``: the recipe's model (``scripts/reproduce.py``);
2. ``cached``: the bidirectional model on cached right-to-left translations
   (``scripts/reproduce_bidirectional.py``: a right-to-left model in ``--r2l-share`` of the budget, its
   translations of the training set, the bidirectional model in the rest);
3. ``distill``: the plain model trained on the references plus the same right-to-left model's
   translations (turned left to right) in the same remaining time: the same extra data, no new
   sublayer (a control);
4. ``rerank``: the plain model trained for the budget less the right-to-left model's time, its beam's
   n-best reranked by both models' scores (``aiayn translate --rerank-with``).

Arms 3 and 4 reuse arm 2's right-to-left model and cache and are charged their time. Every arm is
then chosen on validation and scored on test2016 (beam 5, sacreBLEU cased, lowercased, chrF) by
``scripts/reproduce.py``. ``--equal-updates`` adds the bidirectional model trained for as many
updates as the plain one made (no clock), and each arm's updates per training minute give the cost
of an update against plain. ``--variants`` adds further cached arms (e.g. memory dropout).
``--memory-ceiling`` asks what the memory gives at best, whatever the time: the bidirectional model
at the plain model's updates, its cache made by a right-to-left model trained as long as the plain one.

Results: results/bidirectional/NAME.json per arm, the summary in results/bidirectional-cache.json
(arms already there are not run again: delete to redo).

    python benchmarks/bidirectional_training.py --minutes 10 --directions de-en en-de --seeds 1
    python benchmarks/bidirectional_training.py --seeds 2 --arms plain cached
    python benchmarks/bidirectional_training.py --variants memdrop=r2l_memory_dropout=0.2
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "scripts"))

from provenance import run_main, write_result  # noqa: E402
from reproduce_bidirectional import build_cache, launcher, pipeline, r2l_overrides, run  # noqa: E402

from aiayn.atomic import write_bytes  # noqa: E402
from aiayn.cli.demo import machine  # noqa: E402

OUT = ROOT / "results" / "bidirectional"
SUMMARY = ROOT / "results" / "bidirectional-cache.json"
MAKE = {  # the make targets' overrides (without en→de's two members: one model per arm here)
    "de-en": ["weight_decay=0.1"],
    "en-de": ["lr=0.0035", "lowercase=true", "weight_decay=0.1"],
}
# a short budget: `make demo`'s settings (an inverse-√ schedule whose 1,000-update warm-up is still rising
# when 10 minutes end: at this length it learns more than a cosine spread over the budget, docs/results.md),
# and one batch size for every arm (short_budget would halve it on the slower arms only)
SHORT = ["schedule=inverse_sqrt", "horizon=steps", "warmup=1000", "eval_every=1000", "eval_max_sentences=300",
         "short_budget=warn", "progress=false"]  # fmt: skip
ARMS = ("plain", "cached", "distill", "rerank")
REPRODUCE = ["--lenpen", "0.6"]  # one length penalty: the evaluation's minutes are the same for every arm


def reproduce(recipe: str, overrides: list[str], name: str, processes: int) -> dict:
    """``scripts/reproduce.py`` under ``--name`` (results/NAME.json); its results."""
    cmd = [*launcher(processes), str(ROOT / "scripts" / "reproduce.py"), recipe, *overrides, "--name", name,
           *REPRODUCE]  # fmt: skip
    run(cmd)
    return json.loads((ROOT / "results" / f"{name}.json").read_text())


def figures(r: dict) -> dict:
    test = r["test"]
    steps = r["steps"] if isinstance(r["steps"], int) else max(r["steps"])
    out = {"bleu": test["bleu"], "bleu_lc": test["bleu_lc"], "chrf": test.get("chrf"), "updates": steps,
           "train_minutes": r["config"]["max_minutes"], "train_wall_minutes": r["train_wall_minutes"],
           "chosen": r["chosen"], "valid_bleu": r["valid_bleu"][f"{r['chosen']}/{r['decoding']}"],
           "commit": r["commit"]}  # fmt: skip
    if r["config"]["max_minutes"]:
        out["updates_per_minute"] = round(steps / r["config"]["max_minutes"], 1)
    if "stages" in r:
        out["stages"], out["total_minutes"] = r["stages"], r["total_minutes"]
    return out


def rerank_bleu(plain: Path, r2l: Path, direction: str) -> dict:
    """test2016 of the plain model's beam-5 n-best reranked by its and the right-to-left model's
    scores, scored as reproduce.py scores."""
    from aiayn.cli.evaluate import score
    from aiayn.data.corpus import load_parallel
    from aiayn.decoding.options import SearchConfig
    from aiayn.decoding.rerank import rerank
    from aiayn.decoding.translator import Translator

    src_lang, tgt_lang = direction.split("-")
    forward, backward = Translator.from_dir(plain), Translator.from_dir(r2l)
    srcs, refs = (list(side) for side in zip(*load_parallel("multi30k", "test", src_lang, tgt_lang)))
    t0 = time.perf_counter()
    sources, _ = forward.encode(srcs)
    config = SearchConfig(beam=5, lenpen=0.6)
    nbest = forward.search(sources, dataclasses.replace(config, nbest=5))
    best = [hyps[0] for hyps in rerank(forward, backward, sources, nbest, config)]
    scores, _ = score([forward.detokenize(h) for h in best], refs, tgt_lang)
    return {"bleu": scores["bleu"], "bleu_lc": scores["bleu_lc"], "chrf": scores.get("chrf"),
            "decode_seconds": round(time.perf_counter() - t0, 1)}  # fmt: skip


def positive(text: str) -> float:
    """A budget in minutes: a number above 0 (0 would be no clock for some arms, the recipe's for others)."""
    value = float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"{text} is not a number of minutes above 0")
    return value


def parser() -> argparse.ArgumentParser:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--minutes", type=positive, default=10.0, help="every arm's total training budget")
    ap.add_argument("--directions", nargs="+", default=["de-en", "en-de"], choices=list(MAKE))
    ap.add_argument("--seeds", type=int, nargs="+", default=[1, 2])
    ap.add_argument("--arms", nargs="+", default=list(ARMS), choices=list(ARMS))
    ap.add_argument("--r2l-share", type=float, default=0.3)
    ap.add_argument("--processes", type=int, default=1, help="DistributedDataParallel processes per arm")
    ap.add_argument("--equal-updates", action="store_true", help="the cached arm at the plain arm's updates")
    ap.add_argument("--variants", nargs="*", default=[], metavar="NAME=key=value[,key=value]",
                    help="more cached arms, their stage-3 overrides: m=r2l_memory_dropout=0.2")  # fmt: skip
    ap.add_argument("--jackknife-variant", action="store_true", help="a cached arm with a jackknifed cache")
    ap.add_argument("--memory-ceiling", action="store_true",
                    help="the cached model at plain's updates, its cache from a right-to-left model trained "
                    "as long as plain (not equal time: what the memory gives at best)")  # fmt: skip
    return ap


class Bench:
    """One direction and seed: its arms, each recorded in the summary once."""

    def __init__(self, args: argparse.Namespace, summary: dict, direction: str, seed: int):
        self.args, self.summary, self.direction = args, summary, direction
        self.measured_now: set[str] = set()  # arms run by this invocation
        self.recipe, self.tag = f"multi30k-{direction}", f"bd-{direction}-s{seed}"
        self.common = [*MAKE[direction], *SHORT, f"seed={seed}"]

    def fresh(self, name: str, after: tuple[str, ...] = ()) -> bool:
        """Whether the summary holds ``name`` as this invocation would measure it: on this machine, at
        this budget, share and processes (``measured_on``), what it leaves for later arms (the
        right-to-left models in runs/) still there, and none of the arms it was built on (``after``:
        e.g. distillation reads the cached arm's right-to-left model) measured again by this invocation."""
        kept = self.summary["arms"].get(name)
        if kept is None or any(kept.get(k) != v for k, v in self.measured_on().items()):
            return False
        if any(f"{self.tag}-{arm}" in self.measured_now for arm in after):
            return False
        return all((ROOT / d).is_dir() for d in kept.get("stages", {}).get("r2l_models", []))

    def record(self, arm: str, make, *how, after: tuple[str, ...] = ()) -> dict:
        """The arm's figures: from the summary where they are ``fresh``; else run now."""
        name = f"{self.tag}-{arm}"
        if not self.fresh(name, after):
            self.measured_now.add(name)
            result = make(name, *how)
            write_bytes(OUT / f"{name}.json", (ROOT / "results" / f"{name}.json").read_bytes())
            for f in (ROOT / "results").glob(f"{name}*"):
                f.unlink()
            self.summary["arms"][name] = {**figures(result), **self.measured_on()}
            write_result(SUMMARY, self.summary)
            print(name, json.dumps(self.summary["arms"][name]), flush=True)
        return self.summary["arms"][name]

    def measured_on(self) -> dict:
        """Where and how an arm ran, kept with it: a resumed summary's top-level fields say only how
        its last invocation ran, and its earlier arms may come from another machine or budget."""
        a = self.args
        return {"machine": machine(), "budget_minutes": a.minutes, "r2l_share": a.r2l_share,
                "processes": a.processes}  # fmt: skip

    def trained(self, name: str, overrides: list[str], minutes: float) -> dict:
        return reproduce(self.recipe, [*self.common, *overrides, f"max_minutes={minutes:g}"], name,
                         self.args.processes)  # fmt: skip

    def piped(self, name: str, final: list[str], jackknife: bool = False) -> dict:
        a = self.args
        opts = argparse.Namespace(minutes=a.minutes, r2l_share=a.r2l_share, jackknife=jackknife,
                                  processes=a.processes, reproduce=REPRODUCE)  # fmt: skip
        return pipeline(self.recipe, self.common, final, name, opts)

    def run(self) -> None:
        a, cached_final = self.args, ["model.bidirectional=true", "r2l_memory_from=cache"]
        if "plain" in a.arms:
            self.record("plain", self.trained, [], a.minutes)
        if a.memory_ceiling and f"{self.tag}-plain" in self.summary["arms"]:
            self.ceiling(cached_final)
        if set(a.arms) == {"plain"}:
            return
        stages = self.record("cached", self.piped, cached_final)["stages"]
        r2l = r2l_overrides([ROOT / d for d in stages["r2l_models"]])
        left = round(a.minutes - stages["r2l_minutes"] - stages["cache_minutes"], 2)
        if "distill" in a.arms:
            build_cache(
                ROOT / "recipes" / f"{self.recipe}.toml", [*self.common, "r2l_distill=true", *r2l]
            )  # a hit
            self.record("distill", self.trained, ["r2l_distill=true", *r2l], left, after=("cached",))
        if "rerank" in a.arms and not self.fresh(f"{self.tag}-rerank", after=("cached",)):
            short = round(a.minutes - stages["r2l_minutes"], 2)
            plain = self.record("plain-short", self.trained, [], short, after=("cached",))
            chosen = ROOT / "runs" / f"reproduce-{self.tag}-plain-short" / plain["chosen"]
            r2l_dir = ROOT / stages["r2l_models"][0]
            self.summary["arms"][f"{self.tag}-rerank"] = {
                **rerank_bleu(chosen, r2l_dir, self.direction),
                **self.measured_on(),
            }
            write_result(SUMMARY, self.summary)
        for variant in a.variants:
            name, _, overrides = variant.partition("=")
            self.record(f"cached-{name}", self.piped, [*cached_final, *overrides.split(",")])
        if a.jackknife_variant:
            self.record("cached-jackknife", self.piped, cached_final, True)
        if a.equal_updates and f"{self.tag}-plain" in self.summary["arms"]:
            steps = self.summary["arms"][f"{self.tag}-plain"]["updates"]
            fixed = [*cached_final, *r2l, f"max_steps={steps}", "horizon=steps"]
            self.record(f"cached-{steps}-updates", self.trained, fixed, 0, after=("plain", "cached"))

    def ceiling(self, cached_final: list[str]) -> None:
        """The most the memory can give: a right-to-left model trained for the whole budget (as long as
        the plain model), its cache, and the bidirectional model at the plain model's updates (no
        clock), against the plain model's score."""
        steps = self.summary["arms"][f"{self.tag}-plain"]["updates"]
        r2l = ROOT / "runs" / f"reproduce-{self.tag}-r2l-full"
        if not (r2l / "best").is_dir():
            recipe = str(ROOT / "recipes" / f"{self.recipe}.toml")
            run([sys.executable, "-m", "aiayn", "train", recipe, *self.common, "reverse_target=true",
                 f"max_minutes={self.args.minutes:g}", f"out_dir={r2l}"])  # fmt: skip
        reads = [*cached_final, f"r2l_model={r2l}", f"max_steps={steps}", "horizon=steps"]
        build_cache(ROOT / "recipes" / f"{self.recipe}.toml", [*self.common, *reads])
        self.record(f"cached-full-r2l-{steps}-updates", self.trained, reads, 0, after=("plain",))


def main() -> int:
    args = parser().parse_args()
    summary = json.loads(SUMMARY.read_text()) if SUMMARY.is_file() else {"arms": {}}
    # how the last invocation ran; each arm keeps its own (Bench.measured_on)
    summary.update(machine=machine(), budget_minutes=args.minutes, settings=SHORT, r2l_share=args.r2l_share,
                   processes=args.processes)  # fmt: skip
    OUT.mkdir(parents=True, exist_ok=True)
    for direction in args.directions:
        for seed in args.seeds:
            Bench(args, summary, direction, seed).run()
    return 0


if __name__ == "__main__":
    run_main(main)
