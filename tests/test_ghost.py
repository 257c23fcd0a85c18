"""The fast clipping path against the reference (vmap) path, layer type by layer type."""
import contextlib

import pytest
import torch
from torch import nn

from dpbench.privacy.clipping import CoordinateAffine, VmapClipper, clip_factors
from dpbench.privacy.ghost import GhostClipper, make_clipper, unsupported_layers
from dpbench.task import Classification


class Pool(nn.Module):
    def forward(self, x):
        return x.mean(1)


class Flatten(nn.Module):
    def forward(self, x):
        return x.flatten(1)


def mlp():
    return nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 3)), torch.randn(7, 6)


def sequence_linear():  # (B, T, p) inputs: T² < p·q (ghost norm), then T² > p·q (materialized)
    return nn.Sequential(nn.Linear(5, 40), nn.GELU(), nn.Linear(40, 3), Pool()), torch.randn(7, 12, 5)


def conv():  # per-example gradients (T² > p·q) on the first layer, ghost norms (T² ≤ p·q) on the other two
    net = nn.Sequential(nn.Conv2d(3, 4, 3, padding=1), nn.GroupNorm(2, 4), nn.ReLU(),
                        nn.Conv2d(4, 5, 3, stride=2, dilation=1), nn.ReLU(),
                        nn.Conv2d(5, 6, (2, 3), stride=(1, 2), padding=(1, 0), dilation=(2, 1)), nn.Tanh(),
                        Flatten(), nn.LazyLinear(3))
    x = torch.randn(7, 3, 8, 8)
    net(x)  # materialize the lazy layer
    return net, x


def embedding():
    net = nn.Sequential(nn.Embedding(11, 6, padding_idx=0), nn.LayerNorm(6), nn.Linear(6, 3), Pool())
    return net, torch.randint(0, 11, (7, 5))


def layer_norm_mlp():
    return nn.Sequential(nn.Linear(6, 8), nn.LayerNorm(8), nn.Tanh(), nn.Linear(8, 3)), torch.randn(7, 6)


def conv_with_frozen_kernels():  # only the biases of the first and last convolution train
    net, x = conv()
    net[0].weight.requires_grad_(False)
    net[5].weight.requires_grad_(False)
    return net, x


def frozen_first_layer():
    net, x = mlp()
    net[0].weight.requires_grad_(False)
    return net, x


class Tiny(Classification):
    name = "tiny_for_ghost_tests"

    def __init__(self, model):
        super().__init__()
        self.classes, self.model = 3, model


@pytest.mark.parametrize("build, affine", [(mlp, False), (sequence_linear, False), (conv, False),
                                           (conv_with_frozen_kernels, False), (embedding, False),
                                           (frozen_first_layer, False), (mlp, True), (layer_norm_mlp, True),
                                           (frozen_first_layer, True)])
@pytest.mark.parametrize("clip", [0.05, 1.0, float("inf")])
def test_ghost_equals_reference(build, affine, clip):
    """Norms and clipped sums, plain or after AdaCliP's (g − m)/b, equal those of materialized gradients."""
    torch.manual_seed(0)
    model, x = build()
    task = Tiny(model)
    y = torch.randint(0, 3, (len(x),))
    assert unsupported_layers(model) == []
    transform = random_affine(model) if affine else None
    fast, fast_norms = GhostClipper().clipped_sum(task, x, y, clip, transform)
    slow, slow_norms = VmapClipper().clipped_sum(task, x, y, clip, transform)
    torch.testing.assert_close(fast_norms, slow_norms, rtol=1e-5, atol=1e-7)
    for f, s in zip(fast, slow):
        torch.testing.assert_close(f, s, rtol=1e-5, atol=1e-5 if affine else 1e-6)


@pytest.mark.parametrize("clipper", [GhostClipper(), VmapClipper()])
@pytest.mark.parametrize("build", [mlp, sequence_linear, conv, embedding, layer_norm_mlp])
def test_clipped_sum_is_added_into_the_given_tensors(clipper, build):
    """``into`` (the engine passes the release's noise) receives scale · Σ clipped in place and is returned."""
    torch.manual_seed(0)
    model, x = build()
    task = Tiny(model)
    y = torch.randint(0, 3, (len(x),))
    alone, _ = clipper.clipped_sum(task, x, y, 0.5, scale=0.25)
    into = [torch.randn_like(p) for p in model.parameters()]
    before = [t.clone() for t in into]
    result, _ = clipper.clipped_sum(task, x, y, 0.5, scale=0.25, into=into)
    assert all(r is t for r, t in zip(result, into))
    for r, b, a in zip(result, before, alone):
        torch.testing.assert_close(r, b + a)


