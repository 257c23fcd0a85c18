"""mnist_mlp's networks and profiles, and the DP-PCA of dpbench/privacy/pca.py."""
import json

import dp_accounting
import numpy as np
import pytest
import torch
from dp_accounting import pld
from torch import nn

from dpbench import registry
from dpbench.cli import main
from dpbench.data import mnist
from dpbench.privacy import streams
from dpbench.privacy.accounting import calibrate_noise_multiplier
from dpbench.privacy.pca import dp_pca, noisy_covariance

MNISTMLP = registry.tasks([])["mnist_mlp"]


def run_json(capsys, *args):
    assert main(["run", *args, "--json", "--no-wandb"]) == 0
    return json.loads(capsys.readouterr().out)


def weights(model: nn.Module) -> list[nn.Linear]:
    return [module for module in model.modules() if isinstance(module, nn.Linear)]


def prepared(seed: int, **options) -> MNISTMLP:
    task = MNISTMLP(**options)
    task.prepare(seed)  # as the engine does
    return task


# --- DP-PCA ----------------------------------------------------------------------------------------------------

def spread_rows(n=200, d=8, seed=0) -> torch.Tensor:
    """Rows whose unit-normalized covariance has well-separated eigenvalues."""
    generator = np.random.default_rng(seed)
    return torch.tensor(generator.normal(size=(n, d)) * np.linspace(3.0, 0.3, d), dtype=torch.float32)


def test_pca_without_noise_is_the_top_eigenvectors_of_the_unit_row_covariance():
    x = spread_rows()
    projection, release = dp_pca(x, 3, 0.0)
    rows = x.double().numpy()
    rows /= np.linalg.norm(rows, axis=1, keepdims=True)
    eigenvalues, eigenvectors = np.linalg.eigh(rows.T @ rows)
    expected = eigenvectors[:, np.argsort(eigenvalues)[::-1][:3]]
    signs = np.sign(np.sum(expected * projection.double().numpy(), axis=0))
    np.testing.assert_allclose(projection.double().numpy() * signs, expected, atol=1e-5)
    assert isinstance(release.event, dp_accounting.NonPrivateDpEvent)


def test_pca_noise_is_symmetric_gaussian_fresh_per_seed_and_reproducible():
    x = spread_rows(n=50, d=40)
    clean = noisy_covariance(x, 0.0)
    noise = noisy_covariance(x, 2.0, torch.Generator().manual_seed(1)) - clean
    assert torch.equal(noise, noise.T) and noise.abs().min() > 0
    # (E + Eᵀ)/2 with E_jk ~ N(0, σ²): variance σ² on the diagonal, σ²/2 off it.
    assert noise.diagonal().std() == pytest.approx(2.0, rel=0.3)
    assert noise[np.triu_indices(40, 1)].std() == pytest.approx(2.0 / np.sqrt(2), rel=0.1)
    again = noisy_covariance(x, 2.0, torch.Generator().manual_seed(1)) - clean
    other = noisy_covariance(x, 2.0, torch.Generator().manual_seed(2)) - clean
    assert torch.equal(noise, again) and not torch.allclose(noise, other)


def test_pca_release_is_the_top_eigenvectors_of_the_noisy_covariance_with_orthonormal_columns():
    x = spread_rows(n=100, d=20)
    projection, release = dp_pca(x, 5, 3.0, torch.Generator().manual_seed(4))
    torch.testing.assert_close(projection.T @ projection, torch.eye(5), atol=1e-5, rtol=0)
    noisy = noisy_covariance(x, 3.0, torch.Generator().manual_seed(4)).numpy()
    eigenvalues, eigenvectors = np.linalg.eigh(noisy)
    expected = eigenvectors[:, np.argsort(eigenvalues)[::-1][:5]]
    signs = np.sign(np.sum(expected * projection.double().numpy(), axis=0))
    np.testing.assert_allclose(projection.double().numpy() * signs, expected, atol=1e-5)
    assert release.event == dp_accounting.GaussianDpEvent(3.0) and "σ_p = 3" in release.description


def test_pca_refuses_bad_arguments():
    with pytest.raises(ValueError):
        dp_pca(spread_rows(), 0, 1.0)
    with pytest.raises(ValueError):
        dp_pca(spread_rows(), 3, -1.0)


# --- networks --------------------------------------------------------------------------------------------------

@pytest.mark.parametrize("network, shapes, bias, parameters", [
    ("relu256", [(256, 784), (256, 256), (10, 256)], True, 784 * 256 + 256 * 256 + 256 * 10 + 256 + 256 + 10),
    ("adadp", [(512, 784), (512, 512), (10, 512)], False, 668_672),  # ADADP's code: 784·512 + 512·512 + 512·10
    ("adadp256", [(256, 784), (256, 256), (10, 256)], False, 268_800),  # the paper's text says 334,336
    ("adaclip", [(1000, 60), (10, 1000)], False, 70_000),  # 60·1000 + 1000·10 after the 784 → 60 projection
])
def test_architectures(mirror, network, shapes, bias, parameters):
    task = prepared(0, network=network)
    layers = weights(task.model)
    assert [tuple(layer.weight.shape) for layer in layers] == shapes
    assert all((layer.bias is not None) == bias for layer in layers)
    assert sum(p.numel() for p in task.model.parameters()) == parameters
    relus = sum(isinstance(module, nn.ReLU) for module in task.model.modules())
    assert relus == len(shapes) - 1
    assert task.model(task.data.x_test[:3]).shape == (3, 10)


