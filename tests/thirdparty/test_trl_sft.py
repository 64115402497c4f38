# SPDX-License-Identifier: MIT
"""TRL 1.16.0's SFTTrainer, unchanged, with ``activation_offloading=True``
and its offloading routed to torch_offload.trl by the one documented line,
``torch_offload.trl.install()`` (SFTTrainer imported TRL's function by
name, so the import alone does not reach it): a tiny Llama from a config, a tokenizer built here,
an in-memory dataset, 3 steps on sim, with and without activation
checkpointing. The losses and the final parameters are bitwise those of
TRL's run with ``activation_offloading=False``, something was offloaded,
and without checkpointing the device bytes held after each forward are
lower (with it, the few saved layer inputs stay in the forward stash).

The device: accelerate and transformers pick theirs from a fixed list of
accelerators, which a PrivateUse1 backend is not on, unless
``ACCELERATE_TORCH_DEVICE`` names one (their own setting for a custom
device); set to ``sim``, the Trainer, its Accelerator and TRL place the
model and every batch on sim as they would on CUDA."""

import accelerate.state
import datasets
import pytest
import tokenizers
import torch
import transformers
import trl
import trl.trainer.sft_trainer

import torch_offload.trl
from test_torch_offload import assert_bitwise
from training import DEV, device_bytes

VOCAB, SEQ = 128, 64
WORDS = [f"w{i}" for i in range(3, VOCAB)]


def tokenizer():
    """A word-level tokenizer over WORDS, built in memory (nothing downloaded)."""
    vocab = {"<pad>": 0, "<eos>": 1, "<unk>": 2} | {w: i + 3 for i, w in enumerate(WORDS)}
    tok = tokenizers.Tokenizer(tokenizers.models.WordLevel(vocab, unk_token="<unk>"))
    tok.pre_tokenizer = tokenizers.pre_tokenizers.Whitespace()
    return transformers.PreTrainedTokenizerFast(
        tokenizer_object=tok, pad_token="<pad>", eos_token="<eos>", unk_token="<unk>"
    )


def dataset():
    g = torch.Generator().manual_seed(1)
    texts = [
        " ".join(WORDS[i] for i in torch.randint(0, len(WORDS), (SEQ - 8,), generator=g).tolist()) for _ in range(6)
    ]
    return datasets.Dataset.from_dict({"text": texts})


@pytest.fixture
def on_sim(monkeypatch):
    accelerate.state.PartialState._reset_state()  # the device is chosen when the shared state is first made
    accelerate.state.AcceleratorState._reset_state()
    monkeypatch.setenv("ACCELERATE_TORCH_DEVICE", DEV)
    torch_offload.trl.install()
    yield
    torch_offload.trl.uninstall()
    accelerate.state.PartialState._reset_state()
    accelerate.state.AcceleratorState._reset_state()


def sft(tmp_path, offload, checkpointing):
    torch.manual_seed(0)
    config = transformers.LlamaConfig(
        vocab_size=VOCAB,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=SEQ,
        bos_token_id=None,
        eos_token_id=1,
        pad_token_id=0,
    )
    model = transformers.AutoModelForCausalLM.from_config(config)
    args = trl.SFTConfig(
        output_dir=str(tmp_path / ("offload" if offload else "plain")),
        max_steps=3,
        per_device_train_batch_size=2,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to=[],
        activation_offloading=offload,
        dataloader_pin_memory=False,
        seed=0,
        data_seed=0,
        max_length=SEQ,
        disable_tqdm=True,
        bf16=False,
        activation_checkpointing=checkpointing,
    )
    trainer = trl.SFTTrainer(model=model, args=args, train_dataset=dataset(), processing_class=tokenizer())
    losses, held = [], []

    def after_forward(module, inputs, output):
        losses.append(output.loss.detach().clone())
        held.append(device_bytes())

    trainer.model.register_forward_hook(after_forward)
    trainer.train()
    ctx = trainer.maybe_activation_offload_context
    params = [p.detach().cpu() for p in trainer.model.parameters()]
    assert all(p.device.type == DEV for p in trainer.model.parameters())
    return [t.cpu() for t in losses] + params, max(held), ctx


@pytest.mark.parametrize("checkpointing", [False, True], ids=["no checkpointing", "activation checkpointing"])
def test_sft_trainer_with_offloading_routed_to_torch_offload(tmp_path, on_sim, checkpointing):
    ref, ref_held, plain = sft(tmp_path, False, checkpointing)
    got, got_held, ctx = sft(tmp_path, True, checkpointing)
    assert not isinstance(plain, torch_offload.trl.OffloadActivations)
    assert isinstance(ctx, torch_offload.trl.OffloadActivations)
    assert len(ref) == len(got) and len(ref) > 3
    assert_bitwise(ref, got)
    assert ctx.stats().tensors_offloaded > 0
    import trl.trainer.dpo_trainer  # a trainer imported after install() gets ours too

    assert trl.trainer.dpo_trainer.get_act_offloading_ctx_manager is torch_offload.trl.get_act_offloading_ctx_manager
    if not checkpointing:  # with it, the few saved layer inputs fit in the forward stash
        assert got_held < ref_held
