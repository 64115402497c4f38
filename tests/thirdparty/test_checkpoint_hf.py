# SPDX-License-Identifier: MIT
"""torch_offload.enable_gradient_checkpointing on transformers models from
configs (random init, tiny): 3 AdamW steps on sim with a copy delay and
poisoning, each decoder layer checkpointed by transformers' own mechanism
with its input offloaded through a streamed Manager. Every step's loss and
gradients and the final parameters bitwise those of transformers' own
checkpointing (use_reentrant=False) without offloading; the manager sees
one tensor on the device per layer call; a lower peak after forward."""

import contextlib

import pytest

import torch_offload
from test_first_hour import run_doc_example
from test_torch_offload import assert_bitwise
from test_transformers import batch, build
from training import DEV, train

LAYERS = 2  # num_hidden_layers of test_transformers.TINY


def hf_own(model):
    model.activation_checkpointing_enable(activation_checkpointing_kwargs={"use_reentrant": False})


@pytest.mark.parametrize("name", ["llama", "gpt2", "qwen2"])
def test_bitwise_with_hf_checkpointing_inputs_offloaded(name):
    ids = batch()

    def run(enable):
        model = build(name)
        func = enable(model)
        return train(model, lambda m: m(input_ids=ids, labels=ids).loss, contextlib.nullcontext()), func

    ref, _ = run(hf_own)
    manager = torch_offload.Manager(DEV, sync="streamed", min_offload_bytes=0)
    got, func = run(lambda model: torch_offload.enable_gradient_checkpointing(model, manager))
    assert isinstance(func, torch_offload.CheckpointOffload) and func.manager is manager
    assert_bitwise(ref.kept().results, got.kept().results)
    stats = manager.stats()
    assert stats.tensors_seen - stats.passed_other_device == 3 * LAYERS, stats  # the layers' hidden_states
    assert stats.tensors_offloaded == 3 * LAYERS, stats
    assert got.after_forward_bytes < ref.after_forward_bytes


def test_the_hugging_face_example_of_docs_python_md_meets_its_target():
    namespace, peak = run_doc_example("hugging-face")
    manager = namespace["manager"]
    target = manager.options["device_target_bytes"]
    assert 0 < peak <= target * 1.02, (peak, target)
    stats = manager.stats()
    assert stats.blocks_kept + stats.blocks_offloaded + stats.blocks_recomputed == 4
    assert stats.blocks_kept > 0 and stats.bytes_offloaded > 0, stats
