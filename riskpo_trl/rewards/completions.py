"""The text of a TRL completion, whatever its form. A leaf module of the standard library only: the code reward uses
it without loading math-verify."""

from __future__ import annotations

from typing import Any


def completion_text(completion: str | list[dict[str, Any]]) -> str:
    """The text of a TRL completion: a string, or a conversational list of messages whose content is a string or a
    list of multi-modal content blocks (only the text blocks count)."""
    if isinstance(completion, str):
        return completion
    parts = []
    for message in completion:
        content = message.get("content") or ""
        if isinstance(content, list):
            content = "".join(block.get("text") or "" for block in content if isinstance(block, dict))
        parts.append(str(content))
    return "".join(parts)
