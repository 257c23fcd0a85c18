"""Federated averaging (Koskela & Honkela, Section "Adaptive federated averaging algorithm"): ADADP's client rule
by hand (accepted and rejected steps), against methods/ada_dp.py and against Algorithm 2 written out per client,
stacked gradients and optimizers against per-client ones, FedAvg's weighted average, the split's composition, and
the command end to end (smoke profile, W&B, the store, bad input)."""
import json
import math

import pytest
import torch
from torch import nn

from dpbench import registry
from dpbench.cli import main
from dpbench.data import cifar
from dpbench.federated import experiment
from dpbench.federated.fedavg import (CLIENT_CLASSES, AdaDPClients, StackedModel, available_client_size, average, client_split,
                                      local_round, make_clients)
from dpbench.privacy import streams
from dpbench.results import store
from dpbench.method import GradientMechanism
from tests.test_wandb import logged

HP = {"lr": 0.1, "tol": 0.12, "alpha_min": 0.9, "alpha_max": 1.1}

# Two clients, θ = (w, b) with w = (3, 0.5), b = (−2) for both, η = 0.1, tol = 0.12. By hand (methods/ada_dp's test
# case for client 0; client 1 has twice its gradients):
# client 0: θ1 = ((2.8, 0.4), (−2.4)), θ½ = ((2.9, 0.45), (−2.2)), θ̂ = ((2.85, 0.5), (−2.3)),
#   err² = (0.05/2.8)² + (0.1/1)² + (0.1/2.4)², err = 0.1097952 < tol: θ ← θ1, η ← 0.1·(0.12/err) = 0.1092944
# client 1: θ1 = ((2.6, 0.3), (−2.8)), θ½ = ((2.8, 0.4), (−2.4)), θ̂ = ((2.7, 0.5), (−2.6)),
#   err² = (0.1/2.6)² + (0.2/1)² + (0.2/2.8)², err = 0.2158270 ≥ tol: θ kept, η ← 0.1·max(0.556, 0.9) = 0.09
THETA = [torch.tensor([3.0, 0.5]), torch.tensor([-2.0])]
G1 = [torch.tensor([2.0, 1.0]), torch.tensor([4.0])]
G2 = [torch.tensor([1.0, -1.0]), torch.tensor([2.0])]
ERR = (math.sqrt((0.05 / 2.8) ** 2 + 0.1**2 + (0.1 / 2.4) ** 2),
       math.sqrt((0.1 / 2.6) ** 2 + 0.2**2 + (0.2 / 2.8) ** 2))


def stacked(*per_client):
    """[client 0's tensors, client 1's tensors, ...] -> one tensor per parameter with a leading client dimension."""
    return [torch.stack(tensors) for tensors in zip(*per_client)]


class ScriptedGradients:
    """Stands in for StackedModel: returns given stacked gradients, records where each was asked for."""

    def __init__(self, gradients):
        self.gradients, self.asked_at = iter(gradients), []

    def __call__(self, params, x, y):
        self.asked_at.append([p.clone() for p in params])
        return [g.clone() for g in next(self.gradients)]


def test_hand_worked_errors():
    assert ERR[0] == pytest.approx(0.1097952, abs=1e-7) and ERR[1] == pytest.approx(0.2158270, abs=1e-7)


def test_adadp_client_rule_is_algorithm_2_with_rejection_by_hand():
    params = stacked(THETA, THETA)
    before = [p.clone() for p in params]
    script = ScriptedGradients([stacked(G1, [2 * g for g in G1]), stacked(G2, [2 * g for g in G2])])
    clients = AdaDPClients(params, dict(HP))
    accepted = clients.step(script, [(None, None), (None, None)])
    assert accepted.tolist() == [True, False]
    torch.testing.assert_close(script.asked_at[0], before)  # G1 at θ
    torch.testing.assert_close(script.asked_at[1], stacked([torch.tensor([2.9, 0.45]), torch.tensor([-2.2])],
                                                           [torch.tensor([2.8, 0.4]), torch.tensor([-2.4])]))  # at θ½
    torch.testing.assert_close(params, stacked([torch.tensor([2.8, 0.4]), torch.tensor([-2.4])], THETA))
    torch.testing.assert_close(clients.lr, torch.tensor([0.1 * 0.12 / ERR[0], 0.1 * 0.9]))
    assert clients.round_summary() == {"client_lr": pytest.approx([0.1 * 0.12 / ERR[0], 0.09]),
                                       "accepted_fraction": [1.0, 0.0]}


