# SPDX-License-Identifier: MIT
"""torchtune 0.6.1's own Llama 3.2 builder (the component builder, tiny
dims), with the output tied to the embedding (a TiedLinear, as the 1B and
3B models) and untied, trained as torchtune's recipes do it: the context
from ``get_act_offloading_ctx_manager(model, enable_activation_offloading)``
around the forward, the loss and backward after it. 3 AdamW steps on sim:
bitwise those of ``enable_activation_offloading=False``, a lower peak,
something offloaded, the output head kept on the device."""

import pytest
import torch
import torch.nn.functional as F
from torchtune.models.llama3_2 import llama3_2
from torchtune.modules import TiedLinear

import torch_offload.torchtune
from test_torch_offload import assert_bitwise
from training import DEV, offloaded, train

VOCAB, SEQ, BATCH = 128, 64, 2


def build(tied):
    torch.manual_seed(0)
    model = llama3_2(
        vocab_size=VOCAB,
        num_layers=2,
        num_heads=4,
        num_kv_heads=2,
        embed_dim=64,
        max_seq_len=SEQ,
        intermediate_dim=128,
        tie_word_embeddings=tied,
    )
    return model.to(DEV).train()


def run(tied, enable, make=None):
    model = build(tied)
    tokens = torch.randint(0, VOCAB, (BATCH, SEQ + 1), generator=torch.Generator().manual_seed(1)).to(DEV)
    ctx = (make or torch_offload.torchtune.get_act_offloading_ctx_manager)(model, enable)

    def loss_of(logits):
        return F.cross_entropy(logits.reshape(-1, VOCAB).float(), tokens[:, 1:].reshape(-1))

    return model, train(model, lambda m: m(tokens[:, :-1]), ctx, loss_of=loss_of)


@pytest.mark.parametrize("tied", [True, False], ids=["tied output (TiedLinear)", "untied output"])
def test_llama3_2_as_the_recipes_call_it(tied):
    _, ref = run(tied, False)
    ref = ref.kept()
    model, got = run(tied, True)
    head = model.output.linear if tied else model.output
    assert isinstance(model.output, TiedLinear) == tied
    assert head._forward_pre_hooks and head._forward_hooks
    assert_bitwise(ref.results, got.kept().results)
    assert offloaded(got.ctx) > 0
    assert got.peak_bytes < ref.peak_bytes


def test_install_makes_the_recipes_entry_point_ours():
    # The recipes call `training.get_act_offloading_ctx_manager(model,
    # enabled)` from `from torchtune import training`: after install() that
    # is ours, and training through it is bitwise.
    from torchtune import training

    _, ref = run(False, False)
    torch_offload.torchtune.install()
    try:
        assert training.get_act_offloading_ctx_manager is torch_offload.torchtune.get_act_offloading_ctx_manager
        assert training.OffloadActivations is torch_offload.torchtune.OffloadActivations
        _, got = run(False, True, make=lambda m, e: training.get_act_offloading_ctx_manager(m, e))
    finally:
        torch_offload.torchtune.uninstall()
    assert training.get_act_offloading_ctx_manager is not torch_offload.torchtune.get_act_offloading_ctx_manager
    assert isinstance(got.ctx, torch_offload.torchtune.OffloadActivations)
    assert_bitwise(ref.kept().results, got.kept().results)
    assert offloaded(got.ctx) > 0
