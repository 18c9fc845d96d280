"""The audit trail's records: one per prompt a step trained on, read from the batch the update took."""

import json

import numpy as np
import torch

from hybridflow.core import DataProto
from hybridflow.core.keys import EPOCH, PROMPT_ID, RESPONSE_MASK, ROLLOUT_VERSIONS, UID
from hybridflow.trainer.audit import AUDIT_FILE, append_records, trained_prompts
from hybridflow.trainer.tracking import drop_steps_after


def batch(mask, uids, prompt_ids, epochs, versions=None):
    tensors = {RESPONSE_MASK: torch.tensor(mask)}
    if versions is not None:
        tensors[ROLLOUT_VERSIONS] = torch.tensor(versions)
    return DataProto.from_dict(
        tensors,
        {
            UID: np.array(uids, dtype=object),
            PROMPT_ID: np.array(prompt_ids, dtype=np.int64),
            EPOCH: np.array(epochs, dtype=np.int64),
        },
    )


def test_a_synchronous_batch_gives_one_record_per_prompt_with_the_trainers_version():
    # prompt 7 (3 samples, the second with no response token left in the mask) and prompt 2 (3 samples), epoch 1
    mask = [[1, 1, 0], [0, 0, 0], [1, 0, 0], [1, 1, 1], [1, 0, 0], [1, 1, 0]]
    records = trained_prompts(batch(mask, ["a"] * 3 + ["b"] * 3, [7] * 3 + [2] * 3, [1] * 6), step=5, version=4)
    assert records == [
        {"step": 5, "epoch": 1, "prompt_id": 7, "weight_version": [4, 4], "samples": 3, "samples_trained": 2},
        {"step": 5, "epoch": 1, "prompt_id": 2, "weight_version": [4, 4], "samples": 3, "samples_trained": 3},
    ]


def test_a_streamed_batch_reports_the_oldest_and_newest_version_over_its_counted_tokens():
    mask = [[1, 1, 0], [1, 1, 1], [1, 1, 0]]
    versions = [
        [3, 4, 9],  # the 9 is outside the mask: not counted
        [4, 4, 4],
        [-1, 5, -1],  # -1: a token no forward stamped (a tool's, a pad)
    ]
    records = trained_prompts(batch(mask, ["a", "a", "b"], [0, 0, 1], [0, 0, 0], versions), step=6, version=5)
    assert [r["weight_version"] for r in records] == [[3, 4], [5, 5]]
    assert [(r["samples"], r["samples_trained"]) for r in records] == [(2, 2), (1, 1)]


def test_a_resume_drops_the_records_past_its_checkpoint(tmp_path):
    one = trained_prompts(batch([[1]], ["a"], [3], [0]), step=1, version=0)
    two = trained_prompts(batch([[1]], ["b"], [8], [0]), step=2, version=1)
    append_records(tmp_path, one)
    append_records(tmp_path, two)
    with (tmp_path / AUDIT_FILE).open("a") as out:
        out.write('{"step": 3, "epo')  # a write cut short by a kill
    drop_steps_after(tmp_path / AUDIT_FILE, 1)  # resumed from the checkpoint of step 1
    assert [json.loads(line) for line in (tmp_path / AUDIT_FILE).read_text().splitlines()] == one