def test_eta_grows_by_at_most_alpha_max_and_zero_error_accepts():
    params = stacked(THETA)
    clients = AdaDPClients(params, dict(HP))
    same = stacked(G1)
    assert clients.step(ScriptedGradients([same, same]), [(None, None)] * 2).tolist() == [True]  # err = 0
    torch.testing.assert_close(params, stacked([torch.tensor([2.8, 0.4]), torch.tensor([-2.4])]))
    torch.testing.assert_close(clients.lr, torch.tensor([0.1 * 1.1]))


class ScriptedReleases:
    def __init__(self, gradients):
        self.gradients = iter(gradients)

    def __call__(self):
        return next(self.gradients)


@pytest.mark.parametrize("scale", [1.0, 2.0])  # accepted (err < tol) and rejected (err ≥ tol)
def test_without_rejection_the_rule_is_methods_ada_dp_paper_variant(scale):
    """methods/ada_dp.py with variant="paper", σ = 0 and C = ∞ takes the same η and, where err < tol, the same
    θ; where err ≥ tol it moves to θ1 all the same, and the federated rule stays at θ."""
    g1, g2 = [scale * g for g in G1], [scale * g for g in G2]
    method_params = [nn.Parameter(t.clone()) for t in THETA]
    AdaDP = registry.methods([])["ada_dp"]
    method = AdaDP(method_params, {**AdaDP.defaults, **HP, "variant": "paper"},
                   GradientMechanism(noise_multiplier=0.0, clip=math.inf, expected_batch_size=10.0))
    method.step(ScriptedReleases([g1, g2]))
    params = stacked(THETA)
    clients = AdaDPClients(params, dict(HP))
    accepted = bool(clients.step(ScriptedGradients([stacked(g1), stacked(g2)]), [(None, None)] * 2))
    assert accepted == (scale == 1.0)
    assert float(clients.lr) == pytest.approx(method.lr, rel=1e-6)
    expected = [p.detach() for p in method_params] if accepted else THETA
    torch.testing.assert_close([p[0] for p in params], expected)


class TinyTask:
    """What StackedModel needs of a task: a Sequential model and a per-example loss."""

    def __init__(self, model):
        self.model = model

    def per_example_loss(self, outputs, targets):
        return nn.functional.cross_entropy(outputs, targets, reduction="none")


def tiny_model(bias: bool) -> nn.Sequential:
    return nn.Sequential(nn.Linear(4, 6, bias=bias), nn.ReLU(), nn.Linear(6, 3, bias=bias))


def client_model(model: nn.Sequential, params, k: int) -> nn.Sequential:
    """Client k's slice of stacked parameters as an ordinary model (weights back to (out, in))."""
    copy = tiny_model(model[0].bias is not None)
    with torch.no_grad():
        values = iter(params)
        for module in copy:
            if isinstance(module, nn.Linear):
                module.weight.copy_(next(values)[k].t())
                if module.bias is not None:
                    module.bias.copy_(next(values)[k, 0])
    return copy


def perturbed(params, seed=1):
    generator = torch.Generator().manual_seed(seed)
    return [p + 0.3 * torch.randn(p.shape, generator=generator) for p in params]


@pytest.mark.parametrize("bias", [False, True])
def test_stacked_gradients_are_each_clients_own(bias):
    torch.manual_seed(0)
    model = StackedModel(TinyTask(tiny_model(bias)))
    params = perturbed(model.stack(3))  # three different clients
    x, y = torch.randn(3, 5, 4), torch.randint(0, 3, (3, 5))
    gradients = model(params, x, y)
    for k in range(3):
        own = client_model(model.task.model, params, k)
        loss = nn.functional.cross_entropy(own(x[k]), y[k])
        grads = torch.autograd.grad(loss, list(own.parameters()))  # weight, (bias,) weight, (bias)
        expected = [g.t() if g.dim() == 2 else g.view(1, -1) for g in grads]
        torch.testing.assert_close([g[k] for g in gradients], expected)


