"""Fast per-example clipping: ghost norms and book-keeping, without materializing per-example gradients.

One forward pass records each layer's input a_i; one backward pass of Σ_i ℓ_i gives each layer's output
gradient g_i. Per-example gradient norms then follow from (a_i, g_i) layer by layer (Goodfellow 2015; Li et al.
2021, "ghost clipping"), and the clipped sum Σ_i c_i ∇ℓ_i is assembled from the same (c_i·g_i, a_i) without a
second backward pass (Bu et al. 2023, "book-keeping"). For a linear layer with per-example inputs a_i ∈ R^{T×p}
and output gradients g_i ∈ R^{T×q}, ∇W ℓ_i = g_iᵀ a_i and

    ‖g_iᵀ a_i‖²_F = ⟨a_i a_iᵀ, g_i g_iᵀ⟩   (T² work, the "ghost norm")   or   Σ (g_iᵀ a_i)²   (p·q work),

whichever is cheaper (when the per-example gradients are materialized, the clipped sum is their weighted sum);
for T = 1 (logistic/softmax regression, MLPs) it is ‖g_i‖²‖a_i‖², the closed form. Supported: Linear, Conv2d
(groups = 1, zero padding; a linear layer on input patches, which are never unfolded: see :class:`_Conv2d`),
Embedding, LayerNorm, GroupNorm. Any other layer with parameters makes :func:`make_clipper` fall back to the reference
:class:`~dpbench.privacy.clipping.VmapClipper`, with a warning that names the layer.
"""
from __future__ import annotations

import warnings
from typing import TYPE_CHECKING, Callable

import torch
from torch import nn
from torch.nn import functional as F

from dpbench.data import rows
from dpbench.privacy.affine import affine_clipped_sum, affine_sq_norm_bound
from dpbench.privacy.clipping import (CoordinateAffine, PerExampleClipper, Transform, VmapClipper, clip_factors,
                                     zero_rows)

if TYPE_CHECKING:  # a privacy module names the task contract as a type only
    from dpbench.task import Task


#: What a layer rule's ``backward(record, output_grad, affine)`` returns: the per-example squared norms, and a
#: function of the clip factors c and a dict ``into`` (parameter -> tensor) that adds Σ_i c_i ∇ℓ_i for the layer's
#: parameters into it, in place. A rule's ``record(inputs, output)``, called by a forward hook, keeps what
#: ``backward`` needs of the layer's input.
Accumulate = Callable[[torch.Tensor, dict[nn.Parameter, torch.Tensor]], None]
PerExampleRule = tuple[torch.Tensor, Accumulate]


