# SPDX-License-Identifier: MIT
"""One training loop for the third-party suite: 3 AdamW steps of a model
on sim under a context (or without one), recording every step's loss and
gradients, the final parameters, the peak device bytes above what was
allocated when each step began, and the device bytes held right after
each forward."""

import dataclasses

import torch

import torch_offload.sim

DEV = "sim"
STEPS = 3


@dataclasses.dataclass
class Run:
    results: list  # per step: loss, then every parameter's gradient; then the final parameters
    peak_bytes: int  # the most any step's forward + backward added to the device
    after_forward_bytes: int  # the most held on the device right after a forward
    ctx: object

    def kept(self):
        """This run without its device tensors (results on the CPU, the
        context dropped), to keep across test cases; the results must all
        have been on the device."""
        assert all(t.device.type == DEV for t in self.results)
        return dataclasses.replace(self, results=[t.cpu() for t in self.results], ctx=None)


def device_bytes():
    torch_offload.sim.synchronize(0)
    return torch_offload.sim.device_memory(0)["current_bytes"]


def train(model, forward, ctx, backward_inside=False, loss_of=None, steps=STEPS):
    """``forward(model)`` runs inside ``ctx`` and returns the loss, or the
    output that ``loss_of(output)`` turns into the loss after the ``with``
    (as torchtune's recipes do); backward runs inside the ``with`` or after
    it."""
    params = [p for p in model.parameters() if p.requires_grad]
    opt = torch.optim.AdamW(params, lr=1e-2)
    results, peak, after_forward = [], 0, 0
    for _ in range(steps):
        opt.zero_grad(set_to_none=True)
        start = device_bytes()
        torch_offload.sim.reset_peak(0)
        with ctx:
            loss = forward(model)
            after_forward = max(after_forward, device_bytes() - start)
            if backward_inside:
                loss.backward()
        if loss_of is not None:
            loss = loss_of(loss)
        if not backward_inside:
            loss.backward()
        torch_offload.sim.synchronize(0)
        peak = max(peak, torch_offload.sim.device_memory(0)["peak_bytes"] - start)
        results += [loss.detach().clone()] + [p.grad.clone() for p in params]
        opt.step()
    return Run(results + [p.detach().clone() for p in params], peak, after_forward, ctx)


def offloaded(ctx):
    """How many tensors ``ctx`` (a torch_offload manager) offloaded."""
    return ctx.stats().tensors_offloaded
