"""Packed (padding-free) forwards equal the padded ones, and a packed sequence attends only to itself.

Rows of very different lengths (1 to 20 prompt tokens, left-padded; 1 to 30
response tokens, right-padded) in float32, packed in rows of the longest
sequence, in one row, and with the rows of one prompt as a prefix tree
(``grouped_batch``: groups of 3 and 4 rows sharing a prompt): log-probs,
entropies and sum_pi_squared of the actor and the reference, the critic's
values, and the losses, gradients and parameters of one update agree within 1e-5.
"""

import copy
import itertools

import pytest
import torch
from micro_batch_support import grouped_batch, ragged_batch, tiny_critic
from support import tiny_model
from transformers import AttentionInterface, AttentionMaskInterface
from transformers.integrations.sdpa_attention import sdpa_attention_forward
from transformers.masking_utils import sdpa_mask

from hybridflow.configs.schema import ActorConfig, CriticConfig
from hybridflow.core import DataProto
from hybridflow.workers.actor.ppo_actor import PPOActor
from hybridflow.workers.critic.ppo_critic import PPOCritic, response_values
from hybridflow.workers.log_probs import response_log_probs
from hybridflow.workers.packing import Packing, pack, probe_packing, unpack

LAYOUTS = [Packing(), Packing(one_row=True), Packing(share_prompts=True)]


def visible(layout):
    """(N, N) bool: which slots each slot's query attends to, read back from the layout's gather indices."""
    n = len(layout.source)
    out = torch.zeros(n, n, dtype=torch.bool)
    offset = 0
    for queries, keys, mask in (
        (layout.prompt_slots, layout.prompt_slots, layout.prompt_mask),
        (layout.branch_queries, layout.branch_keys, layout.branch_mask),
    ):
        for (g, j), slot in zip(itertools.product(*map(range, queries.shape)), queries.flatten().tolist()):
            if int(layout.source[slot]) == offset + g * queries.shape[1] + j:  # the slot's own query, not a pad
                out[slot, keys[g][mask[g, 0, j]]] = True
        offset += queries.numel()
    return out


def with_attention(model, implementation):
    model.set_attn_implementation(implementation)
    return model


def test_pack_lays_the_rows_end_to_end_as_the_docstring_draws():
    # row 0: _ a b | c _ _     row 1: e f g | h i j     row 2: _ _ k | l _ _     (a..l = 11..22)
    batch = DataProto.from_dict(
        {
            "input_ids": torch.tensor([[0, 11, 12, 13, 0, 0], [15, 16, 17, 18, 19, 20], [0, 0, 21, 22, 0, 0]]),
            "attention_mask": torch.tensor([[0, 1, 1, 1, 0, 0], [1, 1, 1, 1, 1, 1], [0, 0, 1, 1, 0, 0]]),
            "position_ids": torch.tensor([[0, 0, 1, 2, 2, 2], [0, 1, 2, 3, 4, 5], [0, 0, 0, 1, 1, 1]]),
            "responses": torch.tensor([[13, 0, 0], [18, 19, 20], [22, 0, 0]]),
        }
    )
    packed = pack(batch)  # a row's last response token (c, j, l) predicts nothing read: not computed
    assert packed.input_ids.tolist() == [[15, 16, 17, 18, 19], [11, 12, 21, 0, 0]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 4], [0, 1, 0, 0, 1]]
    assert packed.logit_index.tolist() == [6, 2, 3, 4, 7]  # b predicts c; g, h, i predict h, i, j; k predicts l
    assert packed.response_tokens.tolist() == [13, 18, 19, 20, 22]
    assert unpack(torch.arange(1.0, 6.0), packed).tolist() == [[1, 0, 0], [2, 3, 4], [5, 0, 0]]
    one_row = pack(batch, Packing(one_row=True))  # longest first: e..i, then a b, then k
    assert one_row.input_ids.tolist() == [[15, 16, 17, 18, 19, 11, 12, 21]]
    assert one_row.position_ids.tolist() == [[0, 1, 2, 3, 4, 0, 1, 0]]
    assert one_row.logit_index.tolist() == [6, 2, 3, 4, 7]


