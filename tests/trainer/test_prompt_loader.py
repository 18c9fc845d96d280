import pytest

from hybridflow.core.rollout_batch import left_pad
from hybridflow.trainer.prompt_loader import PromptLoader, PromptSet, render_prompt


class CharTokenizer:
    """One id per character (ord), no chat template: plain joining of messages."""

    chat_template = None

    def __call__(self, text, add_special_tokens=False):
        return {"input_ids": [ord(c) for c in text]}


def rows(n):
    return [
        {
            "data_source": "toy",
            "prompt": [{"role": "user", "content": "q" * (1 + i % 3)}],
            "reward_model": {"ground_truth": str(i)},
            "extra_info": {"index": i},
        }
        for i in range(n)
    ]


def test_left_pad_hand_computed():
    ids, mask, pos = left_pad([[5, 6, 7], [9]], pad_id=0)
    assert ids.tolist() == [[5, 6, 7], [0, 0, 9]]
    assert mask.tolist() == [[1, 1, 1], [0, 0, 1]]
    assert pos.tolist() == [[0, 1, 2], [0, 0, 0]]


def test_render_prompt_plain_text_and_messages():
    assert render_prompt("2+2=", CharTokenizer()) == "2+2="
    assert (
        render_prompt([{"role": "user", "content": "a"}, {"role": "user", "content": "b"}], CharTokenizer()) == "a\nb"
    )


def test_prompt_set_filters_long_prompts_and_counts_them():
    prompts = PromptSet.from_rows(rows(6), CharTokenizer(), max_prompt_length=2)
    assert len(prompts) == 4 and prompts.filtered_too_long == 2
    batch = prompts.batch([0, 1], pad_id=0)
    assert batch.non_tensor_batch["ground_truth"].tolist() == ["0", "1"]
    assert batch.batch["input_ids"].tolist() == [[0, ord("q")], [ord("q")] * 2]
    # each prompt's id is its row in the data as read: rows 2 and 5 were dropped, so the third kept is row 3
    assert prompts.batch([3, 2, 0], pad_id=0).non_tensor_batch["prompt_id"].tolist() == [4, 3, 0]
    with pytest.raises(ValueError, match="no prompts left"):
        PromptSet.from_rows(rows(3), CharTokenizer(), max_prompt_length=0)


def truths(batch):
    return batch.non_tensor_batch["ground_truth"].tolist()


@pytest.mark.parametrize("stop_after", [1, 2, 3])  # 3 == an epoch boundary (batches_per_epoch is 3)
def test_resume_continues_with_exactly_the_next_batch(stop_after):
    prompts = PromptSet.from_rows(rows(7), CharTokenizer(), max_prompt_length=10)
    straight = PromptLoader(prompts, 2, 0, shuffle=True, seed=3)
    expected = [truths(straight.next_batch()) for _ in range(7)]
    first = PromptLoader(prompts, 2, 0, shuffle=True, seed=3)
    seen = [truths(first.next_batch()) for _ in range(stop_after)]
    resumed = PromptLoader(prompts, 2, 0, shuffle=True, seed=3)
    resumed.load_state_dict(first.state_dict())
    seen += [truths(resumed.next_batch()) for _ in range(7 - stop_after)]
    assert seen == expected


def test_epochs_are_permutations_and_differ():
    prompts = PromptSet.from_rows(rows(6), CharTokenizer(), max_prompt_length=10)
    loader = PromptLoader(prompts, 3, 0, shuffle=True, seed=0)
    epoch0 = truths(loader.next_batch()) + truths(loader.next_batch())
    epoch1 = truths(loader.next_batch()) + truths(loader.next_batch())
    assert sorted(epoch0) == sorted(epoch1) == [str(i) for i in range(6)]
    assert epoch0 != epoch1
    assert loader.state_dict() == {"epoch": 1, "index": 2}
    third = loader.next_batch()  # the first batch of the third pass, stamped with its epoch
    assert third.non_tensor_batch["epoch"].tolist() == [2, 2, 2]
    assert third.non_tensor_batch["prompt_id"].tolist() == [int(t) for t in truths(third)]  # no row dropped here


def test_batch_larger_than_dataset():
    prompts = PromptSet.from_rows(rows(2), CharTokenizer(), max_prompt_length=10)
    with pytest.raises(ValueError, match="train_batch_size=4 is larger than the 2 prompts"):
        PromptLoader(prompts, 4, 0, shuffle=False, seed=0)
