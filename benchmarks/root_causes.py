"""AdaCliP, ADADP and quantile clipping on adult, run by the independent NumPy transcriptions
(``benchmarks/transcriptions.py``): why AdaCliP collapses to the majority class at ε ≥ 1, where ADADP's learning rate
settles (``--adadp``), why quantile clipping with the paper's defaults stalls at the majority class
(``--quantile-clip``), and why DP-Adam at its default step size does (``--dpadam``). AdaCliP also
runs on another built-in task's rows with ``--task``, ``--batch`` and ``--epochs`` (its untuned settings there); the
committed outputs are ``benchmarks/results/adaclip_transcription_<task>.txt``, which the board's exceptions read
(``benchmarks/violation_causes.py``).

The transcription draws its own Poisson batches (rate B/n) and Gaussian noise with NumPy (seeded per run); only the
data come from dpbench's ``adult`` task (the same rows as ``dpbench run --task adult``). The settings are dpbench's
untuned ones: B = 256, 10 epochs (round(n/B) steps each), lr 0.1, clip 1, β1 = 0.99, β2 = 0.9, h1 = 1e-12, and σ the
noise multiplier dpbench calibrates for the ε (read from the run records; see ``/work/notes/adaptive_results.md``).

Per run it prints the test accuracy and, averaged over the last quarter of the steps: the fraction of examples whose
transformed gradient (g − m)/b is clipped, Σ_i v_i/b_i² (the quantity Theorem 1's b needs to equal 1 at s² = v),
κ = E[(N² − 1)₊]·d·σ²C²/B (what the clamp at h1 adds to it from the noise alone), the bias coordinate's released g̃
against the unclipped batch-mean gradient of the bias, and the fraction of training rows predicted positive::

    python benchmarks/root_causes.py --sigma 13.5949 0.6623 --h2 1 --seeds 0 1 2

With ``--adadp`` it runs ADADP instead (both variants; dpbench's untuned lr 0.1, tol 1, B = 256, 10 epochs of
round(n/(2B)) steps) and prints the test accuracy, the final η, the median η over the last half, the median err and
the median of its noise-only part (η/2)·‖(n1 − n2)/max(1, |θ1|)‖ over the last half, and the accepted fraction.

With ``--quantile-clip`` it runs Andrew et al.'s quantile clipping with dpbench's untuned settings (γ = 0.5, η_C = 0.2,
C_0 = ``--clip``, the count's noise σ_b = max(B/20, 5σ) as ``methods/quantile_clip.py`` sets it, and none at σ = 0;
plain SGD steps at ``--lr``), then, under a "# control" header, the same runs with the clip pinned at C_0 (η_C = 0:
DP-SGD at the same σ). Per run: the test accuracy, the clip norm after the first epoch, the last and the smallest
clip norm, and the fraction of test rows predicted positive. The committed outputs are ``benchmarks/results/quantile_clip_transcription_<task>.txt``::

    python benchmarks/root_causes.py --quantile-clip --task adult --batch 256 --epochs 20 --sigma 0 0.7744 --seeds 0 1 2

With ``--dpadam`` it runs DP-Adam (β1 = 0.9, β2 = 0.999, γ = 1e-8, clip ``--clip``) at ``--lr`` (dpbench's default
1e-3: the paper's CIFAR-10 setting), then, under a "# control" header, at ``--control-lr`` (0.01: the paper's SNLI
setting), each at every σ. Per run: the test accuracy, the largest |weight| and |bias| at the end, and the fraction of
test rows predicted positive. Committed output: ``benchmarks/results/dpadam_transcription_<task>.txt``.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np

_SPEC = importlib.util.spec_from_file_location("transcriptions", Path(__file__).resolve().parent / "transcriptions.py")
T = sys.modules.setdefault("transcriptions", importlib.util.module_from_spec(_SPEC))
_SPEC.loader.exec_module(T)

POSITIVE_PART = 0.4839  # E[(N² − 1)₊] for N ~ N(0, 1)


def task_arrays(name: str = "adult"):
    from dpbench import registry  # only for the data rows
    task = registry.tasks([])[name]()
    data = task.prepare(0)
    return [np.asarray(a, dtype=np.float64 if a.dtype.is_floating_point else np.int64)
            for a in (data.x_train, data.y_train, data.x_test, data.y_test)]


def run(arrays, sigma: float, h2: float, seed: int, *, lr=0.1, batch=256, epochs=10, clip=1.0, reading="per-example",
        h1=1e-12):
    x, y, x_test, y_test = arrays
    model = T.LinearModel(x, y)
    n, d = len(x), x.shape[1] + 1
    steps = epochs * max(1, round(n / batch))
    rng = np.random.default_rng(seed)
    tail = steps - steps // 4
    rows = []

    def observe(state):
        if state.step <= tail:
            return
        b = state.b
        index = last_batch[0]
        grads = model.per_example_gradients(w_before[0], index)
        bias_mean = float(grads[:, 0, -1].sum() / batch)
        rows.append((state.clipped / max(state.examples, 1), float((state.v / b**2).sum()), float(b.mean()),
                     float(state.g_tilde[0, -1]), bias_mean))

    last_batch, w_before = [None], [None]

    def batches():
        for index in T.poisson_batches(n, batch / n, steps, rng):
            last_batch[0] = index
            yield index

    noises = T.gaussian((1, d), rng)

    class Recorder:  # the iterate each batch's gradients are taken at
        def __call__(self, state):
            observe(state)
            w_before[0] = state.w

    w_before[0] = model.zeros()
    final = T.adaclip(model, batches(), noises, lr=lr, sigma=sigma, expected_batch_size=batch, clip=clip, h1=h1, h2=h2,
                      reading=reading, observe=Recorder())
    clipped, ratio, b_mean, g_bias, true_bias = np.mean(rows, axis=0)
    z = np.hstack([x, np.ones((n, 1))]) @ final.w[0]
    # The noise-free expected update at the final state, over the whole training set: E g̃ = b ⊙ mean_k ŵ_k + m
    # against the true mean gradient, in the bias coordinate, and who is clipped.
    grads = model.per_example_gradients(final.w, np.arange(n))
    transformed = (grads - final.m) / final.b
    norms = np.sqrt((transformed**2).sum(axis=(1, 2)))
    factors = np.minimum(1.0, clip / norms)
    expected = final.b * (transformed * factors[:, None, None]).mean(axis=0) + final.m
    return {"accuracy": model.accuracy(final.w, x_test, y_test), "clipped": clipped, "sum_v_over_b2": ratio,
            "kappa": POSITIVE_PART * d * sigma**2 * clip**2 / batch, "b_mean": b_mean, "g_bias": g_bias,
            "true_bias_grad": true_bias, "predicted_positive": float((z > 0).mean()), "bias": float(final.w[0, -1]),
            "clipped_pos": float((norms[y == 1] > clip).mean()), "clipped_neg": float((norms[y == 0] > clip).mean()),
            "expected_g_bias": float(expected[0, -1]), "full_grad_bias": float(grads[:, 0, -1].mean())}


def run_adadp(arrays, sigma: float, seed: int, variant: str, *, lr=0.1, batch=256, epochs=10, tol=1.0):
    x, y, x_test, y_test = arrays
    model = T.LinearModel(x, y)
    n, d = len(x), x.shape[1] + 1
    steps = epochs * max(1, round(n / (2 * batch)))
    rng = np.random.default_rng(seed)
    rows = []

    def observe(state):
        if state.step > steps // 2:
            rows.append((state.lr, state.err, state.noise_err))

    final = T.adadp(model, T.poisson_batches(n, batch / n, 2 * steps, rng), T.gaussian((1, d), rng), lr=lr,
                    sigma=sigma, expected_batch_size=batch, tol=tol, variant=variant, observe=observe)
    lrs, errs, noise_errs = np.median(rows, axis=0)
    return {"accuracy": model.accuracy(final.w, x_test, y_test), "final_lr": final.lr, "median_lr": lrs,
            "median_err": errs, "median_noise_err": noise_errs,
            "accepted": final.accepted / steps if variant == "code" else float("nan")}


def run_quantile_clip(arrays, sigma: float, seed: int, *, clip_lr: float, lr=0.1, batch=256, epochs=20, clip=1.0):
    x, y, x_test, y_test = arrays
    model = T.LinearModel(x, y)
    n, d = len(x), x.shape[1] + 1
    steps = epochs * max(1, round(n / batch))
    rng = np.random.default_rng(seed)
    count_std = max(batch / 20, 5 * sigma) if sigma > 0 else 0.0
    final = T.quantile_clip(model, T.poisson_batches(n, batch / n, steps, rng), T.gaussian((1, d), rng),
                            (float(z) for z in T.gaussian((), rng)), lr=lr, sigma=sigma, expected_batch_size=batch,
                            clip=clip, count_std=count_std, clip_lr=clip_lr)
    z = np.hstack([x_test, np.ones((len(x_test), 1))]) @ final.w[0]
    return {"count_std": count_std, "accuracy": model.accuracy(final.w, x_test, y_test),
            "clip_epoch1": [*final.clips, final.clip][max(1, round(n / batch))],  # the clip of epoch 2's first step
            "clip_last": final.clip, "clip_min": min(final.clips), "predicted_positive": float((z > 0).mean())}


def run_dpadam(arrays, sigma: float, seed: int, *, lr: float, batch=32, epochs=30, clip=1.0):
    x, y, x_test, y_test = arrays
    model = T.LinearModel(x, y)
    n, d = len(x), x.shape[1] + 1
    steps = epochs * max(1, round(n / batch))
    rng = np.random.default_rng(seed)
    final = T.dpadam(model, T.poisson_batches(n, batch / n, steps, rng), T.gaussian((1, d), rng), lr=lr,
                     sigma=sigma, expected_batch_size=batch, clip=clip)
    z = np.hstack([x_test, np.ones((len(x_test), 1))]) @ final.w[0]
    return {"accuracy": model.accuracy(final.w, x_test, y_test), "max_weight": float(np.abs(final.w[0, :-1]).max()),
            "bias": float(final.w[0, -1]), "predicted_positive": float((z > 0).mean())}


def arguments(argv=None) -> argparse.Namespace:
    """The command line's settings (also read by ``benchmarks/violation_causes.py`` from a committed output's
    header, to tie the transcription's settings to the board cell's)."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--sigma", type=float, nargs="+", required=True)
    parser.add_argument("--h2", type=float, nargs="+", default=[1.0])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0])
    parser.add_argument("--h1", type=float, default=None,
                        help="default 1e-12; h1 ≥ h2 (taken as h1 = h2) pins s at √h2")
    parser.add_argument("--lr", type=float, default=0.1)
    parser.add_argument("--clip", type=float, default=1.0)
    parser.add_argument("--reading", choices=T.ADACLIP_READINGS, default="per-example")
    parser.add_argument("--adadp", action="store_true", help="run ADADP (both variants) instead of AdaCliP")
    parser.add_argument("--quantile-clip", action="store_true",
                        help="run quantile clipping (paper defaults, then the clip pinned) instead of AdaCliP")
    parser.add_argument("--dpadam", action="store_true", help="run DP-Adam at --lr, then at --control-lr")
    parser.add_argument("--control-lr", type=float, default=0.01, help="--dpadam's control step size")
    parser.add_argument("--task", default="adult", help="a built-in task's data rows (AdaCliP: kddcup99 too)")
    parser.add_argument("--batch", type=int, default=256, help="expected batch size B (kddcup99's default: 1024)")
    parser.add_argument("--epochs", type=int, default=10, help="epochs of round(n/B) steps (kddcup99's default: 2)")
    return parser.parse_args(argv)