def test_binary_logistic_closed_form():
    torch.manual_seed(0)
    task = Tiny(nn.Linear(4, 1))
    task.classes = 2
    x, y = torch.randn(9, 4), torch.randint(0, 2, (9,))
    _, norms = GhostClipper().clipped_sum(task, x, y, 1.0)
    residual = torch.sigmoid(task(x).squeeze(-1)) - y  # ∇ℓ_i = (σ(z_i) − y_i)(x_i, 1)
    torch.testing.assert_close(norms, residual.abs() * (x.pow(2).sum(1) + 1).sqrt())


def test_unsupported_layer_falls_back_with_a_warning_naming_it():
    model = nn.Sequential(nn.Linear(4, 4), nn.BatchNorm1d(4), nn.Linear(4, 3))
    assert unsupported_layers(model) == ["1 (BatchNorm1d)"]
    with pytest.warns(UserWarning, match=r"1 \(BatchNorm1d\)"):
        assert isinstance(make_clipper(model), VmapClipper)
    assert isinstance(make_clipper(nn.Linear(3, 2), lambda grads: grads), VmapClipper)
    assert isinstance(make_clipper(nn.Linear(3, 2)), GhostClipper)
    linear = nn.Linear(3, 2)
    assert isinstance(make_clipper(linear, random_affine(linear)), GhostClipper)
    net, _ = conv()
    with pytest.warns(UserWarning, match=r"0 \(Conv2d\), 3 \(Conv2d\), 5 \(Conv2d\)"):
        assert isinstance(make_clipper(net, random_affine(net)), VmapClipper)


def random_affine(model):
    """A CoordinateAffine with shifts comparable to per-example gradients and scales far from 1."""
    params = [p for p in model.parameters() if p.requires_grad]
    return CoordinateAffine([0.3 * torch.randn_like(p) for p in params],
                            [torch.empty_like(p).uniform_(0.05, 3.0) for p in params])


def test_layers_sharing_a_parameter_fall_back_to_the_reference():
    """Tied weights (an embedding reused as the output layer): the per-example norm has cross terms."""
    torch.manual_seed(0)
    embed, head = nn.Embedding(11, 6), nn.Linear(6, 11, bias=False)
    head.weight = embed.weight
    model = nn.Sequential(embed, Pool(), head)
    task, x, y = Tiny(model), torch.randint(0, 11, (7, 5)), torch.randint(0, 3, (7,))
    with pytest.warns(UserWarning, match="share a parameter"):
        fast, fast_norms = GhostClipper().clipped_sum(task, x, y, 1.0)
    slow, slow_norms = VmapClipper().clipped_sum(task, x, y, 1.0)
    torch.testing.assert_close(fast_norms, slow_norms)


def test_coordinate_affine_on_sequence_inputs_falls_back_to_the_reference():
    torch.manual_seed(0)
    model, x = sequence_linear()
    task, y = Tiny(model), torch.randint(0, 3, (7,))
    transform = random_affine(model)
    with pytest.warns(UserWarning, match="several inputs per example"):
        fast, fast_norms = GhostClipper().clipped_sum(task, x, y, 1.0, transform)
    slow, slow_norms = VmapClipper().clipped_sum(task, x, y, 1.0, transform)
    torch.testing.assert_close(fast_norms, slow_norms)


def test_empty_batch():
    task = Tiny(nn.Linear(4, 3))
    sums, norms = GhostClipper().clipped_sum(task, torch.zeros(0, 4), torch.zeros(0, dtype=torch.long), 1.0)
    assert len(norms) == 0 and all((s == 0).all() for s in sums)


@pytest.mark.parametrize("kernel, stride, padding, dilation", [(3, 1, 1, 1), (3, 2, 0, 1), ((2, 3), (1, 2), (1, 0), (2, 1))])
def test_patch_gram_equals_that_of_unfolded_patches(kernel, stride, padding, dilation):
    from dpbench.privacy.ghost import _patch_gram

    layer = nn.Conv2d(3, 4, kernel, stride=stride, padding=padding, dilation=dilation)
    x = torch.randn(5, 3, 9, 11, dtype=torch.float64)
    patches = torch.nn.functional.unfold(x, layer.kernel_size, layer.dilation, layer.padding, layer.stride)
    torch.testing.assert_close(_patch_gram(x, layer), patches.transpose(1, 2) @ patches)


class _Residual:
    """A linear model whose per-example loss is outputᵀy: the output gradient of example i is y_i itself."""

    def __init__(self, model):
        self.model = model

    def __call__(self, x):
        return self.model(x)

    def per_example_loss(self, outputs, targets):
        return (outputs.squeeze(-1) * targets)