def _as_sequence(a: torch.Tensor, g: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """(B, ..., p), (B, ..., q) -> (B, T, p), (B, T, q)."""
    return a.reshape(len(a), -1, a.shape[-1]), g.reshape(len(g), -1, g.shape[-1])


def _add_weighted_sum(total: torch.Tensor, factors: torch.Tensor, per_example: torch.Tensor) -> None:
    """total += Σ_i c_i G_i over materialized per-example gradients (book-keeping: B·|G| work, no second pass)."""
    total.add_(torch.tensordot(factors, per_example, dims=1))


class _Linear:
    def __init__(self, layer: nn.Linear, exact: bool = False):
        self.layer, self.exact = layer, exact

    def record(self, inputs, output):
        return inputs[0]

    def supports_affine(self, a) -> bool:
        """A coordinate-wise transform of g_iᵀ a_i has a closed-form norm only for one input per example (dense)."""
        return a.dim() == 2 and not a.is_sparse

    def backward(self, a, g, affine=None) -> PerExampleRule:
        if affine is not None:
            return self._affine(a, g, affine)
        if a.dim() == 2:
            return self._one_input(a, g)
        weight, bias = self.layer.weight, self.layer.bias
        a, g = _as_sequence(a, g)
        steps, p, q = a.shape[1], a.shape[2], g.shape[2]
        sq_norms, per_example, bias_grads = 0, None, None
        if weight.requires_grad:
            if steps * steps <= p * q and not self.exact:  # ghost norm
                sq_norms = (torch.bmm(a, a.transpose(1, 2)) * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))
            else:  # per-example gradients are smaller than the T×T Gram matrices
                per_example = torch.bmm(g.transpose(1, 2), a)
                sq_norms = per_example.square().sum((1, 2))
        if bias is not None and bias.requires_grad:
            bias_grads = g.sum(1)
            sq_norms = sq_norms + bias_grads.square().sum(1)

        def clipped(factors, into):
            if weight.requires_grad:
                if per_example is not None:
                    _add_weighted_sum(into[weight], factors, per_example)
                else:
                    into[weight].addmm_((g * factors[:, None, None]).flatten(0, 1).T, a.flatten(0, 1))
            if bias_grads is not None:
                into[bias].addmv_(bias_grads.T, factors)

        return sq_norms, clipped

    def _one_input(self, a, g) -> PerExampleRule:
        """The closed form for one input per example (logistic/softmax regression, MLPs): ‖∇W ℓ_i‖² = ‖g_i‖²‖a_i‖²,
        ‖∇b ℓ_i‖² = ‖g_i‖². Sparse inputs (``dpbench.data.rows``) stay sparse: ‖a_i‖² from their values, and the clipped
        sum (c ∘ g)ᵀ a as a dense-times-sparse product."""
        weight, bias = self.layer.weight, self.layer.bias
        with_bias = bias is not None and bias.requires_grad
        g_sq = torch.linalg.vector_norm(g, dim=1).square()
        if not weight.requires_grad:
            sq_norms = g_sq
        else:
            a_sq = rows.squared_norms(a)
            sq_norms = torch.addcmul(g_sq, g_sq, a_sq) if with_bias else g_sq * a_sq

        def clipped(factors, into):
            if weight.requires_grad and a.is_sparse:
                into[weight].add_((g * factors[:, None]).T @ a)
            elif weight.requires_grad:
                into[weight].addmm_((g * factors[:, None]).T, a)
            if with_bias:
                into[bias].addmv_(g.T, factors)

        return sq_norms, clipped

    def _affine(self, a, g, affine) -> PerExampleRule:
        """‖(g_i a_iᵀ − M) / S‖² from the expansion of :func:`affine_sq_norm_bound` (an upper bound, so that no
        example is clipped to more than C); the clipped sum of weight and bias by one :func:`affine_clipped_sum`,
        the bias as a weight on an input column of ones."""
        weight, bias = self.layer.weight, self.layer.bias
        parameters, columns, sq_norms = [], [], 0
        if weight.requires_grad:
            parameters.append(weight)
            columns.append(a)
            sq_norms = affine_sq_norm_bound(a, g, *affine[weight])
        if bias is not None and bias.requires_grad:
            shift, scale = affine[bias]
            parameters.append(bias)
            columns.append(a.new_ones(len(a), 1))
            sq_norms = sq_norms + ((g - shift) / scale).pow(2).sum(1)

        def clipped(factors, into):
            shift, scale = (torch.cat([affine[p][side].view(g.shape[1], -1) for p in parameters], 1) for side in (0, 1))
            summed = affine_clipped_sum(torch.cat(columns, 1), g, factors, shift, scale, sq_norms)
            for parameter, part in zip(parameters, summed.split([c.shape[1] for c in columns], 1)):
                total = into[parameter]
                total.copy_(total.double() + part.view(total.shape))  # one rounding of noise + sum

        return sq_norms, clipped


def _patch_gram(x: torch.Tensor, layer: nn.Conv2d) -> torch.Tensor:
    """⟨patch_t, patch_s⟩ for every pair of output positions t, s of the convolution, (B, T, T).

    Computed from the Gram matrix of the (padded) input pixels, K[u, v] = Σ_c x[c, u] x[c, v], as the sum over
    kernel offsets k of K[t + k, s + k]: the kh·kw-times larger unfolded patches are never built.
    """
    (kh, kw), (sh, sw), (dh, dw), (ph, pw) = layer.kernel_size, layer.stride, layer.dilation, layer.padding
    x = F.pad(x, (pw, pw, ph, ph))
    batch, _, height, width = x.shape
    out_h, out_w = (height - dh * (kh - 1) - 1) // sh + 1, (width - dw * (kw - 1) - 1) // sw + 1
    pixels = x.flatten(2)
    pixel_gram = torch.bmm(pixels.transpose(1, 2), pixels)  # (B, P, P), P = height·width, row-major
    row, col, base = width * height * width, height * width, pixel_gram.storage_offset()
    size = (batch, out_h, out_w, out_h, out_w)
    stride = (pixel_gram.stride(0), sh * row, sw * col, sh * width, sw)
    gram = sum(pixel_gram.as_strided(size, stride, base + i * dh * (row + width) + j * dw * (col + 1))
               for i in range(kh) for j in range(kw))
    return gram.reshape(batch, out_h * out_w, out_h * out_w)


