"""Load and check SFT conversations, including tool calls, before any training starts.

Rows are ``{"id": ..., "messages": [...]}`` with roles system, user, assistant and tool. Tool calls
use the Hugging Face shape
``{"type": "function", "id": ..., "function": {"name": ..., "arguments": ...}}``. Chat templates
render a tool result by its ``name``, so a tool message with only a ``tool_call_id`` renders
wrongly or not at all; that, and ids that answer no earlier call, are caught here. All bad rows of
a file are reported in one error, so a broken dataset is fixed in one pass rather than one row a
run.
"""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

from ..io import DataError, iter_lines

ROLES = ("system", "user", "assistant", "tool")
MAX_ERRORS = 20  # reported per file; the count covers all of them
MAX_IDS = 10


def load_conversations(path: str | os.PathLike) -> list[dict[str, Any]]:
    """Read and validate the SFT JSONL; return ``[{"id", "messages"}]`` with only template keys
    kept (and a row's ``effort`` and ``tagged``, if it has them).

    Tool-call arguments given as JSON strings come back parsed into dicts (HF templates expect
    dicts). Raises one DataError listing every bad row (the first MAX_ERRORS) by ``file:line``.
    """
    path = Path(path)
    examples, errors = [], []
    for lineno, line in iter_lines(path):
        row_errors: list[str] = []
        example = _parse_row(line, lineno, row_errors)
        errors += [f"{path}:{lineno}: {e}" for e in row_errors]
        if example is not None and not row_errors:
            examples.append(example)
    if errors:
        if len(errors) == 1:
            raise DataError(errors[0])
        shown = f", first {MAX_ERRORS} shown" if len(errors) > MAX_ERRORS else ""
        raise DataError(f"{path}: {len(errors)} errors{shown}:\n" + "\n".join(errors[:MAX_ERRORS]))
    if not examples:
        raise DataError(f"{path}: no examples")
    return examples


def _parse_row(line: str, lineno: int, errors: list[str]) -> dict[str, Any] | None:
    try:
        row = json.loads(line)
    except json.JSONDecodeError as exc:
        errors.append(f"not valid JSON ({exc.msg} at column {exc.colno})")
        return None
    if not isinstance(row, dict):
        errors.append(f"expected a JSON object, got {type(row).__name__}")
        return None
    if "messages" not in row:
        errors.append(f"missing key 'messages' (row has: {', '.join(sorted(row))})")
        return None
    if not isinstance(row["messages"], list):
        errors.append(f"key 'messages' should be list, got {type(row['messages']).__name__}")
        return None
    where = "key 'messages'"
    messages = []
    # tool-call id -> function name so far; a reused id means its latest call
    calls: dict[str, str] = {}
    for i, msg in enumerate(row["messages"]):
        out = _parse_message(msg, calls, lambda e, i=i: errors.append(f"{where}: message {i}: {e}"))
        if out is not None:
            messages.append(out)
    if not any(m.get("role") == "assistant" for m in row["messages"] if isinstance(m, dict)):
        errors.append(f"{where}: no assistant turn to train on")
    # a dataset row's effort and tagging travel along: train.phases select by them
    kept = {k: row[k] for k in ("effort", "tagged") if k in row}
    return {"id": str(row.get("id", f"line {lineno}")), "messages": messages, **kept}


def _parse_message(msg: Any, calls: dict[str, str], error) -> dict[str, Any] | None:
    if not isinstance(msg, dict) or msg.get("role") not in ROLES:
        error(f"needs a role in {list(ROLES)}: {msg!r:.80}")
        return None
    role, content = msg["role"], msg.get("content")
    if role != "assistant" and msg.get("tool_calls"):
        error(f"only assistant messages may carry tool_calls, not {role}")
    if role == "assistant" and msg.get("tool_calls") is not None:
        return _parse_assistant_calls(msg, calls, error)
    if not isinstance(content, str):
        error(f"{role} message needs string content, got {type(content).__name__} {content!r:.60}")
        return None
    out = {"role": role, "content": content}
    if role == "tool":
        name, call_id = msg.get("name"), msg.get("tool_call_id")
        if not isinstance(name, str) or not name:
            error(
                "tool message needs a non-empty string 'name' (the called function), "
                f"got {name!r:.60}; tool_call_id alone does not render"
            )
        elif not isinstance(call_id, str) or not call_id:
            error(f"tool message needs a string 'tool_call_id', got {call_id!r:.60}")
        elif call_id not in calls:
            error(
                f"tool_call_id {call_id!r} answers no tool call of an earlier assistant message "
                f"(earlier ids: {', '.join(calls) or 'none'})"
            )
        elif calls[call_id] != name:
            error(
                f"tool_call_id {call_id!r} is a call to {calls[call_id]!r}, "
                f"but the tool message's name is {name!r}"
            )
        out.update(name=name, tool_call_id=call_id)
    return out


