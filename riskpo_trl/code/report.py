"""The runner's report format (what the sandbox writes back) and its parser, shared by the sandbox and the judge."""

from __future__ import annotations

TEST_STYLES = ("stdin", "functional", "assert")
HEADER_BYTES = 24  # a record's kind, its length in digits and a newline, at most


def parse_report(data: bytes, n_tests: int, output_caps: list[int] | None = None) -> tuple[list[str], str | None]:
    """(outputs, error) from the runner's report: records ``<kind><length>\\n<payload>`` with kind ``S`` (tests start;
    first only, optional), ``O`` (one test's output), ``E`` (the run's error) and ``D`` (done, last). Parsed by length
    prefixes only (linear, no regular expression); anything malformed, more outputs than tests, or an output over its
    cap is an error."""
    outputs: list[str] = []
    error = None
    position, end = 0, len(data)
    while position < end:
        newline = data.find(b"\n", position, position + HEADER_BYTES)
        kind, digits = data[position : position + 1], data[position + 1 : newline]
        if newline < 0 or kind not in (b"O", b"E", b"D", b"S") or not digits.isdigit() or (kind == b"S" and position):
            return [], "malformed report from the sandbox"
        start, position = newline + 1, newline + 1 + int(digits)
        if position > end:
            return [], "truncated report from the sandbox"
        if kind == b"S":
            continue
        if kind == b"D":
            return outputs, error
        payload = data[start:position]
        if kind == b"E":
            error = payload[:2000].decode("utf-8", errors="replace")
            continue
        if len(outputs) == n_tests:
            return [], "report with more outputs than tests"
        if output_caps is not None and len(payload) > output_caps[len(outputs)]:
            return [], (
                f"output of test {len(outputs)} is {len(payload)} bytes, over its cap of "
                f"{output_caps[len(outputs)]} (set by the expected output)"
            )
        outputs.append(payload.decode("utf-8", errors="replace"))
    return [], "no report from the sandbox"