class _Conv2d:
    """A convolution is a linear layer applied to each input patch (T = output positions, p = in·kh·kw).

    Where T² ≤ p·q the ghost norm ⟨a aᵀ, g gᵀ⟩ is used, with a aᵀ from :func:`_patch_gram`, and the clipped sum
    is the convolution's own weight gradient of the re-weighted output gradients; elsewhere the per-example
    gradients (B·q·p numbers) come from one grouped convolution and are summed with the clip factors.
    """

    def __init__(self, layer: nn.Conv2d, exact: bool = False):
        self.layer, self.exact = layer, exact

    def record(self, inputs, output):
        layer, x = self.layer, inputs[0]
        positions = output.shape[2] * output.shape[3]
        ghost = positions * positions <= layer.weight[0].numel() * layer.out_channels and not self.exact  # T² ≤ p·q
        return x, (_patch_gram(x, layer) if ghost and layer.weight.requires_grad else None)

    def supports_affine(self, recorded) -> bool:
        return False  # a weight gradient sums over patches: the transformed norm needs it materialized

    def backward(self, recorded, g, affine=None) -> PerExampleRule:
        layer, (x, gram) = self.layer, recorded
        weight, bias = layer.weight, layer.bias
        geometry = dict(stride=layer.stride, padding=layer.padding, dilation=layer.dilation)
        sq_norms, per_example, bias_grads = 0, None, None
        if weight.requires_grad:
            if gram is not None:
                flat = g.flatten(2)  # (B, q, T)
                sq_norms = (gram * torch.bmm(flat.transpose(1, 2), flat)).sum((1, 2))
            else:  # the batch as B groups: the grouped convolution's weight gradient is every G_i at once
                batch, channels = x.shape[:2]
                per_example = F.grad.conv2d_weight(
                    x.reshape(1, batch * channels, *x.shape[2:]), (batch * layer.out_channels, *weight.shape[1:]),
                    g.reshape(1, batch * layer.out_channels, *g.shape[2:]), groups=batch, **geometry,
                ).view(batch, *weight.shape)
                sq_norms = per_example.flatten(1).square().sum(1)
        if bias is not None and bias.requires_grad:
            bias_grads = g.sum((2, 3))
            sq_norms = sq_norms + bias_grads.square().sum(1)
        if weight.requires_grad:  # an input pixel in no patch is in no norm, but the weight's sum reads it
            sq_norms = sq_norms + torch.where(x.flatten(1).isfinite().all(1), 0.0, float("nan"))

        def clipped(factors, into):
            if weight.requires_grad:
                if per_example is not None:
                    _add_weighted_sum(into[weight], factors, per_example)
                else:
                    into[weight].add_(F.grad.conv2d_weight(x, weight.shape, g * factors[:, None, None, None],
                                                           **geometry))
            if bias_grads is not None:
                into[bias].addmv_(bias_grads.T, factors)

        return sq_norms, clipped


class _Embedding:
    """∇E ℓ_i = Σ_t e_{id_t} g_tᵀ, so ‖∇E ℓ_i‖² = Σ_{t,s: id_t = id_s} g_t·g_s (the padding row gets no gradient)."""

    def __init__(self, layer: nn.Embedding):
        self.layer = layer

    def record(self, inputs, output):
        return inputs[0].reshape(len(output), -1)

    def supports_affine(self, ids) -> bool:
        return False  # a transformed gradient is dense over the whole table

    def backward(self, ids, g, affine=None) -> PerExampleRule:
        g = g.reshape(len(ids), -1, g.shape[-1])
        if self.layer.padding_idx is not None:
            g = g * (ids != self.layer.padding_idx).unsqueeze(-1)
        same = (ids.unsqueeze(2) == ids.unsqueeze(1)).to(g.dtype)
        sq_norms = (same * torch.bmm(g, g.transpose(1, 2))).sum((1, 2))

        def clipped(factors, into):
            into[self.layer.weight].index_add_(0, ids.flatten(), (g * factors[:, None, None]).flatten(0, 1))

        return sq_norms, clipped


class _Normalization:
    """LayerNorm/GroupNorm: per-example gradients of the affine parameters are small; materialize them."""

    def __init__(self, layer: nn.LayerNorm | nn.GroupNorm):
        self.layer = layer

    def record(self, inputs, output):
        layer, x = self.layer, inputs[0]
        if isinstance(layer, nn.LayerNorm):
            normalized = F.layer_norm(x, layer.normalized_shape, eps=layer.eps)
        else:
            normalized = F.group_norm(x, layer.num_groups, eps=layer.eps)
        return normalized.detach()

    def supports_affine(self, normalized) -> bool:
        return True

    def backward(self, normalized, g, affine=None) -> PerExampleRule:
        layer = self.layer
        if isinstance(layer, nn.LayerNorm):  # parameters have the trailing normalized_shape
            dims = tuple(range(1, g.dim() - len(layer.normalized_shape)))
        else:  # (B, C, *): parameters are per channel
            dims = tuple(range(2, g.dim()))
        grads = {}
        if layer.weight is not None and layer.weight.requires_grad:
            grads[layer.weight] = (normalized * g).sum(dims) if dims else normalized * g
        if layer.bias is not None and layer.bias.requires_grad:
            grads[layer.bias] = g.sum(dims) if dims else g
        if affine is not None:
            grads = {p: (grad - affine[p][0]) / affine[p][1] for p, grad in grads.items()}
        sq_norms = sum(grad.flatten(1).square().sum(1) for grad in grads.values())

        def clipped(factors, into):
            for p, grad in grads.items():
                _add_weighted_sum(into[p], factors, grad)

        return sq_norms, clipped