@pytest.mark.parametrize("seed", range(20))
def test_adaclip_transform_never_lets_an_example_contribute_more_than_c(seed):
    """An adversarial AdaCliP state, ‖M/S‖ ≫ ‖(G_i − M)/S‖ (mean next to one example's gradient, tiny scale): the
    float32 expansion of the closed form cancelled catastrophically and let an example contribute up to 12·C. The
    contribution c_i·‖(G_i − M)/S‖ is computed here exactly (float64, materialized) and must stay ≤ C."""
    generator = torch.Generator().manual_seed(seed)
    x = torch.randn(32, 64, generator=generator)
    y = 10 * torch.randn(32, generator=generator)
    layer = nn.Linear(64, 1, bias=False)
    exact_gradients = y.double()[:, None, None] * x.double()[:, None, :]
    worst = 0.0
    for relative, scale in [(1e-3, 1e-1), (1e-4, 1e-3), (1e-5, 1e-3), (0.0, 1e-2)]:
        shift = (y[0] * x[0])[None, :] * (1 + relative)
        transform = CoordinateAffine([shift], [torch.full_like(shift, scale)])
        _, norms = GhostClipper().clipped_sum(_Residual(layer), x, y, 1.0, transform)
        exact = ((exact_gradients - shift.double()) / scale).flatten(1).norm(dim=1)
        contributions = exact / torch.maximum(norms.double(), torch.tensor(1.0, dtype=torch.float64))
        worst = max(worst, float(contributions.max()))
        assert torch.all(norms.double() >= exact * (1 - 1e-6))  # an upper bound of the norm, to rounding
    assert worst <= 1.0 + 1e-6


def _released_sum(task, x, y, transform, batch_size):
    """The clipped sum over B, added into float64 zeros (the engine adds it into float32 noise: one rounding of the
    noisy sum, post-processing)."""
    into = [torch.zeros_like(p, dtype=torch.float64) for p in task.model.parameters()]
    sums, _ = GhostClipper().clipped_sum(task, x, y, 1.0, transform, scale=1 / batch_size, into=into)
    return torch.cat([s.flatten() for s in sums])


@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("state", ["identical", "near_duplicates", "large_gradients"])
def test_adaclip_clipped_sum_moves_by_at_most_c_over_b_when_one_example_changes(state, seed):
    """Adversarial AdaCliP states, M ≈ G_i and a tiny S (the method's own update drives m to a shared gradient and
    b to its floor on near-duplicate data): the float32 closed form (Σ c_i G_i − (Σ c_i)·M)/S rounded at
    ~2⁻²⁴·Σ c_i|G_i|/S and let one example move the released sum (before noise) by up to 2158·C (identical examples)
    and 431·C (near duplicates); with |G_i|/S = 1e11 the float64 closed form is not enough either (its error is
    then about 40 times C/B·1e-5), and the sum must come from the materialized examples. Removing an example may move
    the sum by C/B at most, replacing one by 2C/B (C = 1); the sum must also equal the float64 sum of the
    materialized c_i (G_i − M)/S."""
    generator = torch.Generator().manual_seed(seed)
    batch = 256
    if state == "identical":  # Linear(64, 1) without bias, m = G₀, b = 1e-8
        layer = nn.Linear(64, 1, bias=False)
        x = torch.randn(64, generator=generator).expand(batch + 1, 64).clone()
        y = torch.full((batch + 1,), 3.0)
        shift, scale = [(y[0] * x[0])[None, :]], [torch.full((1, 64), 1e-8)]
    elif state == "large_gradients":  # G_i = x_i within a few float32 steps of base = m, |G_i| ≈ 1e3, b = 1e-8
        layer = nn.Linear(64, 1, bias=False)
        base = 1000 * torch.randn(64, generator=generator)
        x = (base.double() + 1e-4 * torch.randn(batch + 1, 64, generator=generator, dtype=torch.float64)).float()
        y = torch.ones(batch + 1)
        shift, scale = [base[None, :]], [torch.full((1, 64), 1e-8)]
    else:  # with bias: G_i = base + 1e-6·δ_i, ‖δ_i‖ ≈ 1, m = base, b = 1e-6
        layer = nn.Linear(64, 1)
        base = 5 * torch.randn(64, generator=generator)
        delta = torch.randn(batch + 1, 64, generator=generator) / 8
        x, y = base + 1e-6 * delta, torch.ones(batch + 1)
        shift, scale = [base[None, :], torch.ones(1)], [torch.full((1, 64), 1e-6), torch.full((1,), 1e-6)]
    x[batch] = torch.randn(64, generator=generator)  # the replacing example: far from the others
    task, transform = _Residual(layer), CoordinateAffine(shift, scale)
    whole = _released_sum(task, x[:batch], y[:batch], transform, batch)
    removed = _released_sum(task, x[:batch - 1], y[:batch - 1], transform, batch)
    replaced = _released_sum(task, torch.cat([x[:batch - 1], x[batch:]]), torch.cat([y[:batch - 1], y[batch:]]),
                             transform, batch)
    assert float((whole - removed).norm()) <= (1 + 1e-5) / batch
    assert float((whole - replaced).norm()) <= 2 * (1 + 1e-5) / batch
    _, norms = GhostClipper().clipped_sum(task, x[:batch], y[:batch], 1.0, transform)
    factors = clip_factors(norms, 1.0, 1 / batch).double()  # the clipper's own
    gradients = [y.double()[:batch, None, None] * x.double()[:batch, None, :]]
    if layer.bias is not None:
        gradients.append(y.double()[:batch, None])
    exact = torch.cat([torch.tensordot(factors, (g - m.double()) / s.double(), dims=1).flatten()
                       for g, m, s in zip(gradients, shift, scale)])
    assert float((whole - exact).norm()) <= 1e-6 / batch