def _parse_assistant_calls(msg: dict, calls: dict[str, str], error) -> dict[str, Any] | None:
    content, tool_calls = msg.get("content"), msg["tool_calls"]
    if content is not None and not isinstance(content, str):
        error(
            "assistant message needs string or null content, "
            f"got {type(content).__name__} {content!r:.60}"
        )
        return None
    if not isinstance(tool_calls, list):
        error(f"tool_calls should be a list, got {type(tool_calls).__name__}")
        return None
    if content is None and not tool_calls:
        error("assistant message needs string content (null is allowed only with tool_calls)")
        return None
    parsed = []
    for j, call in enumerate(tool_calls):
        fn = call.get("function") if isinstance(call, dict) else None
        name = fn.get("name") if isinstance(fn, dict) else None
        if not isinstance(name, str) or not name:
            error(f"tool_calls[{j}] needs {{'function': {{'name': str, ...}}}}: {call!r:.80}")
            continue
        if call.get("type", "function") != "function":
            error(f"tool_calls[{j}] type should be 'function', got {call['type']!r:.40}")
        if not isinstance(call.get("id"), str) or not call["id"]:
            error(
                f"tool_calls[{j}] ({name}) needs a string 'id' for tool messages to answer, "
                f"got {call.get('id')!r:.40}"
            )
            continue
        # recorded even if its arguments are bad: no cascade of errors on the tool reply
        calls[call["id"]] = name
        args = fn.get("arguments")
        if isinstance(args, str):
            try:
                args = json.loads(args)
            except json.JSONDecodeError as exc:
                error(
                    f"tool_calls[{j}] ({name}) arguments are not valid JSON ({exc.msg}): "
                    f"{fn['arguments']!r:.60}"
                )
                continue
        if not isinstance(args, dict):
            error(f"tool_calls[{j}] ({name}) arguments should be a JSON object, got {args!r:.60}")
            continue
        parsed.append(
            {"type": "function", "id": call["id"], "function": {"name": name, "arguments": args}}
        )
    out = {"role": "assistant", "content": content or ""}
    if parsed:
        out["tool_calls"] = parsed
    return out


def check_renders(
    tokenizer,
    examples: list[dict],
    source: str = "dataset",
    chat_template: str | None = None,
    template_name: str = "the tokenizer's chat template",
    hint: str = "",
) -> None:
    """Render every example with ``chat_template`` (default: the tokenizer's own); raise one
    DataError for all failures.

    A template that ignores tool turns can render without error yet drop them, so the text must
    also contain each tool result and each called function's name.
    """
    bad = []
    for ex in examples:
        try:
            text = tokenizer.apply_chat_template(
                ex["messages"], tokenize=False, chat_template=chat_template
            )
        # any template failure is a mismatch to report, not a crash
        except Exception as exc:  # noqa: BLE001
            bad.append(f"{ex['id']} ({type(exc).__name__}: {exc})")
            continue
        missing = []
        for i, m in enumerate(ex["messages"]):
            if m["role"] == "tool" and (m["content"] not in text or m["name"] not in text):
                missing.append(f"message {i} tool result {m['name']!r}")
            missing += [
                f"message {i} call to {c['function']['name']!r}"
                for c in m.get("tool_calls", [])
                if c["function"]["name"] not in text
            ]
        if missing:
            bad.append(f"{ex['id']} (rendered text omits {', '.join(missing)})")
    if bad:
        more = " ..." if len(bad) > MAX_IDS else ""
        raise DataError(
            f"{source}: {len(bad)} of {len(examples)} examples do not render with "
            f"{template_name}: {'; '.join(bad[:MAX_IDS])}{more}{hint}"
        )