def _sections(args, keys: list[str], sections) -> None:
    """Each (title, run) section: a "# title" header, the column names, then one line per σ and seed."""
    for title, run in sections:
        print(f"# {title}\nsigma seed " + " ".join(keys), flush=True)
        for sigma in args.sigma:
            for seed in args.seeds:
                result = run(sigma, seed)
                print(f"{sigma} {seed} " + " ".join(f"{result[k]:.4g}" for k in keys), flush=True)


def main(argv=None):
    args = arguments(argv)
    arrays = task_arrays(args.task)
    if args.dpadam:
        _sections(args, ["accuracy", "max_weight", "bias", "predicted_positive"], [
            (f"DP-Adam, lr = {args.lr:g}", lambda sigma, seed: run_dpadam(
                arrays, sigma, seed, lr=args.lr, batch=args.batch, epochs=args.epochs, clip=args.clip)),
            (f"control: lr = {args.control_lr:g}", lambda sigma, seed: run_dpadam(
                arrays, sigma, seed, lr=args.control_lr, batch=args.batch, epochs=args.epochs, clip=args.clip))])
        return
    if args.quantile_clip:
        _sections(args, ["count_std", "accuracy", "clip_epoch1", "clip_last", "clip_min", "predicted_positive"], [
            (title, lambda sigma, seed, clip_lr=clip_lr: run_quantile_clip(
                arrays, sigma, seed, clip_lr=clip_lr, lr=args.lr, batch=args.batch, epochs=args.epochs,
                clip=args.clip))
            for title, clip_lr in (("quantile clipping, eta_C = 0.2, gamma = 0.5", 0.2),
                                   ("control: the clip pinned at C_0 (eta_C = 0)", 0.0))])
        return
    if args.adadp:
        keys = ["accuracy", "final_lr", "median_lr", "median_err", "median_noise_err", "accepted"]
        print("sigma variant seed " + " ".join(keys), flush=True)
        for sigma in args.sigma:
            for variant in T.ADADP_VARIANTS:
                for seed in args.seeds:
                    result = run_adadp(arrays, sigma, seed, variant, lr=args.lr)
                    print(f"{sigma} {variant} {seed} " + " ".join(f"{result[k]:.4g}" for k in keys), flush=True)
        return
    keys = ["accuracy", "clipped", "sum_v_over_b2", "kappa", "b_mean", "g_bias", "true_bias_grad",
            "predicted_positive", "bias", "clipped_pos", "clipped_neg", "expected_g_bias", "full_grad_bias"]
    print("sigma h2 seed " + " ".join(keys), flush=True)
    for sigma in args.sigma:
        for h2 in args.h2:
            for seed in args.seeds:
                h1 = 1e-12 if args.h1 is None else min(args.h1, h2)
                result = run(arrays, sigma, h2, seed, lr=args.lr, clip=args.clip, reading=args.reading, h1=h1,
                             batch=args.batch, epochs=args.epochs)
                print(f"{sigma} {h2:.4g} {seed} " + " ".join(f"{result[k]:.4g}" for k in keys), flush=True)


if __name__ == "__main__":
    main()
