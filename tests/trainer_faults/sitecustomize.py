"""Faults injected into the training processes of a real-vLLM test's command (this folder on PYTHONPATH, so that every
process `accelerate launch` starts loads this module at start-up, as Python loads any ``sitecustomize``).

With ``RISKPO_TEST_STOP_SERVER=<process group>:<where>:<sync>``, the main training process (RANK 0) stops the server's
processes with SIGSTOP during the ``<sync>``-th sync of the process (counted from 1) or the generation after it:
``generation``, right after the identity check before that generation; ``sync``, as that sync's first tensor leaves.
It writes the time (``time.time()``) to ``$RISKPO_TEST_STOP_RECORD``. Every process then runs a full garbage
collection as its stop's last part begins (`StopOnSignal.finish`): what the collector frees at some allocation
there, it frees for certain (a sync's gloo group left by a stop, whose release once waited for the sync's timeout).
Nothing happens without the variable.
"""

from __future__ import annotations

import gc
import importlib.abc
import importlib.util
import os
import signal
import sys
import time

SPEC = os.environ.get("RISKPO_TEST_STOP_SERVER")


def stop_server(client, where: str, now: str) -> None:
    group, wanted, at_sync = SPEC.split(":")
    if wanted == where and client.syncs == int(at_sync) and not getattr(client, "_test_stopped", False):
        client._test_stopped = True
        os.killpg(int(group), signal.SIGSTOP)
        with open(os.environ["RISKPO_TEST_STOP_RECORD"], "w") as record:
            record.write(f"{time.time()} {now}\n")


def patch_checked(module) -> None:
    check_identity = module.CheckedClientMixin.check_identity

    def identity_then_stop(client, before):
        check_identity(client, before)
        if before == "generation":
            stop_server(client, "generation", before)

    module.CheckedClientMixin.check_identity = identity_then_stop


def patch_gloo_client(module) -> None:
    prepare = module.GlooVLLMClient.prepare_for_sending

    def stop_as_the_first_tensor_leaves(client, tensor):
        stop_server(client, "sync", "the first tensor")
        return prepare(client, tensor)

    module.GlooVLLMClient.prepare_for_sending = stop_as_the_first_tensor_leaves


def patch_preemption(module) -> None:
    finish = module.StopOnSignal.finish

    def collect_then_finish(stop, trainer):
        gc.collect()
        return finish(stop, trainer)

    module.StopOnSignal.finish = collect_then_finish


class PatchAfterImport(importlib.abc.MetaPathFinder):
    """Runs ``patch(module)`` once the module ``name`` has been imported."""

    def __init__(self, name: str, patch) -> None:
        self.name, self.patch = name, patch

    def find_spec(self, fullname, path, target=None):
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        run = spec.loader.exec_module

        def exec_module(module):
            run(module)
            self.patch(module)

        spec.loader.exec_module = exec_module
        return spec


if SPEC:
    sys.meta_path.insert(0, PatchAfterImport("riskpo_trl.job.preemption", patch_preemption))
if SPEC and os.environ.get("RANK") == "0":
    sys.meta_path.insert(0, PatchAfterImport("riskpo_trl.weight_sync.checked", patch_checked))
    sys.meta_path.insert(0, PatchAfterImport("riskpo_trl.weight_sync.gloo_client", patch_gloo_client))
