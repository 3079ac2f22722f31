"""Run under `accelerate launch`: every process enters lock_output_dir on a directory another live process holds,
then on a free one, and writes what it saw."""

import json
import os
import sys
from pathlib import Path

from accelerate import PartialState

from riskpo_trl.job.run_lock import LOCK_FILE, OutputDirLocked, lock_output_dir

held_dir, free_dir, report_dir = map(Path, sys.argv[1:4])
state = PartialState(cpu=True)
report = {"pid": os.getpid()}
try:
    with lock_output_dir(str(held_dir)):
        report["held"] = "entered"
except OutputDirLocked as error:
    report["held"] = str(error)
with lock_output_dir(str(free_dir)):
    state.wait_for_everyone()  # every process is inside, so the lock file is the one the run holds
    report["free_lock"] = json.loads((free_dir / LOCK_FILE).read_text())
    state.wait_for_everyone()  # nobody reads it after the main process has left
(report_dir / f"rank{state.process_index}.json").write_text(json.dumps(report))
# Close the process group before exit: left to interpreter exit, gloo's threads can abort a rank ("terminate called
# without an active exception") after the work is done.
state.destroy_process_group()
