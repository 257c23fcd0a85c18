"""Independent random streams (dpbench.privacy.streams): no two purposes of a run share a generator state.

The attacks of the privacy review are kept as tests: with the sampler seeded by the run seed itself, the initial
weights of ``mnist_mlp`` gave away epoch 0's first batch, and a tuning trial's score noise was trial 0's batch draw."""
import math

import pytest
import torch

from dpbench.privacy import sampling, streams
from dpbench.run import planning
from dpbench.spec import RunSpec
from dpbench.tuning import tune
from dpbench.tuning.accounting import ValidationSplit
from dpbench.tuning.trials import _trial_run_spec

PURPOSES = [p for p in streams.PURPOSES if p != "sampler"]


def first_words(generator: torch.Generator, count: int = 8) -> tuple[int, ...]:
    return tuple(torch.randint(0, 2**31, (count,), generator=generator).tolist())


def test_every_stream_of_seeds_0_to_9_differs_from_every_other_on_its_first_draws():
    seen = {}
    for seed in range(10):
        named = {(seed, purpose): streams.generator(seed, purpose) for purpose in PURPOSES}
        named |= {(seed, "sampler", epoch): streams.generator(seed, "sampler", epoch) for epoch in range(3)}
        named |= {(seed, "tuning-trial", k): streams.generator(seed, "tuning-trial", k) for k in range(3)}
        named[(seed, "torch.manual_seed(seed)")] = torch.Generator().manual_seed(seed)  # the old shared state
        for name, generator in named.items():
            words = first_words(generator)
            assert words not in seen, f"{name} draws what {seen.get(words)} draws"
            seen[words] = name
    assert len(seen) == 10 * (len(PURPOSES) + 7)


def test_a_stream_is_a_pure_function_of_seed_purpose_and_index():
    assert streams.derive(3, "sampler", 2) == streams.derive(3, "sampler", 2) != streams.derive(3, "sampler", 1)
    assert first_words(streams.generator(5, "init")) == first_words(streams.generator(5, "init"))
    with pytest.raises(ValueError, match="unknown random stream"):
        streams.derive(0, "sampler-typo")
    with pytest.raises(ValueError):
        streams.derive(-1, "init")
    assert streams.derive(0, "task:crop") != streams.derive(0, "task:flip")


def reconstructed_first_batch(weight: torch.Tensor, n: int, sample_rate: float) -> torch.Tensor:
    """Epoch 0's first Poisson batch, computed from nothing but the initial first-layer weights, assuming the
    sampler's generator started where the weights' did (as it did when both were seeded with the run seed).

    PyTorch's CPU ``uniform_`` turns each 32-bit Mersenne Twister word r into a float32 weight from the low 24 bits
    of r, and each float64 uniform of the sampler from two words (r1, r2) as ((r1 mod 2²¹)·2³² + r2)·2⁻⁵³. The
    weights give the low 24 bits of every word, so each float64 uniform is known to within 2⁻²¹: enough to place
    nearly every geometric gap exactly."""
    bound = 1 / math.sqrt(weight.shape[1])  # nn.Linear's kaiming_uniform_(a=√5): U(−1/√fan_in, 1/√fan_in)
    low_bits = torch.round((weight.flatten().double() + bound) / (2 * bound) * 2**24).long()
    high, low = low_bits[0::2], low_bits[1::2]
    uniforms = ((high % 2**21) * 2**32 + low + 2**31) * 2.0**-53  # the unknown top 8 bits of r2: their middle
    gaps = torch.floor(torch.log1p(-uniforms) / math.log1p(-sample_rate)).long() + 1
    positions = gaps.cumsum(0) - 1
    return positions[positions < n]


def test_initial_weights_do_not_reveal_which_examples_the_first_batch_holds(mirror):
    planned = planning.plan(RunSpec(method="dpsgd", task="mnist_mlp", epsilon=1.0, seed=0, progress_bar=False))
    weight = planned.task.model[0].weight.detach()
    planned.sampler.set_epoch(0)
    actual = next(iter(planned.sampler))[0]
    guess = reconstructed_first_batch(weight, planned.data.n_train, planned.record["sample_rate"])
    assert len(actual) > 200
    overlap = len(set(guess.tolist()) & set(actual.tolist())) / len(actual)
    assert overlap < 0.5, f"the initial weights give away {overlap:.0%} of the first batch"


class NoCorrectAnswer:
    training = False

    def __call__(self, x):
        return x

    def eval(self):
        pass

    def train(self, mode):
        pass

    def per_example_metrics(self, outputs, targets):
        return {"accuracy": torch.zeros(len(outputs))}


def test_a_trials_score_noise_is_not_another_trials_batch_draw():
    """Trial k's score noise and trial 0's epoch-k sampler must be independent draws (random stopping assumes
    independent trials)."""
    plan_ = tune.plan(tune.TuneSpec(method="dpsgd", task="digits", epsilon=1.0, seed=0, trials=4,
                                        overrides={"epochs": 4}, no_wandb=True))
    secret = 7  # the study's (dpbench.tuning.study.study_secret)
    first_trial = _trial_run_spec(plan_, {}, 0, secret)
    for k in range(1, 4):
        split = ValidationSplit(0.1, secret, 1.0, k)
        noise = split.score(NoCorrectAnswer(), (torch.zeros(1, 64), torch.zeros(1, dtype=torch.long), 100))
        noise = noise["noisy_accuracy"] * 10  # (0 correct + N(0, 1)) / (0.1 · 100)
        batch_draw = float(torch.randn((), generator=sampling._generator(first_trial.seed, k)))
        assert noise != pytest.approx(batch_draw, abs=1e-6)


@pytest.mark.parametrize("seed", [0, 1, 7])
def test_the_engine_draws_each_purpose_from_its_own_stream(seed):
    planned = planning.plan(RunSpec(method="dpsgd", task="digits", epsilon=1.0, seed=seed, progress_bar=False))
    module = planned.module()
    module.on_fit_start()
    assert module.noise.key == streams.derive(seed, "gradient-noise")
    streams.seed_globals(seed, "init")
    torch.testing.assert_close(planned.task.model.weight, torch.nn.Linear(64, 10).weight * 0)  # zero init: no draws
    for epoch in range(2):
        planned.sampler.set_epoch(epoch)
        expected = sampling.poisson_batches(planned.data.n_train, planned.record["sample_rate"],
                                            planned.steps_per_epoch, streams.generator(seed, "sampler", epoch))
        assert all(torch.equal(a[0], b) for a, b in zip(planned.sampler, expected))
    assert [first_words(g) for g in [planned.task.rng("augmentation")]] == \
        [first_words(streams.generator(seed, "augmentation"))]
