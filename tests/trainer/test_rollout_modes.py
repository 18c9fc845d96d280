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

    named = []
    rollout = SimpleNamespace(
        generate_stream=SimpleNamespace(options=lambda blocking: stream),
        admit_requests=lambda ids: named.append(("admit", ids)),
    )
    return PipelinedRollout(draw, rollout, loader, ahead=ahead, steps=steps), submitted, named


def sync_into(named: list):
    """A weight sync's stand-in: records which requests it names."""
    return lambda admit=(): named.append(("sync", list(admit))) or {}


def take(source: PipelinedRollout, version: int) -> int:
    """What ``next`` does before it waits: submit what is missing, take the oldest batch; its index."""
    extra = source.submit_ahead(version, one_to_take=True)
    if extra:
        source.rollout.admit_requests(extra)
    return source.pending.popleft().index


def test_batches_are_submitted_ahead_named_with_the_weights_they_wait_for_and_none_past_the_last_step():
    source, submitted, named = pipelined(ahead=2, steps=4)
    source.send_weights(0, sync_into(named))
    assert submitted == [0, 1, 2] and named == [("sync", [0, 1, 2])]  # the first, named together
    assert take(source, 0) == 0
    assert source.position() == ({"index": 1}, 1)  # in flight: a resume draws batches 1 and 2 again
    source.send_weights(1, sync_into(named))
    assert submitted[3:] == [3] and named[1:] == [("sync", [3])]  # batch 3 waits for version 3 - 2
    assert take(source, 1) == 1
    for version in (2, 3):
        source.send_weights(version, sync_into(named))
        assert take(source, version) == version
    source.send_weights(4, sync_into(named))  # after the last step
    assert submitted == [0, 1, 2, 3]  # batches 4 and 5 would be generated and never trained
    assert named[2:] == [("sync", [])] * 3  # nothing to name
    assert source.position() == ({"index": 4}, 4)


def test_steps_that_take_two_batches_each_always_find_one():
    """An after-reward hook (dynamic sampling) takes a second batch every step: the batch indices run ahead of
    the weight versions, so the extra batches are submitted when taken, named at once (before, the second take
    of step 2 found nothing submitted: IndexError)."""
    source, submitted, named = pipelined(ahead=1, steps=3)
    source.send_weights(0, sync_into(named))
    taken = []
    for version in (0, 1, 2):
        taken += [take(source, version), take(source, version)]
        source.send_weights(version + 1, sync_into(named))
    assert taken == submitted == [0, 1, 2, 3, 4, 5]
    assert ("admit", [3]) in named  # step 2's second batch: submitted when taken


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
