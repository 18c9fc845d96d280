"""``hybridflow-train`` that stops for good at one point of its loop, so that a test SIGKILLs it there and nowhere else.

A test that polls the run's files from outside and kills the driver when they show the point can be starved of the
CPU long enough for the driver to run past it (it happened: a kill meant for "step 4's checkpoint in place, step 5 not
begun" landed after step 5's update). Here the driver itself stops at the point.

``HYBRIDFLOW_TEST_PAUSE=audit:<k>``: once step ``k``'s audit lines are written (its update done, its checkpoint not);
``checkpoint:<k>``: once step ``k``'s checkpoint is published (the weights synced, the next generation not begun).
The driver then writes the file ``HYBRIDFLOW_TEST_PAUSED`` names and sleeps until it is killed. Run as
``python driver_that_pauses.py <overrides>``, like ``python -m hybridflow.trainer.main <overrides>``.
"""

import os
import runpy
import sys
import time
from pathlib import Path

from hybridflow.trainer import checkpoint, ppo_trainer

WHERE, STEP = os.environ["HYBRIDFLOW_TEST_PAUSE"].split(":")
STEP = int(STEP)


def pause_for_good() -> None:
    Path(os.environ["HYBRIDFLOW_TEST_PAUSED"]).write_text(f"{WHERE}:{STEP}\n")
    while True:
        time.sleep(60)


def audit_then_pause(append):
    def append_records(run_dir, records):
        append(run_dir, records)
        if records and records[0]["step"] == STEP:
            pause_for_good()

    return append_records


def publish_then_pause(publish):
    def publish_checkpoint(root, step, max_to_keep):
        published = publish(root, step, max_to_keep)
        if step == STEP:
            pause_for_good()
        return published

    return publish_checkpoint


if WHERE == "audit":
    ppo_trainer.append_records = audit_then_pause(ppo_trainer.append_records)
elif WHERE == "checkpoint":
    checkpoint.publish = publish_then_pause(checkpoint.publish)
else:
    raise SystemExit(f"HYBRIDFLOW_TEST_PAUSE: audit:<step> or checkpoint:<step>, not {WHERE}:{STEP}")

sys.argv = ["hybridflow-train", *sys.argv[1:]]
runpy.run_module("hybridflow.trainer.main", run_name="__main__", alter_sys=True)