def _rule(module: nn.Module, exact: bool = False):
    """The layer's rule; with ``exact``, only rules whose norms cannot cancel (see :class:`GhostClipper`)."""
    if isinstance(module, nn.Linear):
        return _Linear(module, exact)
    if isinstance(module, nn.Conv2d) and module.groups == 1 and module.padding_mode == "zeros" \
            and not isinstance(module.padding, str):
        return _Conv2d(module, exact)
    if isinstance(module, nn.Embedding) and module.max_norm is None and not module.sparse and not exact:
        return _Embedding(module)
    if isinstance(module, (nn.LayerNorm, nn.GroupNorm)) and getattr(module, "elementwise_affine", True) \
            and getattr(module, "affine", True):
        return _Normalization(module)
    return None


def unsupported_layers(model: nn.Module, exact: bool = False) -> list[str]:
    """Names of modules with trainable parameters of their own that have no fast rule (``exact``: no rule whose
    norms cannot cancel)."""
    return [
        f"{name or 'model'} ({type(module).__name__})"
        for name, module in model.named_modules()
        if any(p.requires_grad for p in module.parameters(recurse=False)) and _rule(module, exact) is None
    ]


class GhostClipper:
    """Per-example clipping from layer inputs and output gradients: one forward and one backward pass.

    A :class:`~dpbench.privacy.clipping.CoordinateAffine` transform is applied in closed form for Linear layers with one
    input per example and for LayerNorm/GroupNorm; for any other layer the call falls back to the reference path.

    ``exact``: for parameters a method may choose adversarially (an isolated method), only norms that cannot cancel.
    The ghost norm ⟨a aᵀ, g gᵀ⟩ of a sequence Linear, a Conv2d or an Embedding is a float32 sum of terms of both
    signs: parameters that put +L and −(L − δ) on two positions of one example make it round to 0, so that example
    is not clipped while the sum adds its real gradient, 10⁷–10¹³·C (hostile review, 26 November 2026). Exact mode
    materializes those layers' per-example gradients (Linear, Conv2d) and norms them as sums of squares, and has no
    rule for Embedding (:func:`make_clipper` then takes the reference path); the one-input Linear's ‖g‖²‖a‖² and
    the normalization layers' materialized gradients cannot cancel. Methods in the training process are trusted
    code (README, "Threat model"), for which the ghost norms' rounding is ~10⁻⁷ relative.

    Either way the clipped sum is formed in buffers of its own and added to ``into`` (the release's noise) once:
    adding large per-token terms into the noise one by one (``index_add_``) could round the noise away. (The
    affine path adds its float64 sum to the noise itself, with one rounding.)
    """

    name = "ghost"

    def __init__(self, exact: bool = False):
        self.exact, self.name = exact, "ghost-exact" if exact else "ghost"  # the record's ``clipping``

    def clipped_sum(self, task: Task, x, y, max_norm, transform: Transform | None = None, scale: float = 1.0,
                    into: list[torch.Tensor] | None = None, gamma: float | None = None):
        if transform is not None and not isinstance(transform, CoordinateAffine):
            raise ValueError("GhostClipper applies only CoordinateAffine transforms; others need VmapClipper")
        model = task.model
        trainable = [p for p in model.parameters() if p.requires_grad]
        sums = into if into is not None else [torch.zeros_like(p) for p in trainable]
        if len(x) == 0:
            return sums, torch.zeros(0, device=x.device)
        affine = None if transform is None else dict(zip(trainable, zip(transform.shift, transform.scale)))
        rules = [(module, rule) for module in model.modules() if any(p.requires_grad for p in
                                                                   module.parameters(recurse=False))
                 and (rule := _rule(module, self.exact))]
        recorded: list[tuple] = []

        def hook_for(rule):
            return lambda module, inputs, output: recorded.append((rule, rule.record(inputs, output), output))

        handles = [module.register_forward_hook(hook_for(rule)) for module, rule in rules]
        try:
            losses = task.per_example_loss(task(x), y)
        finally:
            for handle in handles:
                handle.remove()
        owned = [p for module, _ in rules for p in module.parameters(recurse=False) if p.requires_grad]
        if len(recorded) != len(rules) or len(owned) != len(set(owned)):  # per-example norms with cross terms
            warnings.warn("a layer is called more than once per forward pass, or layers share a parameter; "
                          "using the vmap reference path")
            return VmapClipper().clipped_sum(task, x, y, max_norm, transform, scale, into, gamma)
        if affine is not None and not all(rule.supports_affine(saved) for rule, saved, _ in recorded):
            warnings.warn("the per-example transform has no closed form for a layer with several inputs per "
                          "example; using the vmap reference path")
            return VmapClipper().clipped_sum(task, x, y, max_norm, transform, scale, into, gamma)
        output_grads = torch.autograd.grad(losses.sum(), [output for _, _, output in recorded])
        saved, rules = [saved for _, saved, _ in recorded], [rule for rule, _, _ in recorded]
        with torch.no_grad():
            per_layer = [rule.backward(one, g, affine) for rule, one, g in zip(rules, saved, output_grads)]
            norms = sum(sq_norms for sq_norms, _ in per_layer).clamp_min(0).sqrt()
            # An example whose norm is not finite gets factor 0 (clipping.keep_finite says why). A finite norm
            # implies finite rows in every tensor the sum reads (each rule's norm multiplies or sums them all, and
            # a convolution's checks its input, whose pixels in no patch are in no norm), so
            # only a batch with such an example, which an honest run almost never meets, has its rows zeroed and
            # its layer rules rerun, lest 0 · inf make the sum NaN.
            kept = norms.isfinite()
            if not bool(kept.all()):
                saved, output_grads = _zero_rows(saved, list(output_grads), kept)
                per_layer = [rule.backward(one, g, affine) for rule, one, g in zip(rules, saved, output_grads)]
            # Abadi's min(1, C/‖g‖), or automatic clipping's C/(‖g‖ + γ): the scaling is a function of the norms
            # computed above, so neither needs per-example gradients
            factors = clip_factors(norms, max_norm, scale, gamma)
            own = sums if into is None or affine is not None else [torch.zeros_like(t) for t in sums]
            by_parameter = dict(zip(trainable, own))
            for _, clipped in per_layer:
                clipped(factors, by_parameter)
            if own is not sums:
                for total, part in zip(sums, own):
                    total.add_(part)
        return sums, norms