def test_adadp_initialization_follows_its_code_fan_out_rule(mirror):
    layers = weights(prepared(0, network="adadp").model)
    for layer, bound in zip(layers, [1 / 512**0.5, 1 / 512**0.5, 1 / 10**0.5]):
        assert layer.weight.abs().max() <= bound and layer.weight.abs().max() > 0.95 * bound


def test_adadp_inputs_are_normalized_with_the_mnist_constants(mirror):
    raw = mnist.load_mnist()
    task = prepared(0, network="adadp")
    torch.testing.assert_close(task.data.x_train, (raw.x_train - 0.1307) / 0.3081)
    torch.testing.assert_close(task.data.x_test, (raw.x_test - 0.1307) / 0.3081)
    assert task.data.private_releases == () and "0.3081" in task.data.preprocessing
    assert torch.equal(prepared(0, network="relu256").data.x_train, raw.x_train)  # the default is unchanged
    assert raw.x_train.max() == 1.0  # the cached data was not modified in place


def test_adaclip_network_projects_both_splits_with_a_fresh_pca_per_seed(mirror):
    raw = mnist.load_mnist()
    first, other = (prepared(seed, network="adaclip") for seed in (0, 1))
    assert first.data.x_train.shape == (raw.n_train, 60) and first.data.x_test.shape == (10_000, 60)
    assert not torch.allclose(first.data.x_train, other.data.x_train)  # drawn again, not cached
    projection, _ = dp_pca(raw.x_train, 60, 7.0, streams.generator(0, "dp-pca"))  # the run's own DP-PCA stream
    torch.testing.assert_close(first.data.x_train, raw.x_train @ projection)  # seeded
    torch.testing.assert_close(first.data.x_test, raw.x_test @ projection)  # the test split, same directions
    (release,) = first.data.private_releases
    assert release.event == dp_accounting.GaussianDpEvent(7.0)


def test_unknown_network_is_refused(mirror, refused):
    assert "network" in refused("run", "--method", "dpsgd", "--task", "mnist_mlp", "--set", "network=resnet")


# --- profiles end to end -----------------------------------------------------------------------------------------

def test_smoke_profile_adadp_network_gets_plain_calibration(mirror, capsys):
    record = run_json(capsys, "--method", "ada_dp", "--task", "mnist_mlp", "--profile", "smoke")
    hp = record["hyperparameters"]
    assert hp["network"] == "adadp" and record["data_id"] in ("mnist", "mnist-5k-train")
    assert record["data_releases"] == [] and record["epsilon"] <= 2.0
    n = round(hp["batch_size"] / record["sample_rate"])
    planned = hp["epochs"] * round(n / (2 * hp["batch_size"])) * 2
    assert record["gradient_evaluations"] == planned
    assert record["noise_multiplier"] == calibrate_noise_multiplier(2.0, record["delta"], record["sample_rate"],
                                                                    planned)
    assert record["metrics"]["test_accuracy"] > 0.3


def test_smoke_adaclip_profile_charges_the_pca_with_the_training(mirror, capsys):
    record = run_json(capsys, "--method", "adaclip", "--task", "mnist_mlp", "--profile", "smoke-adaclip")
    assert record["hyperparameters"]["network"] == "adaclip" and len(record["data_releases"]) == 1
    assert "σ_p = 7" in record["data_releases"][0]
    q, sigma, delta = record["sample_rate"], record["noise_multiplier"], record["delta"]
    training = dp_accounting.SelfComposedDpEvent(
        dp_accounting.PoissonSampledDpEvent(q, dp_accounting.GaussianDpEvent(sigma)), record["gradient_evaluations"])
    both = pld.PLDAccountant().compose(dp_accounting.ComposedDpEvent([dp_accounting.GaussianDpEvent(7.0), training]))
    alone = pld.PLDAccountant().compose(training)
    assert record["epsilon"] == pytest.approx(both.get_epsilon(delta), rel=1e-9)
    assert alone.get_epsilon(delta) < record["epsilon"] - 0.05 and record["epsilon"] <= 2.0
    assert record["epsilon"] > 1.99  # calibrated to the rest of the budget, not merely below it


def test_pca_noise_option_sets_the_split(mirror, capsys):
    record = run_json(capsys, "--method", "dpsgd", "--task", "mnist_mlp", "--profile", "smoke-adaclip",
                      "--set", "pca_noise_multiplier=3")
    assert "σ_p = 3" in record["data_releases"][0] and record["hyperparameters"]["clip"] == 4.0
    q, releases, delta = record["sample_rate"], record["gradient_evaluations"], record["delta"]

    def training_sigma(pca_sigma):
        return calibrate_noise_multiplier(2.0, delta, q, releases,
                                          preceded_by=(dp_accounting.GaussianDpEvent(pca_sigma),))

    assert record["noise_multiplier"] == training_sigma(3.0) > training_sigma(7.0)  # less is left for training
