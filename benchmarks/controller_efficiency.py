"""How many trials each controller needs to find a top-1% architecture of the default CPU space.

No training: every trial is scored by `synthetic_score`, a smooth function of the architecture
meant to look like a probe score (about 0.5 to 0.75) with the cramming paper's preferences and some
interactions between knobs (the formula is in its docstring). The top-1% threshold is the 99th
percentile of the score over 20,000 random members of the space, so random search needs about
ln 2 / 0.01 = 69 trials in the median by construction (`--top` sets another fraction).

Each controller runs through `search.controllers` exactly as a study would (open_study, ask,
tell; in-memory storage), single-objective `probe`, one study per seed. A trial counts when it is
trained: a repeat of an architecture already scored is told the recorded value for free, as the
search driver does. Reported: the median over seeds of the trials needed, '>CAP' when the median
seed did not get there within CAP trials.

    python benchmarks/controller_efficiency.py                 # all controllers, 10 seeds, cap 300
    python benchmarks/controller_efficiency.py --controllers tpe evolution --seeds 3
"""

from __future__ import annotations

import logging
import math
import random
import statistics
import time

import optuna

from search.controllers import CONTROLLERS, ask, open_study, tell
from space import ArchConfig, SearchSpace, default_space_path, load_space
from trainer.console import CliParser

PARAMS_BUDGET_M = 4.0  # the score grows with size up to here, then falls off steeply
NORM_PLACEMENT = {"pre": 0.04, "sandwich": 0.03, "post": 0.0}
POSITION = {"rotary": 0.03, "alibi": 0.03, "scaled_sinusoidal": 0.02, "sinusoidal": 0.01,
            "learned": 0.01, "none": -0.03}
FFN_KIND = {"geglu": 0.03, "swiglu": 0.03, "reglu": 0.025, "gelu": 0.015, "silu": 0.015,
            "relu2": 0.015, "relu": 0.0}


def synthetic_score(arch: ArchConfig) -> float:
    """A made-up probe score: 0.60 plus

    - norm placement: pre +0.04, sandwich +0.03, post 0; pre and sandwich without a final norm
      -0.02; post-norm deeper than 3 layers -0.012 per extra layer (interactions with depth);
    - FFN kind: gated (geglu, swiglu +0.03, reglu +0.025), gelu/silu/relu2 +0.015, relu 0; and
      -0.01 x (ffn_mult - best)^2 with best 3 for gated kinds and 4 for the others;
    - positions: rotary, alibi +0.03, scaled sinusoidal +0.02, sinusoidal, learned +0.01, none -0.03;
    - moderate depth: -0.006 x (layers - 4)^2;
    - size: +0.04 x log2(params / 1.5M) up to 4M parameters, then -0.06 per million beyond;
    - head dim near 64: -0.01 x |log2(head_dim / 64)|;
    - small touches: rmsnorm +0.005, head transform +0.008, tied embeddings +0.004, embedding
      norm +0.004, init_std 0.02 +0.002, -0.002 for each of the qkv, attention-out, FFN biases.
    """
    params_m = arch.num_params() / 1e6
    score = 0.60 + NORM_PLACEMENT[arch.norm_placement] + POSITION[arch.position] + FFN_KIND[arch.ffn_kind]
    if arch.norm_placement != "post" and not arch.final_norm:
        score -= 0.02
    if arch.norm_placement == "post" and arch.layers > 3:
        score -= 0.012 * (arch.layers - 3)
    score -= 0.01 * (arch.ffn_mult - (3.0 if arch.gated else 4.0)) ** 2
    score -= 0.006 * (arch.layers - 4) ** 2
    score += 0.04 * math.log2(min(params_m, PARAMS_BUDGET_M) / 1.5)
    score -= 0.06 * max(0.0, params_m - PARAMS_BUDGET_M)
    score -= 0.01 * abs(math.log2(arch.head_dim / 64))
    score += (0.005 * (arch.norm_kind == "rmsnorm") + 0.008 * arch.head_transform + 0.004 * arch.tie_embeddings
              + 0.004 * arch.embedding_norm + 0.002 * (arch.init_std == 0.02))
    score -= 0.002 * (arch.qkv_bias + arch.attn_out_bias + arch.ffn_bias)
    return score


def top_threshold(space: SearchSpace, samples: int, fraction: float) -> float:
    rng = random.Random(20261129)
    scores = sorted(synthetic_score(space.sample_random(rng)) for _ in range(samples))
    return scores[int(len(scores) * (1 - fraction))]


def trials_to_reach(space: SearchSpace, controller: str, seed: int, threshold: float, cap: int) -> int | None:
    """Trained trials until one scores >= threshold, or None within `cap`."""
    study = open_study(f"{controller}-{seed}", None, controller, "probe", space, seed=seed)
    trained = 0
    while trained < cap:
        proposal = ask(study, space)
        if proposal.repeat_of is not None:
            tell(study, proposal.number, study.get_trials(deepcopy=False)[proposal.repeat_of].values)
            continue
        trained += 1
        score = synthetic_score(proposal.config)
        tell(study, proposal.number, [score])
        if score >= threshold:
            return trained
    return None


def median_trials(results: list[int | None]) -> float:
    return statistics.median(math.inf if r is None else r for r in results)


def main() -> None:
    parser = CliParser(description=__doc__.splitlines()[0])
    parser.add_argument("--controllers", nargs="+", default=list(CONTROLLERS), choices=list(CONTROLLERS))
    parser.add_argument("--seeds", type=int, default=10)
    parser.add_argument("--cap", type=int, default=300, help="trials per study at most")
    parser.add_argument("--gp-cap", type=int, default=100,
                        help="cap for gp, whose asks take about a second each here (default 100)")
    parser.add_argument("--samples", type=int, default=20000, help="random samples for the threshold")
    parser.add_argument("--top", type=float, default=0.01, help="target fraction of the space (default 0.01)")
    args = parser.parse_args()

    optuna.logging.set_verbosity(optuna.logging.WARNING)
    logging.getLogger("search.controllers").setLevel(logging.ERROR)  # cmaes's note would repeat per seed
    space = load_space(default_space_path("cpu"))
    threshold = top_threshold(space, args.samples, args.top)
    top = f"top {100 * args.top:g}%"
    print(f"space {space.name}: {top} threshold {threshold:.4f} from {args.samples} random samples; "
          f"random search needs ln 2 / {args.top:g} = {math.log(2) / args.top:.0f} trials in the median")

    rows = []
    for controller in args.controllers:
        cap = args.gp_cap if controller == "gp" else args.cap
        start = time.perf_counter()
        results = [trials_to_reach(space, controller, seed, threshold, cap) for seed in range(args.seeds)]
        seconds = time.perf_counter() - start
        rows.append((controller, cap, results, seconds))
        print(f"{controller}: {results} ({seconds:.0f} s)", flush=True)

    baseline = median_trials(next(r for c, _, r, _ in rows if c == "random")) if "random" in args.controllers \
        else None
    print(f"\n| controller | cap | median trials to {top} | reached | vs random | wall s |")
    print("|---|---|---|---|---|---|")
    for controller, cap, results, seconds in rows:
        median = median_trials(results)
        shown = f">{cap}" if math.isinf(median) else f"{median:g}"
        reached = sum(r is not None for r in results)
        ratio = "" if baseline is None or math.isinf(median) or math.isinf(baseline) else f"{baseline / median:.2f}x"
        print(f"| {controller} | {cap} | {shown} | {reached}/{len(results)} | {ratio} | {seconds:.0f} |")


if __name__ == "__main__":
    main()
