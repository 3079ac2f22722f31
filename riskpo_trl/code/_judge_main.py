"""Judge-side entry point (see `riskpo_trl.code.judge`): runs in a bounded process of its own, never in the trainer.

Reads ``<TestSpec JSON>\\n<report bytes>`` from stdin and writes ``P`` (every test passed) or ``F<reason>``. Standard
library only (through this package's own modules), so the process starts in tens of milliseconds.
"""

import os
import sys

VERDICT_REASON_CHARS = 300


def _verdict(passed: bool, reason: str = "") -> None:
    data = b"P" if passed else b"F" + reason[:VERDICT_REASON_CHARS].encode("utf-8", errors="replace")
    os.write(1, data)
    os._exit(0)


def main() -> None:
    try:
        data = sys.stdin.buffer.read()
        from .report import parse_report
        from .testspec import TestSpec

        newline = data.find(b"\n")
        spec = TestSpec.from_json(data[:newline].decode("utf-8", errors="surrogatepass"))
        outputs, error = parse_report(data[newline + 1:], len(spec.inputs), spec.output_caps())
        if error is not None:
            _verdict(False, error)
        failed = spec.first_failure(outputs)
        _verdict(failed is None, "" if failed is None else f"test {failed} failed")
    except MemoryError:
        _verdict(False, "judge: out of memory")
    except Exception as exc:  # noqa: BLE001 - whatever the report makes the judge do fails the completion
        _verdict(False, f"judge: {type(exc).__name__}: {exc}")
