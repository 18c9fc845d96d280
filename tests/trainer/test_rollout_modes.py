"""PipelinedRollout's bookkeeping, with a stand-in for the rollout group's ``generate_stream`` (unit test: it only
records what is submitted; the pipelined modes run for real in test_async.py)."""

from types import SimpleNamespace

from hybridflow.core import DataProto
from hybridflow.trainer.rollout_modes import PipelinedRollout


class Loader:
    """A prompt loader's position: how many batches it handed out."""

    def __init__(self) -> None:
        self.index = 0

    def state_dict(self) -> dict[str, int]:
        return {"index": self.index}


def pipelined(ahead: int, steps: int):
    submitted, loader = [], Loader()

    def draw(index: int) -> DataProto:
        loader.index += 1
        return DataProto(meta_info={"index": index})

    def stream(prompts: DataProto):  # generate_stream.options(blocking=False)(prompts): a future
        submitted.append(prompts.meta_info["request"])
        return SimpleNamespace(get=lambda: prompts)

    rollout = SimpleNamespace(generate_stream=SimpleNamespace(options=lambda blocking: stream))
    return PipelinedRollout(draw, rollout, loader, ahead=ahead, steps=steps), submitted


def take(source: PipelinedRollout, version: int) -> int:
    """What ``next`` does before it waits: submit ahead, then take the oldest batch; its index."""
    source.submit_ahead(version)
    return source.pending.popleft().index


def test_batches_are_submitted_ahead_but_none_past_the_last_step():
    source, submitted = pipelined(ahead=2, steps=4)
    assert take(source, 0) == 0 and submitted == [0, 1, 2]  # batch j waits for version j - 2
    assert source.position() == ({"index": 1}, 1)  # in flight: a resume draws batches 1 and 2 again
    assert take(source, 1) == 1 and submitted == [0, 1, 2, 3]
    assert take(source, 2) == 2 and take(source, 3) == 3
    assert submitted == [0, 1, 2, 3]  # batches 4 and 5 would be generated and never trained
    assert source.position() == ({"index": 4}, 4)


def test_steps_that_take_two_batches_each_always_find_one():
    """An after-reward hook (dynamic sampling) takes a second batch every step: the batch indices run ahead of
    the weight versions, so the extra batches are submitted when taken (before, the second take of step 2
    found nothing submitted: IndexError)."""
    source, submitted = pipelined(ahead=1, steps=3)
    taken = [take(source, version) for version in (0, 0, 1, 1, 2, 2)]
    assert taken == submitted == [0, 1, 2, 3, 4, 5]


def test_engine_metrics_of_several_ranks_become_one_value_each_and_leave_the_batch():
    from hybridflow.core.keys import METRICS
    from hybridflow.trainer.rollout_modes import engine_metrics

    batch = DataProto.from_dict(
        {},
        meta_info={
            METRICS: {
                "rollout/generated_tokens": [30, 12],  # two ranks' rows: the batch's tokens add up
                "rollout/generate_s": [0.5, 2.0],  # the step waited for the slower rank
                "rollout/slot_utilization": [0.5, 1.0],  # a share: the mean
                "agent/turns": [2],  # not an engine metric: left for its owner
            }
        },
    )
    assert engine_metrics(batch) == {
        "rollout/generated_tokens": 42.0,
        "rollout/generate_s": 2.0,
        "rollout/slot_utilization": 0.75,
    }
    assert batch.meta_info[METRICS] == {"agent/turns": [2]}


def test_each_group_is_started_once_though_the_colocated_generator_is_the_actor():
    """The entry point starts every group it holds and the rollout's generator; colocated, the generator is the
    actor's group itself, which was started twice (its model loaded and its engine built twice: ~0.7 GB more
    resident memory per rank measured with a ~95M model) until the list was made unique."""
    from hybridflow.configs.roles import RolloutPlacement
    from hybridflow.trainer.main import _each_once
    from hybridflow.trainer.rollout_modes import Rollout

    actor, critic = object(), object()
    rollout = Rollout(RolloutPlacement.COLOCATED, actor)
    assert rollout.generator is actor
    assert _each_once([actor, critic, rollout.generator]) == [actor, critic]
