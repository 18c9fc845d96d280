"""``load_sharded_model`` over 4 gloo ranks: rank 0 reads, ranks 1-3 build on meta and receive their shards.

One spawn (tests/loading_ranks.py) loads every case on a dp=4 and a dp 2 x tp 2
mesh; the tests compare what each rank holds with a single-process
``from_pretrained`` (checkpoints) or with today's every-rank load +
``shard_model`` (built-in models, the critic's value model).
"""

import os

import pytest
import torch
import torch.multiprocessing as mp
from loading_ranks import BUILTIN_CASES, CHECKPOINT_CASES, WORLD, loading_rank, token_ids, write_checkpoints
from transformers import AutoModelForCausalLM

from hybridflow.core.worker import free_ports

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def loaded(tmp_path_factory):
    """``(checkpoint root, [report of rank r])`` after one 4-rank run of every case."""
    root = tmp_path_factory.mktemp("loading")
    write_checkpoints(str(root))
    mp.start_processes(loading_rank, args=(WORLD, free_ports(1)[0], str(root)), nprocs=WORLD, start_method="spawn")
    return root, [torch.load(root / f"rank{r}.pt", weights_only=False) for r in range(WORLD)]


@pytest.mark.parametrize("case", list(CHECKPOINT_CASES))
def test_checkpoint_loads_what_from_pretrained_loads(loaded, case):
    root, reports = loaded
    folder, dtype, _ = CHECKPOINT_CASES[case]
    reference = AutoModelForCausalLM.from_pretrained(root / folder, dtype=dtype).eval()
    expected = dict(reference.named_parameters())
    buffers = dict(reference.named_buffers())
    with torch.no_grad():
        logits = reference(input_ids=token_ids(reference.config.vocab_size)).logits.float()
    tied = folder == "tied"
    assert (reference.lm_head.weight is reference.model.embed_tokens.weight) == tied
    for rank, report in enumerate(reports):
        held = report[case]
        assert held["params"].keys() == expected.keys(), rank
        for name, param in expected.items():
            assert held["params"][name].dtype == dtype
            assert torch.equal(held["params"][name], param), (rank, name)
        # inv_freq is non-persistent: in no state dict, garbage after to_empty unless rebuilt.
        assert (
            held["buffers"].keys()
            == buffers.keys()
            == {"model.rotary_emb.inv_freq", "model.rotary_emb.original_inv_freq"}
        )
        for name, buf in buffers.items():
            assert buf.dtype == held["buffers"][name].dtype and torch.equal(buf, held["buffers"][name]), (rank, name)
        assert held["tied"] == tied, rank
        assert held["training"] is False
        assert held["generation_config"] == reference.generation_config.to_dict()
        # Tensor parallelism sums partial products in another order; fp32 rounding only.
        tolerance = 0.0 if case.endswith("-dp") else (1e-5 if dtype == torch.float32 else 2e-2)
        assert (held["logits"] - logits).abs().max().item() <= tolerance, rank


def test_ranks_without_the_checkpoint_hold_its_weights(loaded):
    """Ranks 1-3 were handed an empty directory: nothing to read there, yet they hold the checkpoint's weights."""
    root, reports = loaded
    assert sorted(os.listdir(root / "empty")) == []
    for case, (folder, _, _) in CHECKPOINT_CASES.items():
        assert reports[0][case]["path"] == str(root / folder)
        for report in reports[1:]:
            assert report[case]["path"] == str(root / "empty")
            for name, param in reports[0][case]["params"].items():
                assert torch.equal(report[case]["params"][name], param), (case, name)


@pytest.mark.parametrize("case", list(BUILTIN_CASES))
def test_builtin_and_critic_shards_bit_identical_to_every_rank_loading(loaded, case):
    _, reports = loaded
    expected_class = (
        "Qwen2ForTokenClassification"
        if case.startswith("critic")
        else ("LlamaForCausalLM" if "llama" in case else "Qwen2ForCausalLM")
    )
    for rank, report in enumerate(reports):
        held = report[case]
        assert held["loaded"].keys() == held["today"].keys(), rank
        assert len(held["today"]) >= 10
        for name, shard in held["today"].items():
            assert shard.dtype == held["loaded"][name].dtype == BUILTIN_CASES[case][2]
            assert torch.equal(shard, held["loaded"][name]), (rank, name)
        assert held["today_buffers"].keys() == held["loaded_buffers"].keys()
        for name, buf in held["today_buffers"].items():
            loaded_buf = held["loaded_buffers"][name]
            assert buf.dtype == loaded_buf.dtype and torch.equal(buf, loaded_buf), (rank, name)
        assert held["loaded_config"] == held["today_config"]
        assert held["loaded_generation"] == held["today_generation"]
        assert held["loaded_training"] is held["today_training"]
        assert held["loaded_checkpointing"] is held["today_checkpointing"] is (case == "checkpointing-dp")
        assert expected_class in held["classes"], held["classes"]


def test_the_shards_differ_between_ranks(loaded):
    """Each rank holds its own quarter, not a full copy (dp=4: rows 0-3 of the same weight differ by rank)."""
    _, reports = loaded
    name = "model.layers.0.mlp.down_proj.weight"
    shards = [report["tiny-qwen2-dp"]["loaded"][name] for report in reports]
    assert {tuple(s.shape) for s in shards} == {(64 // WORLD, 256)}
    assert not any(torch.equal(shards[0], s) for s in shards[1:])


def test_a_failed_read_raises_on_every_rank(loaded):
    _, reports = loaded
    assert reports[0]["failed-read"].startswith("FileNotFoundError: model directory")
    for report in reports[1:]:
        message = report["failed-read"]
        assert message.startswith("RuntimeError: rank 0 could not read the model at"), message
        assert "FileNotFoundError" in message