def test_adadp_clients_on_a_real_model_follow_algorithm_2_per_client():
    """Stacked ADADP iterations equal Algorithm 2 (with the err < tol condition) written out literally for each
    client's own model: θ1, θ½, θ̂ as separate vectors, err by equation (6)."""
    torch.manual_seed(0)
    model = StackedModel(TinyTask(tiny_model(False)))
    params = perturbed(model.stack(3))
    hp = {"lr": 0.5, "tol": 0.1, "alpha_min": 0.9, "alpha_max": 1.1}
    clients = AdaDPClients(params, dict(hp))
    reference = [[p[k].clone() for p in params] for k in range(3)]
    lrs = [hp["lr"]] * 3
    decisions = []
    for _ in range(6):
        x, y = torch.randn(2, 3, 5, 4), torch.randint(0, 3, (2, 3, 5))
        accepted = clients.step(model, [(x[0], y[0]), (x[1], y[1])])
        decisions += accepted.tolist()
        for k in range(3):
            theta, lr = reference[k], lrs[k]

            def grad_at(point, batch):
                single = [p.unsqueeze(0) for p in point]
                return [g[0] for g in model(single, x[batch, k:k + 1], y[batch, k:k + 1])]

            g1 = grad_at(theta, 0)
            theta_1 = [t - lr * g for t, g in zip(theta, g1)]
            theta_half = [t - lr / 2 * g for t, g in zip(theta, g1)]
            theta_hat = [t - lr / 2 * g for t, g in zip(theta_half, grad_at(theta_half, 1))]
            err = math.sqrt(sum(float(((a - b).abs() / a.abs().clamp(min=1)).square().sum())
                                for a, b in zip(theta_1, theta_hat)))
            assert bool(accepted[k]) == (err < hp["tol"])
            reference[k] = theta_1 if err < hp["tol"] else theta
            lrs[k] = min(max(hp["tol"] / err, 0.9), 1.1) * lr
    assert True in decisions and False in decisions  # both branches ran
    for k in range(3):
        torch.testing.assert_close([p[k] for p in params], reference[k], rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(clients.lr, torch.tensor(lrs), rtol=1e-5, atol=0)


@pytest.mark.parametrize("method, hp", [("sgd", {"lr": 0.1}),
                                        ("adam", {"lr": 0.01, "beta1": 0.9, "beta2": 0.999, "eps": 1e-8})])
def test_local_rounds_are_each_clients_own_torch_optimizer_on_its_own_batches(method, hp):
    """Two local rounds of SGD and Adam clients (one-client views of stacked tensors, hand-written backpropagation,
    SGD fused into it) equal, client by client, an ordinary model trained with autograd and ``torch.optim`` on the
    batches that stream ``client-batches`` deals."""
    torch.manual_seed(0)
    model = StackedModel(TinyTask(tiny_model(True)))
    params = perturbed(model.stack(2))
    references = [client_model(model.task.model, params, k) for k in range(2)]
    optimizers = [torch.optim.SGD(r.parameters(), lr=hp["lr"]) if method == "sgd"
                  else torch.optim.Adam(r.parameters(), lr=hp["lr"]) for r in references]
    x, y = torch.randn(2, 10, 4), torch.randint(0, 3, (2, 10))
    clients = make_clients(method, params, hp)
    for round_number in (1, 2):
        assert local_round(clients, model, x, y, 5, 7, round_number) == 2
        generator = streams.generator(7, "client-batches", round_number)
        for k, order in enumerate([torch.randperm(10, generator=generator) for _ in range(2)]):
            for batch in order.split(5):
                optimizers[k].zero_grad()
                nn.functional.cross_entropy(references[k](x[k, batch]), y[k, batch]).backward()
                optimizers[k].step()
    for k in range(2):
        expected = [p.detach().t() if p.dim() == 2 else p.detach().view(1, -1) for p in references[k].parameters()]
        torch.testing.assert_close([p[k] for p in params], expected)


def test_fedavg_weighted_average_by_hand():
    # Three clients with n = 1, 2, 3 examples: weights 1/6, 2/6, 3/6.
    params = [torch.tensor([[1.0, 0.0], [4.0, 6.0], [-2.0, 12.0]]), torch.tensor([[6.0], [0.0], [2.0]])]
    weights = torch.tensor([1.0, 2.0, 3.0], dtype=torch.float64) / 6
    # (1 + 8 − 6)/6 = 0.5, (0 + 12 + 36)/6 = 8; (6 + 0 + 6)/6 = 2
    torch.testing.assert_close(average(params, weights), [torch.tensor([0.5, 8.0]), torch.tensor([2.0])])


def balanced_labels(per_class: int) -> torch.Tensor:
    """Labels 0..9, ``per_class`` of each, interleaved as the JPEG loader orders them."""
    return torch.arange(10).repeat(per_class)


def class_counts(labels, index):
    return labels[index].bincount(minlength=10)


def test_pathological_split_gives_each_client_its_two_classes():
    labels = balanced_labels(30)
    split = client_split(labels, 0.0, 40, seed=0)
    for k, pair in enumerate(CLIENT_CLASSES):
        expected = torch.zeros(10, dtype=torch.long)
        for name in pair:
            expected[cifar.CIFAR10_CLASSES.index(name)] = 20
        assert class_counts(labels, split[k]).tolist() == expected.tolist()
        first = [set((labels == cifar.CIFAR10_CLASSES.index(n)).nonzero().flatten()[:20].tolist()) for n in pair]
        assert set(split[k].tolist()) == first[0] | first[1]  # the first 20 of each class, in loader order
    # Client 1 has cars and trucks, client 2 planes and ships, ... (the paper's pairs).
    assert [set(p) for p in CLIENT_CLASSES][:2] == [{"automobile", "truck"}, {"airplane", "ship"}]
    assert available_client_size(labels) == 60


def test_random_split_is_uniform_and_a_partition():
    labels = balanced_labels(500)
    split = client_split(labels, 1.0, 1000, seed=0)
    everything = torch.cat(split)
    assert len(everything) == 5000 and len(set(everything.tolist())) == 5000  # each image once
    assert sorted(everything.tolist()) == list(range(5000))  # all of them (500 per class, 10 classes)
    for index in split:
        counts = class_counts(labels, index)
        assert len(index) == 1000 and ((counts > 50) & (counts < 150)).all(), counts  # mean 100, sd ≈ 8.5
    assert [s.tolist() for s in client_split(labels, 1.0, 1000, seed=0)] == [s.tolist() for s in split]
    assert [s.tolist() for s in client_split(labels, 1.0, 1000, seed=1)] != [s.tolist() for s in split]


def test_a_third_random_keeps_two_thirds_of_each_clients_own_classes():
    labels = balanced_labels(300)
    split = client_split(labels, 1 / 3, 600, seed=3)
    for k, pair in enumerate(CLIENT_CLASSES):
        counts = class_counts(labels, split[k])
        own = sum(int(counts[cifar.CIFAR10_CLASSES.index(n)]) for n in pair)
        assert len(split[k]) == 600 and 400 <= own < 600 and (counts > 0).sum() == 10
    assert len(set(torch.cat(split).tolist())) == 3000


# --- the command ------------------------------------------------------------------------------------------------------

def federated_json(capsys, *args):
    assert main(["federated", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("method", ["ada_dp", "sgd", "adam"])
def test_smoke_profile_end_to_end(cifar_home, capsys, method):
    record = federated_json(capsys, "--client-method", method, "--task", "cifar10", "--random-fraction", "1/3",
                            "--profile", "smoke", "--seed", "2")
    assert record["kind"] == "federated" and record["method"] == "fedavg" and record["client_method"] == method
    assert record["settings"]["rounds"] == 2 and record["settings"]["clients"] == 5
    assert record["settings"]["random_fraction"] == pytest.approx(1 / 3) and record["settings"]["client_size"] == 200
    assert record["settings"]["local_steps"] == (10 if method == "ada_dp" else 20)
    assert record["hyperparameters"] == experiment.HYPERPARAMETERS[method]
    assert [row["round"] for row in record["history"]] == [1, 2]
    assert record["metrics"]["test_accuracy"] == record["history"][-1]["test_accuracy"]
    assert 0 < record["metrics"]["test_accuracy"] < 1 and record["n_test"] == 10000
    assert [sum(counts) for counts in record["split"]["class_counts"]] == [200] * 5
    assert record["data_id"] == "cifar10-jpeg-train40k-first2000" and record["git_commit"]
    assert set(record["code"]["federated"]) == {"dpbench/federated/fedavg.py", "dpbench/federated/experiment.py"}
    if method == "ada_dp":
        assert len(record["history"][0]["client_lr"]) == 5
    # Stored, as a federated record the leaderboard and the sweep do not read.
    assert [r["run_id"] for r in store.load(kind="federated")] == [record["run_id"]]
    assert store.load() == []


def test_same_seed_same_run_other_seed_other_run(cifar_home, capsys):
    args = ("--client-method", "sgd", "--random-fraction", "0", "--profile", "smoke", "--rounds", "1")
    first, again = federated_json(capsys, *args), federated_json(capsys, *args)
    other = federated_json(capsys, *args, "--seed", "1")
    assert first["history"] == again["history"]
    assert first["history"] != other["history"]


def test_wandb_logs_every_round(cifar_home, monkeypatch, capsys):
    monkeypatch.setenv("WANDB_MODE", "offline")
    record = federated_json(capsys, "--client-method", "ada_dp", "--random-fraction", "1", "--profile", "smoke",
                            "--wandb-project", "dpbench-tests")
    config, history, summary = logged(cifar_home)
    assert config["client_method"] == "ada_dp" and config["settings"]["random_fraction"] == 1.0
    rounds = [row for row in history if "test_accuracy" in row]
    assert [row["round"] for row in rounds] == [1, 2]
    assert [row["test_accuracy"] for row in rounds] == [row["test_accuracy"] for row in record["history"]]
    assert json.loads(summary["dpbench_federated_record"]) == record and "dpbench_record" not in summary


@pytest.mark.parametrize("args, message", [
    (["--client-method", "sgdd", "--random-fraction", "0"], "unknown client method"),
    (["--client-method", "sgd", "--random-fraction", "1.5"], "must lie in [0, 1]"),
    (["--client-method", "sgd", "--random-fraction", "a third"], "number or a fraction"),
    (["--client-method", "sgd", "--random-fraction", "0", "--task", "adult"], "cifar10 only"),
    (["--client-method", "sgd", "--random-fraction", "0", "--client-size", "301"], "even number"),
    (["--client-method", "sgd", "--random-fraction", "0", "--rounds", "0"], "at least 1"),
    (["--client-method", "sgd", "--random-fraction", "0", "--set", "tol=0.1"], "no hyperparameter 'tol'"),
    (["--client-method", "ada_dp", "--random-fraction", "0", "--set", "tol=x"], "not a valid float"),
    (["--client-method", "ada_dp", "--random-fraction", "0", "--lr", "-1"], "finite and positive"),
    (["--client-method", "adam", "--random-fraction", "0", "--profile", "fast"], "no federated profile"),
    (["--client-method", "adam", "--random-fraction", "0", "--client-state", "forget"], "keep, reset"),
    (["--client-method", "adam", "--random-fraction", "0", "--seed", "-1"], "seed"),
])
def test_bad_input_is_refused_in_one_line(refused, args, message):
    assert message in refused("federated", *args)


def test_too_large_client_size_is_refused(cifar_home, refused):
    assert "exceeds the 400 images per client" in refused("federated", "--client-method", "sgd", "--random-fraction",
                                                          "0", "--profile", "smoke", "--client-size", "402")


def test_leaderboard_and_sweep_read_no_federated_record(isolated_home, capsys):
    from dpbench.board import sweep

    federated_record = {"kind": "federated", "task": "breast_cancer", "method": "fedavg", "data_id": "breast_cancer",
                        "created_at": "2026-01-01T00:00:00+00:00", "run_id": "0123456789abcdef", "seed": 0,
                        "metrics": {"test_accuracy": 0.5}, "private": False, "ledger_version": 2}
    store.append(federated_record)
    assert main(["run", "--method", "dpsgd", "--task", "breast_cancer", "--epochs", "1"]) == 0
    assert main(["leaderboard", "--format", "md"]) == 0  # a federated record in the tables would raise KeyError
    board = capsys.readouterr().out
    assert "dpsgd" in board and "fedavg" not in board
    assert [r["method"] for r in store.load()] == ["dpsgd"]
    assert store.load(kind="federated") == [federated_record]
    assert len(sweep._stored()) == 1  # engine.identity would need fields a federated record lacks
