"""The tags a sharegpt entry needs for the rows it reads: the keys and role names the rows use.

LLaMA-Factory's sharegpt converter (data/converter.py SharegptDatasetConverter) reads each message's role and
text under the entry's role_tag and content_tag ("from" and "value" by default, data/parser.py DatasetAttr)
and takes a role only where it equals one of the entry's user/assistant/observation/function/system tags. Rows
in OpenAI's shape ("role"/"content", "user"/"assistant", a first "developer" or "system" message) stop it with
KeyError: 'from', or are dropped for an invalid role tag. The fix is one line of the entry: its tags.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from typing import Any

_ROLE_KEYS = ("role", "from")
_CONTENT_KEYS = ("content", "value", "text")
# a role name -> the tag it is, in the shapes people write (OpenAI's, ShareGPT's)
_ROLES = {
    "user": "user_tag",
    "human": "user_tag",
    "assistant": "assistant_tag",
    "gpt": "assistant_tag",
    "model": "assistant_tag",
    "system": "system_tag",
    "developer": "system_tag",  # OpenAI's newer name for the system message
    "tool": "observation_tag",
    "observation": "observation_tag",
    "function_call": "function_tag",
}
_TAGS = ("role_tag", "content_tag", "user_tag", "assistant_tag", "observation_tag", "function_tag", "system_tag")


def needed_tags(row: Mapping[str, Any], attr: Any) -> str | None:
    """'set "tags": {...}' with the entry's tags changed to the keys and roles ``row`` uses; None where the row
    is not a sharegpt row of messages or its tags already fit."""
    if getattr(attr, "formatting", None) != "sharegpt":
        return None
    messages = row.get(attr.messages) if attr.messages else None
    if not isinstance(messages, list) or not all(isinstance(m, Mapping) for m in messages) or not messages:
        return None
    keys = {k for m in messages for k in m}
    tags = {name: getattr(attr, name) for name in _TAGS}
    for name, known in (("role_tag", _ROLE_KEYS), ("content_tag", _CONTENT_KEYS)):
        if tags[name] not in keys:
            tags[name] = next((k for k in known if k in keys), tags[name])
    roles = [m.get(tags["role_tag"]) for m in messages]
    for role in dict.fromkeys(r for r in roles if isinstance(r, str)):
        tag = _ROLES.get(role)
        if tag is not None and role not in (tags[t] for t in _TAGS[2:]):
            tags[tag] = role
    if tags == {name: getattr(attr, name) for name in _TAGS}:
        return None
    written = {name: value for name, value in tags.items() if value is not None}  # a tag left out is None
    return f'set "tags": {json.dumps(written)} in the entry (the keys and roles its rows use)'