# --- parameters chosen against the ghost norms (hostile review, 26 November 2026) -------------------------------

BIG, DELTA = 2.0**60, 2.0**46  # +BIG and −(BIG − DELTA) on two positions: the per-example gradient is ~DELTA


def _readout(features: int, positions: tuple[int, int], big: float = BIG, delta: float = DELTA) -> nn.Linear:
    """A frozen readout: logit 0 is +big times feature positions[0] and −(big − delta) times positions[1]."""
    readout = nn.Linear(features, 3, bias=False)
    readout.weight.requires_grad_(False)
    with torch.no_grad():
        readout.weight.zero_()
        readout.weight[0, positions[0]], readout.weight[0, positions[1]] = big, -(big - delta)
    return readout


def _cancelling(kind: str):
    """A model whose one example has two positions with the same input and output gradients +G and −(G − δ): the
    ghost norm Σ_{t,s} (a_t·a_s)(g_t·g_s) is a float32 sum of ±G² terms that rounds to 0."""
    if kind == "linear":
        layer = nn.Linear(2, 2, bias=False)
        model, x = nn.Sequential(layer, Flatten(), _readout(4, (0, 2))), torch.tensor([[[1.0, 0.5], [1.0, 0.5]]])
    elif kind == "conv":
        layer = nn.Conv2d(1, 4, 1, bias=False)
        model, x = nn.Sequential(layer, Flatten(), _readout(8, (0, 1), 2.0**40, 2.0**28)), torch.ones(1, 1, 1, 2)
    else:
        layer = nn.Embedding(5, 2)
        model, x = nn.Sequential(layer, Flatten(), _readout(4, (0, 2))), torch.tensor([[3, 3]])
    with torch.no_grad():
        layer.weight.zero_()  # logits 0, output gradients not
    return Tiny(model), x, torch.tensor([1])


@pytest.mark.parametrize("kind", ["linear", "conv", "embedding"])
def test_exact_norms_cannot_be_cancelled_by_the_parameters(kind):
    """The ghost norms of a sequence Linear, a Conv2d and an Embedding cancelled to 0 under such parameters, so the
    example went unclipped and added 10⁷–10¹³·C. The clipper of an isolated method (``exact``) norms materialized
    per-example gradients instead (the reference path for an Embedding): the example adds at most C."""
    task, x, y = _cancelling(kind)
    with pytest.warns(UserWarning, match="reference path") if kind == "embedding" else contextlib.nullcontext():
        clipper = make_clipper(task.model, exact=True)
    assert clipper.name == ("vmap" if kind == "embedding" else "ghost-exact")
    sums, _ = clipper.clipped_sum(task, x, y, 1.0, into=[torch.zeros_like(p) for p in task.model.parameters()
                                                          if p.requires_grad])
    assert float(torch.sqrt(sum(t.double().square().sum() for t in sums))) <= 1 + 1e-5


def test_the_clipped_sum_is_added_to_the_noise_once():
    """The Embedding's sum was added into the noise token by token: two tokens' terms of ±2²⁴ rounded the noise away
    (two noise draws gave the same release). Each rule now sums into a buffer of its own, added to the noise once."""
    model = nn.Sequential(nn.Embedding(5, 2), Flatten(), _readout(4, (0, 2), 2.0**40, 2.0**16))
    with torch.no_grad():
        model[0].weight.zero_()
    task, x, y = Tiny(model), torch.tensor([[3, 3], [1, 2]]), torch.tensor([1, 1])
    # factor 1 (C = ∞): the terms are ±2⁴⁰/3 and their sum about 2¹⁶/3, as a correct clip factor would leave them
    alone, _ = GhostClipper().clipped_sum(task, x, y, float("inf"))
    releases = []
    for seed in range(3):
        noise = torch.randn(5, 2, generator=torch.Generator().manual_seed(seed))
        released, _ = GhostClipper().clipped_sum(task, x, y, float("inf"), into=[noise.clone()])
        assert torch.equal(released[0], noise + alone[0])
        releases.append(released[0][3])
    assert not torch.equal(releases[0], releases[1])  # the noise survives