def _zero_rows(saved: list, output_grads: list[torch.Tensor], kept: torch.Tensor) -> tuple[list, list[torch.Tensor]]:
    """The layers' records (a tensor or a tuple of tensors and None each) and output gradients, the rows of the
    examples not ``kept`` zeroed (:func:`~dpbench.privacy.clipping.zero_rows`)."""
    shapes = [one if isinstance(one, tuple) else (one,) for one in saved]
    rest = iter(zero_rows([t for parts in shapes for t in parts if t is not None] + output_grads, kept))
    records = [tuple(None if t is None else next(rest) for t in parts) for parts in shapes]
    records = [parts if isinstance(original, tuple) else parts[0] for parts, original in zip(records, saved)]
    return records, list(rest)


def make_clipper(model: nn.Module, transform: Transform | None = None, exact: bool = False) -> PerExampleClipper:
    """The fast clipper where every layer has a rule for ``transform`` (with ``exact``, a rule whose norms cannot
    cancel: :class:`GhostClipper`), else the reference, with a warning."""
    missing = unsupported_layers(model, exact)
    if transform is not None and not isinstance(transform, CoordinateAffine):
        # an arbitrary transform of per-example gradients needs them materialized: say so (it is much slower)
        warnings.warn(f"the method's per_example_transform ({type(transform).__qualname__}) is not a "
                      f"dpbench.privacy.clipping.CoordinateAffine, so every per-example gradient is materialized (the vmap "
                      f"reference path); express a coordinate-wise (g − shift)/scale as a CoordinateAffine to keep the "
                      f"fast path")
        return VmapClipper()
    if isinstance(transform, CoordinateAffine):
        missing += [f"{name or 'model'} ({type(module).__name__})" for name, module in model.named_modules()
                    if isinstance(module, (nn.Conv2d, nn.Embedding))
                    and any(p.requires_grad for p in module.parameters(recurse=False))]
    if missing:
        warnings.warn(f"no fast per-example clipping for {', '.join(missing)}; using the vmap reference path")
        return VmapClipper()
    return GhostClipper(exact)