def test_rows_of_one_prompt_pack_as_the_docstring_draws_their_tree():
    # row 0: a b | c d e    row 1: a b | f g _    (a..g = 11..17): one unit, the prompt once, no last tokens
    batch = DataProto.from_dict(
        {
            "input_ids": torch.tensor([[11, 12, 13, 14, 15], [11, 12, 16, 17, 0]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 1, 0]]),
            "position_ids": torch.tensor([[0, 1, 2, 3, 4], [0, 1, 2, 3, 3]]),
            "responses": torch.tensor([[13, 14, 15], [16, 17, 0]]),
        }
    )
    packed = pack(batch, Packing(share_prompts=True))
    assert packed.input_ids.tolist() == [[11, 12, 13, 14, 16]]
    assert packed.position_ids.tolist() == [[0, 1, 2, 3, 2]]
    assert packed.logit_index.tolist() == [1, 2, 3, 1, 4]  # b predicts c and f; c, d predict d, e; f predicts g
    assert visible(packed.tree).long().tolist() == [
        [1, 0, 0, 0, 0],  # a
        [1, 1, 0, 0, 0],  # b
        [1, 1, 1, 0, 0],  # c
        [1, 1, 1, 1, 0],  # d
        [1, 1, 0, 0, 1],  # f: the prompt and itself
    ]
    assert pack(batch).input_ids.numel() == 8  # unshared: two rows of 4 (a b c d, a b f)

    one_token = DataProto.from_dict(
        {  # row 1's response is one token: its branch computes nothing
            "input_ids": torch.tensor([[11, 12, 13, 14], [11, 12, 16, 0]]),
            "attention_mask": torch.tensor([[1, 1, 1, 1], [1, 1, 1, 0]]),
            "position_ids": torch.tensor([[0, 1, 2, 3], [0, 1, 2, 2]]),
            "responses": torch.tensor([[13, 14], [16, 0]]),
        }
    )
    tree = pack(one_token, Packing(share_prompts=True))
    assert tree.input_ids.tolist() == [[11, 12, 13]] and tree.logit_index.tolist() == [1, 2, 1]
    assert visible(tree.tree).long().tolist() == [[1, 0, 0], [1, 1, 0], [1, 1, 1]]


def test_a_shared_prompt_is_packed_once_per_micro_batch():
    batch = grouped_batch()
    lengths = batch.batch["attention_mask"].sum(-1)
    prompt = batch.batch["attention_mask"][:, : batch.batch["prompts"].shape[1]].sum(-1)
    packed = pack(batch, Packing(share_prompts=True))
    # the packed real tokens (ids 3..23; a row's tail filler is 0): rows 2 and 4's prompts once, row 7 whole,
    # every response once, each but its last token
    expected = 20 + 12 + int(lengths[7]) - 1 + int((lengths - prompt - 1)[:7].sum())
    assert int((packed.input_ids != 0).sum()) == expected == int(lengths.sum() - prompt[[0, 1, 3, 5, 6]].sum()) - 8
    assert int((pack(batch).input_ids != 0).sum()) == int(lengths.sum()) - 8  # unshared: every row's own copy


def test_a_prompt_with_many_long_responses_stays_one_tree_in_one_row():
    """Six 30-token responses to one 1-token prompt: the prompt once, then the responses, no filler; each
    response's queries see the prompt and its own earlier tokens only."""
    batch = ragged_batch(prompt_lens=[1] * 6, response_lens=[30] * 6)
    for key in ("prompts", "input_ids"):
        batch.batch[key][:, 0] = 7
    packed = pack(batch, Packing(share_prompts=True))
    assert packed.input_ids.shape == (1, 1 + 6 * 29)  # each response's last token predicts nothing read
    assert packed.input_ids[0, 0] == 7  # the prompt once; then the responses' own tokens only
    assert int((packed.input_ids[0, 1:] == 7).sum()) == int((batch.batch["responses"][:, :-1] == 7).sum())
    seen = visible(packed.tree)
    assert int(seen.sum()) == 1 + 6 * sum(1 + k for k in range(1, 30))  # the prompt: itself; token k: prompt + k
    assert seen[1 + 29 + 4].nonzero().flatten().tolist() == [0, 30, 31, 32, 33, 34]  # response 2's 5th token


