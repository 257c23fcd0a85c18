"""CIFAR-10 tasks: loaders (canonical pickles and the mirror's JPEG copy), augmentation, the two models, pretraining
caches and both smoke profiles end to end through the command line."""
import hashlib
import io
import json
import pickle
import tarfile
import warnings

import numpy as np
import torch
from torch.nn import functional as F

from dpbench.cli import main
from dpbench.data import cifar as cifar_data
from dpbench.data.files import RemoteFile
from dpbench.methods.ada_dp import AdaDP
from dpbench.methods.dpadam_bc import DPAdamBC
from dpbench.methods.dpsgd import DPSGD
from dpbench.privacy.clipping import VmapClipper
from dpbench.privacy.ghost import GhostClipper, make_clipper
from dpbench.results import store
from dpbench.spec import profile_settings, resolve_hyperparameters
from dpbench.tasks import cifar


def run_json(capsys, *args):
    assert main(["run", *args, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


# --- loaders --------------------------------------------------------------------------------------------------------

def test_jpeg_mirror_loads_all_images_balanced_under_its_own_id(cifar_home):
    data = cifar_data.load_cifar10()
    assert data.data_id == "cifar10-jpeg" and "lossy" in data.note
    assert data.x_train.shape == (50000, 3, 32, 32) and data.x_test.shape == (10000, 3, 32, 32)
    assert data.x_train.dtype == torch.uint8
    assert data.y_train.bincount().tolist() == [5000] * 10 and data.y_test.bincount().tolist() == [1000] * 10
    # Ordered by file number, then class: every prefix of a multiple of 10 images is balanced.
    assert data.y_train[:20].tolist() == list(range(10)) * 2
    assert data.y_train[:10000].bincount().tolist() == [1000] * 10
    assert 40 < data.x_train[:100].float().mean() < 220  # decoded pixels, not zeros


def _pickled_batch(images: np.ndarray, labels: list[int], key: bytes) -> bytes:
    return pickle.dumps({b"data": images.reshape(len(images), 3072), key: labels})


def _tar_gz(members: dict[str, bytes]) -> bytes:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w:gz") as archive:
        for name, payload in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(payload)
            archive.addfile(info, io.BytesIO(payload))
    return buffer.getvalue()


def _mirror_with(tmp_path, monkeypatch, attribute, folder, name, payload):
    """A mirror holding ``payload`` as the canonical file ``datasets.<attribute>``, with its checksum."""
    (tmp_path / folder).mkdir()
    (tmp_path / folder / name).write_bytes(payload)
    monkeypatch.setenv("DPBENCH_MIRROR", str(tmp_path))
    monkeypatch.setattr(cifar_data, attribute, RemoteFile(
        folder, name, "https://example.invalid/", f"md5:{hashlib.md5(payload).hexdigest()}"))


def test_canonical_pickles_are_parsed_channel_first_in_batch_order(tmp_path, monkeypatch):
    """A tiny release in the canonical layout: 2 images per batch file; pixel (c, h, w) is byte c·1024 + h·32 + w."""
    rng = np.random.default_rng(0)
    batches = {name: rng.integers(0, 256, (2, 3, 32, 32), dtype=np.uint8)
               for name in [f"data_batch_{i}" for i in range(1, 6)] + ["test_batch"]}
    labels = {name: [i % 10, (i + 3) % 10] for i, name in enumerate(batches)}
    members = {"cifar-10-batches-py/batches.meta": pickle.dumps({b"label_names": []})}
    members |= {f"cifar-10-batches-py/{name}": _pickled_batch(images, labels[name], b"labels")
                for name, images in reversed(batches.items())}  # archive order differs from the split order
    _mirror_with(tmp_path, monkeypatch, "CIFAR10_PYTHON", "cifar10", "cifar-10-python.tar.gz", _tar_gz(members))
    data = cifar_data.load_cifar10()
    assert data.data_id == "cifar10" and data.note is None
    order = [f"data_batch_{i}" for i in range(1, 6)]
    assert torch.equal(data.x_train, torch.from_numpy(np.concatenate([batches[name] for name in order])))
    assert data.y_train.tolist() == [label for name in order for label in labels[name]]
    flat = batches["test_batch"].reshape(2, 3072)
    assert data.x_test[1, 2, 5, 7] == flat[1, 2 * 1024 + 5 * 32 + 7] and data.y_test.tolist() == labels["test_batch"]


def test_cifar100_pickles_use_the_fine_labels(tmp_path, monkeypatch):
    images = np.arange(2 * 3072, dtype=np.int64).reshape(2, 3, 32, 32).astype(np.uint8)
    batch = {b"data": images.reshape(2, 3072), b"fine_labels": [42, 99], b"coarse_labels": [1, 2]}
    payload = _tar_gz({"cifar-100-python/train": pickle.dumps(batch), "cifar-100-python/test": pickle.dumps(batch)})
    _mirror_with(tmp_path, monkeypatch, "CIFAR100_PYTHON", "cifar100", "cifar-100-python.tar.gz", payload)
    data = cifar_data.load_cifar100()
    assert data.data_id == "cifar100" and data.y_train.tolist() == [42, 99]
    assert torch.equal(data.x_train, torch.from_numpy(images))


def test_public_slice_is_disjoint_from_the_private_split(cifar_home):
    cifar10 = cifar_data.load_cifar10()
    task = cifar.CIFAR10ADADP()
    assert task.pretraining_source() == "cifar10_first10k"  # the mirror has no CIFAR-100
    public_images, public_labels, classes, public_id, where, private = task.split(cifar10)
    assert (public_id, private.data_id, classes) == ("cifar10-jpeg-first10k", "cifar10-jpeg-train40k", 10)
    assert "substitute for CIFAR-100" in where
    # Disjoint as index ranges of the training set: [0, 10000) public, [10000, 50000) private, together all of it.
    assert torch.equal(public_images, cifar10.x_train[:10000]) and torch.equal(public_labels, cifar10.y_train[:10000])
    assert torch.equal(private.x_train, cifar10.x_train[10000:])
    assert torch.equal(private.y_train, cifar10.y_train[10000:])
    assert torch.equal(private.x_test, cifar10.x_test)
    assert private.y_train.bincount().tolist() == [4000] * 10
    limited = cifar.CIFAR10ADADP(train_limit=2000, pretrain_limit=1000).split(cifar10)
    assert limited[3] == "cifar10-jpeg-first10k-first1000" and limited[5].data_id == "cifar10-jpeg-train40k-first2000"
    assert torch.equal(limited[5].x_train, cifar10.x_train[10000:12000])


# --- augmentation and models ----------------------------------------------------------------------------------------

def test_crop_and_flip_is_a_padded_crop_of_each_image_on_its_own():
    images = torch.randint(0, 256, (6, 3, 32, 32), dtype=torch.uint8)
    torch.manual_seed(1)
    augmented = cifar.random_crop_flip(images)
    assert augmented.shape == images.shape and augmented.dtype == torch.uint8
    padded = F.pad(images, (4, 4, 4, 4))
    for i in range(len(images)):  # every output is one of the 9 x 9 x 2 candidates, found by brute force
        candidates = [window.flip(-1) if flip else window
                      for top in range(9) for left in range(9) for flip in (False, True)
                      for window in [padded[i, :, top:top + 32, left:left + 32]]]
        assert any(torch.equal(augmented[i], candidate) for candidate in candidates)
    others = images.clone()
    others[1:] = torch.randint(0, 256, (5, 3, 32, 32), dtype=torch.uint8)
    torch.manual_seed(1)
    assert torch.equal(cifar.random_crop_flip(others)[0], augmented[0])  # same draws, other images: same result
    torch.manual_seed(2)
    many = cifar.random_crop_flip(images[:1].expand(64, -1, -1, -1))
    assert len({tuple(image.flatten().tolist()) for image in many}) > 10  # the draws vary
    assert cifar.random_crop_flip(images[:0]).shape == (0, 3, 32, 32)  # an empty Poisson batch


def test_augmentation_option():
    images = torch.randint(0, 256, (3, 3, 32, 32), dtype=torch.uint8)
    assert torch.equal(cifar.CIFAR10CNN(augment=False).augment(images), images)
    torch.manual_seed(0)
    assert not torch.equal(cifar.CIFAR10CNN().augment(images), images)


def test_cnn_shapes_and_ghost_clipping_match_the_reference():
    task = cifar.CIFAR10CNN()
    task.model = task.build_model(None)
    convolutions = [m for m in task.model if isinstance(m, torch.nn.Conv2d)]
    assert [(m.out_channels, m.padding) for m in convolutions] == [
        (32, (0, 0)), (64, (1, 1)), (128, (1, 1)), (256, (1, 1)), (10, (1, 1))]
    x, y = torch.randint(0, 256, (4, 3, 32, 32), dtype=torch.uint8), torch.tensor([0, 3, 7, 9])
    assert task(x).shape == (4, 10)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no fallback to the vmap path
        clipper = make_clipper(task.model)
    assert isinstance(clipper, GhostClipper)
    fast, fast_norms = clipper.clipped_sum(task, x, y, 0.5)
    slow, slow_norms = VmapClipper().clipped_sum(task, x, y, 0.5)
    torch.testing.assert_close(fast_norms, slow_norms, rtol=1e-4, atol=1e-5)
    for a, b in zip(fast, slow):
        torch.testing.assert_close(a, b, rtol=1e-4, atol=1e-5)


def test_adadp_convolutions_give_1600_features():
    assert cifar.adadp_convolutions()(torch.zeros(2, 3, 32, 32, dtype=torch.uint8)).shape == (2, 1600)
    task = cifar.CIFAR10ADADP()
    head = task.build_model(None)
    assert [tuple(p.shape) for p in head.parameters()] == [(500, 1600), (500, 500), (10, 500)]  # no biases


def test_paper_profiles():
    hp, options = resolve_hyperparameters(DPSGD, cifar.CIFAR10CNN, {}, "paper")
    assert (hp["lr"], hp["batch_size"], hp["clip"], hp["epochs"], options["augment"]) == (4.0, 2048, 1.0, 28, True)
    hp, _ = resolve_hyperparameters(DPAdamBC, cifar.CIFAR10CNN, {}, "paper")
    assert (hp["lr"], hp["gamma_prime"]) == (1e-3, 1e-8)
    assert {k: v for k, v in profile_settings(cifar.CIFAR10CNN, "dpsgd", "paper").items()
            if k in ("noise_multiplier", "delta")} == {"noise_multiplier": 1.0, "delta": 1e-5}
    hp, _ = resolve_hyperparameters(AdaDP, cifar.CIFAR10ADADP, {}, "paper")
    assert (hp["lr"], hp["batch_size"], hp["clip"], hp["epochs"], hp["adapt_epochs"]) == (0.1, 200, 3.0, 100, 50)
    assert profile_settings(cifar.CIFAR10ADADP, "ada_dp", "paper")["noise_multiplier"] == 2.0


# --- end to end -----------------------------------------------------------------------------------------------------

def test_cnn_smoke_profile_end_to_end(capsys, cifar_home, recwarn):
    record = run_json(capsys, "--method", "dpsgd", "--task", "cifar10_cnn", "--profile", "smoke")
    assert record["data_id"] == "cifar10-jpeg-first2000" and record["n_train"] == 2000 and record["n_test"] == 10000
    assert record["epsilon"] <= 8.0 and record["hyperparameters"]["lr"] == 4.0
    assert 0.0 < record["metrics"]["test_accuracy"] <= 1.0
    assert not [w for w in recwarn if "vmap" in str(w.message)]


def test_adadp_smoke_profile_caches_frozen_layers_and_features(capsys, cifar_home, monkeypatch):
    folder = cifar_home / "cache" / "cifar10"
    record = run_json(capsys, "--method", "ada_dp", "--task", "cifar10", "--profile", "smoke")
    assert record["data_id"] == "cifar10-jpeg-train40k-first2000" and record["n_train"] == 2000
    assert "substitute for CIFAR-100" in record["data_note"] and "pretrained non-privately" in record["preprocessing"]
    assert record["epsilon"] <= 0.6 and record["delta"] == 1e-5 and 0.0 < record["metrics"]["test_accuracy"]
    (weights,) = folder.glob("adadp-convolutions-*.pt")
    (features,) = folder.glob("adadp-features-*-cifar10-jpeg-train40k-first2000.pt")
    frozen, stamp = torch.load(weights, weights_only=True), features.stat().st_mtime_ns

    def fail(*args, **kwargs):
        raise AssertionError("the cache was not reused")

    features_of = cifar.features_of
    monkeypatch.setattr(cifar, "pretrain_convolutions", fail)
    monkeypatch.setattr(cifar, "features_of", fail)
    again = run_json(capsys, "--method", "ada_dp", "--task", "cifar10", "--profile", "smoke", "--seed", "1")
    assert again["preprocessing"] == record["preprocessing"] and features.stat().st_mtime_ns == stamp
    assert len(store.load()) == 2
    task = cifar.CIFAR10ADADP(train_limit=2000, pretrain_limit=1000, pretrain_epochs=1)
    data = task.prepare()
    assert data.x_train.shape == (2000, 1600)
    assert all(not p.requires_grad for p in task.convolutions.parameters())
    assert all(p.requires_grad for p in task.model.parameters())  # only the head is trained
    for name, value in task.convolutions.state_dict().items():
        assert torch.equal(value, frozen[name])
    # The head trained on exactly the frozen layers' outputs for the private images 10,000..11,999.
    images = cifar_data.load_cifar10().x_train[10000:12000]
    torch.testing.assert_close(data.x_train, features_of(task.convolutions, images), rtol=1e-5, atol=1e-6)
