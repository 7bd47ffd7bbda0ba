"""Row checks that mirror how LLaMA-Factory 0.9.5 converts each row (``llamafactory/data/converter.py``).

A row it would crash on (a missing key, a content that is not a string) or silently drop (an empty
response, roles out of order, an odd number of turns) is a bad row here, with one sentence of why.
The checks are closures specialised on the column mapping: a clean row costs a few dict look-ups.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from .dataset_entry import RowMapping, closest, json_kind
from .dataset_scan import ScanError
from .dataset_types import ColumnTypes

Check = Callable[[Any], "str | None"]
_MISSING = object()

# Mapped columns that a row may leave out (datasets then fills in null), but that some row must have:
# the converter indexes them on every row, so a column that no row has ends in KeyError.
OPTIONAL_ALPACA_KEYS = ("query", "history", "system", "tools", "images", "videos", "audios", "kto_tag")
OPTIONAL_CHAT_KEYS = ("system", "tools", "images", "videos", "audios", "kto_tag")
_ROLE_CONTENT_TAGS = {
    "role_tag": "role",
    "content_tag": "content",
    "user_tag": "user",
    "assistant_tag": "assistant",
    "observation_tag": "tool",
    "function_tag": "function_call",
    "system_tag": "system",
}


@dataclass
class RowRules:
    """``check(row)`` gives the reason a row is bad, or None; ``unseen`` holds the mapped optional
    columns that no row has had so far; ``text(row)`` is the row's content, for token counts;
    ``types`` the type of every column of the good rows so far (one each, or the loader stops)."""

    check: Check
    text: Callable[[dict[str, Any]], str]
    unseen: dict[str, str] = field(default_factory=dict)  # column name in the data -> mapping key
    mapping: RowMapping | None = None
    types: ColumnTypes = field(default_factory=ColumnTypes)


def make_rules(mapping: RowMapping) -> RowRules:
    optional = OPTIONAL_ALPACA_KEYS if mapping.formatting == "alpaca" else OPTIONAL_CHAT_KEYS
    unseen = {mapping.columns[key]: key for key in optional if mapping.columns.get(key)}
    if mapping.formatting == "alpaca":
        return RowRules(_alpaca_check(mapping, unseen), _alpaca_text(mapping), unseen, mapping)
    check = _openai_check(mapping, unseen) if mapping.formatting == "openai" else _sharegpt_check(mapping, unseen)
    return RowRules(check, _chat_text(mapping), unseen, mapping)


def not_an_object(row: Any) -> str:
    if isinstance(row, ScanError):
        return row.message
    return f"the row is a JSON {json_kind(row)}, expected an object"


def _mark_seen(row: dict[str, Any], unseen: dict[str, str]) -> None:
    for column in [c for c in unseen if c in row]:
        del unseen[column]


def is_blank(value: Any) -> bool:
    return not value or (isinstance(value, str) and value.isspace())


# -- alpaca ---------------------------------------------------------------------------------------


def _alpaca_check(mapping: RowMapping, unseen: dict[str, str]) -> Check:
    cols = mapping.columns
    prompt, query, response, history = cols["prompt"], cols["query"], cols["response"], cols["history"]
    ranking = mapping.ranking

    def check(row: Any) -> str | None:
        if type(row) is not dict:
            return not_an_object(row)
        if unseen:
            _mark_seen(row, unseen)
        if ranking:
            reason = _pair_problem(row, cols["chosen"], cols["rejected"])
            if reason:
                return reason
        elif response is not None:
            value = row.get(response, _MISSING)
            if type(value) is not str or not value or value.isspace():
                return _alpaca_response_problem(row, response, value, mapping)
        value = row.get(prompt, _MISSING) if prompt is not None else None
        if value is _MISSING:
            return _missing_column(row, prompt, "prompt", mapping)
        extra = row.get(query) if query is not None else None
        if (value is not None and type(value) is not str) or (extra is not None and type(extra) is not str):
            return _prompt_type_problem(prompt, value, query, extra)
        if (not value or value.isspace()) and (not extra or extra.isspace()):
            return _empty_prompt(prompt, query)
        if history is not None and row.get(history) is not None:
            return _history_problem(row[history], history)
        return None

    return check


def _alpaca_response_problem(row: dict[str, Any], column: str, value: Any, mapping: RowMapping) -> str:
    if value is _MISSING:
        return _missing_column(row, column, "response", mapping)
    if value is None:
        return f"the response '{column}' is null: LLaMA-Factory drops the row"
    if not isinstance(value, str):
        return f"the response '{column}' is a JSON {json_kind(value)}, expected a string: LLaMA-Factory drops the row"
    return f"empty response: '{column}' is blank, so LLaMA-Factory drops the row"


def _prompt_type_problem(prompt: str | None, value: Any, query: str | None, extra: Any) -> str:
    column, bad = (prompt, value) if value is not None and not isinstance(value, str) else (query, extra)
    return f"'{column}' is a JSON {json_kind(bad)}, expected a string (LLaMA-Factory stops with a TypeError)"


def _empty_prompt(prompt: str | None, query: str | None) -> str:
    names = " and ".join(f"'{c}'" for c in (prompt, query) if c)
    return f"empty prompt: {names} {'are both' if prompt and query else 'is'} blank"


def _history_problem(history: Any, column: str) -> str | None:
    if not isinstance(history, list):
        return None  # the converter only reads a list
    for index, pair in enumerate(history, start=1):
        if not (isinstance(pair, list) and len(pair) == 2 and all(isinstance(x, str) for x in pair)):
            return f"'{column}' entry {index} is not a [prompt, response] pair of strings"
    return None


def _pair_problem(row: dict[str, Any], chosen: str | None, rejected: str | None) -> str | None:
    for column in (chosen, rejected):
        if column is None:
            continue
        value = row.get(column, _MISSING)
        if value is _MISSING:
            return f"missing column '{column}' (ranking rows need chosen and rejected)"
        if is_blank(value):
            return f"empty '{column}': a ranking row needs both answers"
    return None


def _alpaca_text(mapping: RowMapping) -> Callable[[dict[str, Any]], str]:
    keys = [mapping.columns[k] for k in ("system", "prompt", "query", "response", "chosen", "rejected")]
    keys = [k for k in keys if k]
    history = mapping.columns["history"]

    def text(row: dict[str, Any]) -> str:
        parts = [row[k] for k in keys if isinstance(row.get(k), str)]
        if history and isinstance(row.get(history), list):
            parts += [x for pair in row[history] for x in pair if isinstance(x, str)]
        return "\n".join(parts)

    return text


# -- sharegpt / openai ----------------------------------------------------------------------------


def _sharegpt_check(mapping: RowMapping, unseen: dict[str, str]) -> Check:
    tags = mapping.tags
    messages_col = mapping.columns["messages"]
    role_tag, content_tag, system_tag = tags["role_tag"], tags["content_tag"], tags["system_tag"]
    user_side = (tags["user_tag"], tags["observation_tag"])  # odd turns, as the converter's accept_tags
    assistant_side = (tags["assistant_tag"], tags["function_tag"])
    ranking = mapping.ranking

    def check(row: Any) -> str | None:
        if type(row) is not dict:
            return not_an_object(row)
        if unseen:
            _mark_seen(row, unseen)
        messages = row.get(messages_col, _MISSING)
        if type(messages) is not list or not messages:
            return _messages_problem(row, messages_col, messages, mapping)
        start = 0
        first = messages[0]
        if type(first) is dict and system_tag and first.get(role_tag) == system_tag:
            start = 1  # a leading system message is taken out before the turns are paired
        for index in range(start, len(messages)):
            message = messages[index]
            if type(message) is not dict or role_tag not in message or content_tag not in message:
                return _message_shape(message, index, mapping)
            role, content = message[role_tag], message[content_tag]
            odd = (index - start) % 2 == 0
            if role not in (user_side if odd else assistant_side):
                return _role_out_of_order(role, index, odd, mapping)
            if type(content) is not str:
                return _content_type(content, index, content_tag)
            if not odd and (not content or content.isspace()):
                return f"empty response: message {index + 1} ({role!r}) has a blank '{content_tag}'"
        return _turn_count(len(messages) - start, ranking, start)

    return check


def _openai_check(mapping: RowMapping, unseen: dict[str, str]) -> Check:
    """As the sharegpt check, after the openai converter's rewriting: an assistant message with
    tool_calls becomes a function turn, and consecutive tool (observation) messages merge into one."""
    tags = mapping.tags
    messages_col = mapping.columns["messages"]
    role_tag, content_tag, system_tag = tags["role_tag"], tags["content_tag"], tags["system_tag"]
    role_keys = ("user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")
    known_roles = {tags[key] for key in role_keys if tags[key]}  # the converter's tag_mapping
    observation, function = tags["observation_tag"], tags["function_tag"]
    assistant_side = (tags["assistant_tag"], function)
    user_side = (tags["user_tag"], observation)
    ranking = mapping.ranking

    def check(row: Any) -> str | None:
        if type(row) is not dict:
            return not_an_object(row)
        if unseen:
            _mark_seen(row, unseen)
        messages = row.get(messages_col, _MISSING)
        if type(messages) is not list or not messages:
            return _messages_problem(row, messages_col, messages, mapping)
        first = messages[0]
        start = 1 if type(first) is dict and system_tag and first.get(role_tag) == system_tag else 0
        turns: list[tuple[Any, int, Any]] = []  # (role, index of the message, content)
        pending_tool = -1
        for index in range(start, len(messages)):
            message = messages[index]
            if type(message) is not dict or role_tag not in message or content_tag not in message:
                return _message_shape(message, index, mapping)
            role, content = message[role_tag], message[content_tag]
            if role in assistant_side and message.get("tool_calls"):
                role, content = function, "tool_calls"
            if role == observation:
                pending_tool = index if pending_tool < 0 else pending_tool
                continue
            if pending_tool >= 0:
                turns.append((observation, pending_tool, "tool"))
                pending_tool = -1
            if role not in known_roles:
                return f"message {index + 1} has role {role!r}, which no tag maps (LLaMA-Factory stops with KeyError)"
            turns.append((role, index, content))
        for position, (role, index, content) in enumerate(turns):
            odd = position % 2 == 0
            if role not in (user_side if odd else assistant_side):
                return _role_out_of_order(role, index, odd, mapping)
            if type(content) is not str:
                return _content_type(content, index, content_tag)
            if not odd and (not content or content.isspace()):
                return f"empty response: message {index + 1} ({role!r}) has a blank '{content_tag}'"
        return _turn_count(len(turns), ranking, start)

    return check


def _turn_count(count: int, ranking: bool, start: int) -> str | None:
    after = " after the system message" if start else ""
    if count == 0:
        return f"no turns{after}: LLaMA-Factory drops the row"
    if not ranking and count % 2:
        return f"odd number of turns ({count}{after}): the last user turn has no answer, so LLaMA-Factory drops the row"
    if ranking and count % 2 == 0:
        return f"even number of turns ({count}{after}): a ranking row ends on a user turn (chosen/rejected answer it)"
    return None


def _messages_problem(row: dict[str, Any], column: str | None, messages: Any, mapping: RowMapping) -> str:
    if messages is _MISSING:
        return _missing_column(row, column, "messages", mapping)
    if isinstance(messages, list):
        return f"no messages: '{column}' is an empty list, so LLaMA-Factory drops the row"
    return f"'{column}' is a JSON {json_kind(messages)}, expected a list of messages"


def _message_shape(message: Any, index: int, mapping: RowMapping) -> str:
    role_tag, content_tag = mapping.tags["role_tag"], mapping.tags["content_tag"]
    if not isinstance(message, dict):
        return f"message {index + 1} is a JSON {json_kind(message)}, expected an object"
    missing = role_tag if role_tag not in message else content_tag
    tag = "role_tag" if missing == role_tag else "content_tag"
    hint = ""
    if "role" in message and "content" in message and role_tag != "role":
        hint = (
            "; the messages use role/content: set tags role_tag 'role', content_tag 'content', user_tag 'user', "
            "assistant_tag 'assistant', system_tag 'system' (register does this for you)"
        )
    return f"message {index + 1} has no {missing!r} key (tags.{tag}): LLaMA-Factory stops with KeyError{hint}"


def _role_out_of_order(role: Any, index: int, odd: bool, mapping: RowMapping) -> str:
    tags = mapping.tags
    side = "user" if odd else "assistant"
    allowed = (tags["user_tag"], tags["observation_tag"]) if odd else (tags["assistant_tag"], tags["function_tag"])
    names = "/".join(str(t) for t in allowed if t)
    hint = ""
    if role in _ROLE_CONTENT_TAGS.values() and role not in tags.values():
        hint = f"; {role!r} is the role/content style: set the tags (user_tag 'user', assistant_tag 'assistant', ...)"
    return (
        f"roles out of order: message {index + 1} has role {role!r} where a {side} turn ({names}) is expected, "
        f"so LLaMA-Factory drops the row{hint}"
    )


def _content_type(content: Any, index: int, content_tag: str | None) -> str:
    return f"message {index + 1} has a JSON {json_kind(content)} as '{content_tag}', expected a string"


def _chat_text(mapping: RowMapping) -> Callable[[dict[str, Any]], str]:
    messages_col, content_tag = mapping.columns["messages"], mapping.tags["content_tag"]
    system = mapping.columns["system"]

    def text(row: dict[str, Any]) -> str:
        parts = [row[system]] if system and isinstance(row.get(system), str) else []
        parts += [m[content_tag] for m in row.get(messages_col) or () if isinstance(m.get(content_tag), str)]
        return "\n".join(parts)

    return text


# -- explanations ---------------------------------------------------------------------------------


def _missing_column(row: dict[str, Any], column: str | None, role: str, mapping: RowMapping) -> str:
    """``missing column 'output'``, with the likeliest fix: a near-miss name or the other formatting."""
    reason = f"missing column '{column}' (the {role})"
    looks = _looks_like(row, mapping)
    if looks:
        return f"{reason}; the row looks like {looks}"
    near = closest(str(column), [k for k in row if isinstance(k, str)])
    if near:
        return f"{reason}; the row has '{near}': rename it, or map it with columns.{role} in dataset_info.json"
    return reason


def _looks_like(row: dict[str, Any], mapping: RowMapping) -> str | None:
    if mapping.formatting == "alpaca":
        for key in ("conversations", "messages"):
            if isinstance(row.get(key), list):
                style = "openai" if _role_content_style(row[key]) else "sharegpt"
                return f"{style} data (a '{key}' list): set formatting {style}"
        return None
    if "instruction" in row or "output" in row:
        return "alpaca data ('instruction'/'output'): set formatting alpaca"
    for key in ("conversations", "messages"):
        if isinstance(row.get(key), list) and key != mapping.columns["messages"]:
            return f"{mapping.formatting} data under '{key}': set columns.messages to '{key}'"
    return None


def _role_content_style(messages: list[Any]) -> bool:
    return bool(messages) and isinstance(messages[0], dict) and "role" in messages[0] and "content" in messages[0]


def role_content_tags() -> dict[str, str]:
    """The tags for messages written as ``{"role": ..., "content": ...}`` (OpenAI style)."""
    return dict(_ROLE_CONTENT_TAGS)