def test_a_shared_prompt_keeps_its_responses_apart():
    """Changing one response of a group changes none of its siblings' numbers; the prompt's own do not move."""
    model, batch = tiny_model(), grouped_batch()
    changed = batch.deepcopy()
    width = batch.batch["responses"].shape[1]
    real = changed.batch["response_mask"][0].bool()
    changed.batch["responses"][0, real] = (changed.batch["responses"][0, real] + 5) % 21 + 3
    changed.batch["input_ids"][:, -width:] = changed.batch["responses"]
    with torch.no_grad():
        (before, entropy), (after, changed_entropy) = (
            response_log_probs(model, b, with_entropy=True, packing=Packing(share_prompts=True))[:2]
            for b in (batch, changed)
        )
    assert torch.allclose(before[1:], after[1:], atol=1e-6) and torch.allclose(entropy[1:], changed_entropy[1:])
    assert entropy[0, 0] == pytest.approx(changed_entropy[0, 0].item(), abs=1e-6)  # the shared prompt's last token
    assert not torch.allclose(before[0], after[0], atol=1e-3)


def test_pack_refuses_position_ids_that_do_not_restart_at_each_row():
    batch = ragged_batch()
    batch.batch["position_ids"] = torch.arange(batch.batch["input_ids"].shape[1]).expand_as(batch.batch["input_ids"])
    with pytest.raises(ValueError, match="position ids"):
        pack(batch)


@pytest.mark.parametrize("packing", LAYOUTS)
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_a_packed_row_attends_only_to_itself(implementation, packing):
    model = with_attention(tiny_model(), implementation)
    batch = ragged_batch()
    changed = batch.deepcopy()
    real = changed.batch["attention_mask"][2].bool()
    changed.batch["input_ids"][2, real] = (changed.batch["input_ids"][2, real] + 5) % 21 + 3  # row 2, every real token
    changed.batch["responses"] = changed.batch["input_ids"][:, -batch.batch["responses"].shape[1] :].clone()
    with torch.no_grad():
        before = response_log_probs(model, batch, packing=packing).log_probs
        after = response_log_probs(model, changed, packing=packing).log_probs
    others = [i for i in range(len(batch)) if i != 2]
    assert torch.allclose(before[others], after[others], atol=1e-6)
    assert not torch.allclose(before[2], after[2], atol=1e-3)  # the row itself did change


def test_an_attention_without_the_packed_mask_is_refused():
    """An implementation transformers has no mask function for gets no mask: it would attend across sequences."""

    def causal_only(module, query, key, value, attention_mask, **kwargs):
        return sdpa_attention_forward(module, query, key, value, None, **kwargs)

    AttentionInterface.register("causal_only_test", causal_only)
    model = with_attention(tiny_model(), "causal_only_test")
    with pytest.raises(ValueError, match="attends across packed sequences.*use_remove_padding=false"):
        probe_packing(model)
    with pytest.raises(ValueError, match="attends across packed sequences"):
        PPOActor(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            ActorConfig(),
            loss_agg_mode="token-mean",
            rows_per_mini_batch=8,
        )
    PPOActor(
        model,
        torch.optim.SGD(model.parameters(), lr=0.1),
        ActorConfig(),
        loss_agg_mode="token-mean",
        rows_per_mini_batch=8,
        use_remove_padding=False,
    )  # the padded path needs no such check
    for implementation in ("sdpa", "eager"):
        assert probe_packing(with_attention(tiny_model(), implementation)) == Packing(one_row=False)
        assert probe_packing(with_attention(tiny_critic(), implementation)) == Packing(one_row=False)
        for model in (tiny_model(), tiny_critic()):
            assert probe_packing(with_attention(model, implementation), share_prompts=True) == Packing(
                share_prompts=True
            )


