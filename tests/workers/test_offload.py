"""Offload between stages and activation checkpointing, on one process: values exact, memory really released."""

import copy

import torch
from support import rollout_batch, tiny_model

from hybridflow.workers.fsdp import enable_activation_checkpointing
from hybridflow.workers.log_probs import response_log_probs
from hybridflow.workers.offload import StateOffloader


def trained_model_and_optimizer():
    model = tiny_model()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    loss = -(response_log_probs(model, rollout_batch()).log_probs.sum())
    loss.backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    return model, optimizer


def test_offloaded_state_leaves_the_device_storage_and_comes_back_bit_exact():
    model, optimizer = trained_model_and_optimizer()
    params = {n: p.detach().clone() for n, p in model.named_parameters()}
    moments = [v.clone() for state in optimizer.state.values() for v in state.values() if v.dim() > 0]
    offloader = StateOffloader(model, optimizer, params=True, optimizer_state=True)
    offloader.offload()
    assert offloader.offloaded == ("params", "optimizer")
    assert all(p.untyped_storage().nbytes() == 0 for p in model.parameters())  # the memory is released
    assert all(v.untyped_storage().nbytes() == 0 for s in optimizer.state.values() for v in s.values() if v.dim() > 0)
    with offloader.on_device(params=True):  # a stage that only reads the parameters
        assert all(torch.equal(p, params[n]) for n, p in model.named_parameters())
        assert "optimizer" in offloader.offloaded
    assert set(offloader.offloaded) == {"params", "optimizer"}  # the stage's parameters left again
    offloader.load()
    assert all(torch.equal(p, params[n]) for n, p in model.named_parameters())
    got = [v for state in optimizer.state.values() for v in state.values() if v.dim() > 0]
    assert all(torch.equal(a, b) for a, b in zip(got, moments))
    assert model.lm_head.weight is model.model.embed_tokens.weight or not model.config.tie_word_embeddings


def test_offloading_off_moves_nothing():
    model, optimizer = trained_model_and_optimizer()
    offloader = StateOffloader(model, optimizer, params=False, optimizer_state=False)
    offloader.offload()
    with offloader.on_device(params=True, optimizer=True):
        pass
    assert offloader.offloaded == () and all(p.untyped_storage().nbytes() > 0 for p in model.parameters())


def test_activation_checkpointing_gives_the_same_gradients():
    data = rollout_batch()
    plain = tiny_model()
    checkpointed = enable_activation_checkpointing(copy.deepcopy(plain))
    grads, saved = [], []
    for model in (plain, checkpointed):
        model.train()
        count = [0]

        def pack(tensor, count=count):
            count[0] += 1
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            loss = response_log_probs(model, data).log_probs.sum()
        loss.backward()
        grads.append({n: p.grad for n, p in model.named_parameters()})
        saved.append(count[0])
    assert saved[1] < saved[0] / 3  # checkpointed: the layers' activations are not kept for the backward
    # the config an export writes is the model's own: checkpointing turned no cache off in it
    assert checkpointed.config.use_cache is plain.config.use_cache is True
    for name, grad in grads[0].items():
        torch.testing.assert_close(grads[1][name], grad, rtol=0, atol=1e-5, msg=name)