def test_an_attention_tree_attention_would_not_reproduce_packs_without_sharing_prompts(caplog):
    """Tree attention computes plain scaled softmax attention; a model whose own attention computes something
    else (here: scores at twice the layer's scale) would change under it, so the probe gives the model its own
    attention back and does not share prompts."""

    def sharper(module, query, key, value, attention_mask, scaling=None, **kwargs):
        return sdpa_attention_forward(module, query, key, value, attention_mask, scaling=2 * scaling, **kwargs)

    AttentionInterface.register("sharper_test", sharper)
    AttentionMaskInterface.register("sharper_test", sdpa_mask)
    model = with_attention(tiny_model(), "sharper_test")
    assert probe_packing(model, share_prompts=True) == Packing()
    assert model.config._attn_implementation == "sharper_test"
    assert "differ from tree attention" in caplog.text
    plain = tiny_model()
    assert probe_packing(plain, share_prompts=True) == Packing(share_prompts=True)
    assert plain.config._attn_implementation == "hybridflow+sdpa"  # delegating every call without a tree to sdpa


def test_an_attention_that_confines_only_one_packed_row_gets_one_row():
    """Like flash attention, whose varlen path reads packed sequences from the position ids of batch size 1."""

    def one_row_only(module, query, key, value, attention_mask, **kwargs):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask if query.shape[0] == 1 else None, **kwargs
        )

    AttentionInterface.register("one_row_test", one_row_only)
    AttentionMaskInterface.register("one_row_test", sdpa_mask)
    assert probe_packing(with_attention(tiny_model(), "one_row_test")) == Packing(one_row=True)


@pytest.mark.parametrize("packing", LAYOUTS)
@pytest.mark.parametrize("implementation", ["sdpa", "eager"])
def test_actor_log_probs_entropy_and_sum_pi_squared_equal_the_padded_pass(implementation, packing):
    model, batch = with_attention(tiny_model(), implementation), grouped_batch()
    real = batch.batch["response_mask"].bool()
    with torch.no_grad():
        padded, packed = (
            response_log_probs(
                model, batch, temperature=0.7, with_entropy=True, with_sum_pi_squared=True, packing=layout
            )
            for layout in (None, packing)
        )
    for name, a, b in zip(padded._fields, padded, packed):
        assert torch.allclose(a[real], b[real], atol=1e-5), name
        assert (b[~real] == 0).all(), name


@pytest.mark.parametrize("packing", LAYOUTS)
def test_reference_log_probs_equal_the_padded_pass(packing):
    """As the reference worker scores: a frozen eval-mode model, the rollout temperature, micro-batches of 3."""
    model = tiny_model(seed=1).eval().requires_grad_(False)
    batch = grouped_batch(seed=2)
    real = batch.batch["response_mask"].bool()
    padded, packed = (
        torch.cat(
            [response_log_probs(model, micro, temperature=0.9, packing=layout).log_probs for micro in batch.split(3)]
        )
        for layout in (None, packing)
    )
    assert torch.allclose(padded[real], packed[real], atol=1e-5)


def make_actor(model, remove_padding, mode="token-mean", micro=3, share_prompts=False, **cfg):
    config = ActorConfig(ppo_micro_batch_size_per_gpu=micro, **cfg)
    return PPOActor(
        model,
        torch.optim.SGD(model.parameters(), lr=0.5),
        config,
        loss_agg_mode=mode,
        rows_per_mini_batch=8,
        use_remove_padding=remove_padding,
        share_prompts=share_prompts,
    )


def kept_gradients(optimizer, model):
    """The gradients the optimizer's last step applied, by parameter name, filled as it steps (``optimizer_step``
    frees them once applied)."""
    names = {id(p): n for n, p in model.named_parameters()}
    kept = {}

    def keep(opt, args, kwargs):
        kept.update({names[id(p)]: p.grad.clone() for g in opt.param_groups for p in g["params"] if p.grad is not None})

    optimizer.register_step_pre_hook(keep)
    return kept


@pytest.mark.parametrize("mode", ["token-mean", "seq-mean-token-mean", "seq-mean-token-sum-norm"])
def test_actor_loss_gradients_and_update_equal_the_padded_ones(mode):
    batch, base = grouped_batch(), tiny_model()
    batch.union(make_actor(base, False).compute_log_prob(batch, temperature=1.0))
    batch.batch["ref_log_probs"] = batch.batch["old_log_probs"] - 0.1 * batch.batch["response_mask"]
    models, metrics, grads = [], [], []
    for flag, share in ((False, False), (True, False), (True, True)):  # padded, packed, packed sharing prompts
        model = copy.deepcopy(base)
        actor = make_actor(
            model, flag, mode, micro=4, share_prompts=share, entropy_coeff=0.01, use_kl_loss=True, kl_loss_coef=0.5
        )
        grads.append(kept_gradients(actor.optimizer, model))
        metrics.append(actor.update_policy(batch, temperature=1.0))
        models.append(model)
    for other in (1, 2):
        for key in (
            "actor/pg_loss",
            "actor/entropy",
            "actor/kl_loss",
            "actor/pg_clipfrac",
            "actor/ppo_kl",
            "actor/grad_norm",
            "actor/surrogate_gain",
        ):
            assert metrics[other][key] == pytest.approx(metrics[0][key], abs=1e-5), key
        for (name, a), b in zip(models[0].named_parameters(), models[other].parameters()):
            assert torch.allclose(grads[0][name], grads[other][name], atol=1e-5), name  # the step's gradient
            assert torch.allclose(a, b, atol=1e-5), name
    assert metrics[0]["actor/grad_norm"] > 0 and len(grads[0]) == len(list(base.parameters()))


def test_critic_values_loss_gradients_and_update_equal_the_padded_ones():
    batch, base = grouped_batch(), tiny_critic()
    real = batch.batch["response_mask"].bool()
    with torch.no_grad():
        padded = response_values(base, batch)
        for packing in LAYOUTS:
            packed = response_values(base, batch, packing=packing)
            assert torch.allclose(padded[real], packed[real], atol=1e-5) and (packed[~real] == 0).all()

    def make(model, flag, share):
        return PPOCritic(
            model,
            torch.optim.SGD(model.parameters(), lr=0.1),
            CriticConfig(ppo_micro_batch_size_per_gpu=4),
            rows_per_mini_batch=8,
            use_remove_padding=flag,
            share_prompts=share,
        )

    batch.union(make(base, False, False).compute_values(batch))
    batch.batch["returns"] = torch.linspace(-1, 1, real.numel()).view(real.shape) * real
    models, metrics, grads = [], [], []
    for flag, share in ((False, False), (True, False), (True, True)):
        model = copy.deepcopy(base)
        values = make(model, flag, share).compute_values(batch).batch["values"]
        assert torch.allclose(values, batch.batch["values"], atol=1e-5)
        critic = make(model, flag, share)
        grads.append(kept_gradients(critic.optimizer, model))
        metrics.append(critic.update_critic(batch))
        models.append(model)
    for other in (1, 2):
        for key in ("critic/vf_loss", "critic/vpred_mean", "critic/vf_clipfrac", "critic/grad_norm"):
            assert metrics[other][key] == pytest.approx(metrics[0][key], abs=1e-5), key
        for (name, a), b in zip(models[0].named_parameters(), models[other].parameters()):
            assert torch.allclose(grads[0][name], grads[other][name], atol=1e-5), name
            assert torch.allclose(a, b, atol=1e-5), name
    assert len(grads[0]) == len(list(base.parameters()))
