"""Reading an OpenAI-style request: what the gates need, with a clear 400 for anything unreadable.

The gateway does not tokenize: a prompt of token ids is counted exactly, text is estimated at
`bytes_per_token` UTF-8 bytes a token (4 for English text with Llama-family tokenizers). An
underestimate only means the engine may still answer 400 for a prompt beyond its context; the gate
then passes the engine's answer on unchanged.
"""

from __future__ import annotations

import array
import itertools
import json
import math
import re
from dataclasses import dataclass
from typing import Any

# Above this a `max_tokens` is absurd for any served context today; below 1 it is meaningless.
MAX_OUTPUT_TOKENS_ACCEPTED = 16_777_216

# Deeper than any request vLLM reads (JSON schemas for tools and guided output nest a few dozen
# levels at most), and far below the interpreter's recursion limit, so parsing the body and encoding
# it again for the engine can never run out of stack.
MAX_JSON_DEPTH = 128

CHAT_PATH = "/v1/chat/completions"
COMPLETIONS_PATH = "/v1/completions"
SESSION_HEADER = "X-Goodput-Session"
"""A conversation or agent run the request belongs to: its routing affinity, and within a class
with a session budget the session it is charged to (`gateway.sessions`)."""


class BadRequestError(Exception):
    """A request the gateway cannot read; the message names the field."""

    def __init__(self, message: str, field: str | None = None, status: int = 400) -> None:
        super().__init__(message)
        self.field = field
        self.status = status


@dataclass(frozen=True, slots=True)
class ParsedRequest:
    body: dict[str, Any]
    model: str
    stream: bool
    prompt_tokens: int
    requested_output_tokens: int | None
    output_field: str
    prompt_text: str
    prompt_field: str = "prompt"  # `messages` for a chat request


_JSON_STRING = re.compile(rb'"[^"\\]*(?:\\.[^"\\]*)*"', re.DOTALL)
_NOT_BRACKETS = bytes(range(256)).translate(None, b"[]{}")
_BRACKET_STEPS = bytes.maketrans(b"[]{}", b"\x01\xff\x01\xff")  # +1 and -1 as signed bytes


def json_depth_exceeds(raw: bytes | bytearray, limit: int = MAX_JSON_DEPTH) -> bool:
    """Whether the document nests arrays and objects deeper than `limit`, decided on the bytes before
    parsing: a parser and an encoder recurse once per level, and a body of 100,000 nested arrays must
    be a 400, not a RecursionError. Fewer opening brackets than the limit settles it with two counts
    (the common case); otherwise the strings are cut out and the brackets summed, C loops only."""
    if raw.count(b"[") + raw.count(b"{") <= limit:
        return False
    brackets = _JSON_STRING.sub(b"", raw).translate(_BRACKET_STEPS, _NOT_BRACKETS)
    return max(itertools.accumulate(array.array("b", brackets)), default=0) > limit


def parse_body(raw: bytes | bytearray) -> dict[str, Any]:
    """The body as a JSON object, or a 400 that says why not (never an exception of the parser's)."""
    if json_depth_exceeds(raw):
        raise BadRequestError(f"request body nests arrays or objects deeper than {MAX_JSON_DEPTH} levels")
    try:
        body = json.loads(raw)
    except (json.JSONDecodeError, UnicodeDecodeError) as error:
        raise BadRequestError(f"request body is not valid JSON: {error}") from None
    except RecursionError:
        raise BadRequestError("request body nests arrays or objects too deeply to read") from None
    if not isinstance(body, dict):
        raise BadRequestError("request body must be a JSON object")
    return body


def _max_tokens(body: dict[str, Any], path: str) -> tuple[int | None, str]:
    names = ("max_completion_tokens", "max_tokens") if path == CHAT_PATH else ("max_tokens",)
    for name in names:
        value = body.get(name)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int):
            raise BadRequestError(f"`{name}` must be an integer, got {json.dumps(value)[:40]}", name)
        if not 1 <= value <= MAX_OUTPUT_TOKENS_ACCEPTED:
            raise BadRequestError(
                f"`{name}` must be between 1 and {MAX_OUTPUT_TOKENS_ACCEPTED}, got {value}", name
            )
        return value, name
    return None, "max_tokens"


def _text_tokens(text: str, bytes_per_token: float) -> int:
    """Tokens estimated from the text's UTF-8 length; ASCII text (most prompts) is not copied to
    measure it, which matters for a prompt of megabytes."""
    utf8_bytes = len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))
    return math.ceil(utf8_bytes / bytes_per_token)


def _chat_prompt(body: dict[str, Any]) -> str:
    messages = body.get("messages")
    if not isinstance(messages, list) or not messages:
        raise BadRequestError("`messages` must be a non-empty list", "messages")
    parts: list[str] = []
    for index, message in enumerate(messages):
        if not isinstance(message, dict):
            raise BadRequestError(f"`messages[{index}]` must be an object", f"messages[{index}]")
        content = message.get("content")
        if isinstance(content, str):
            parts.append(content)
        elif isinstance(content, list):
            parts.extend(
                str(part.get("text", ""))
                for part in content
                if isinstance(part, dict) and part.get("type") == "text"
            )
        elif content is not None:
            raise BadRequestError(
                f"`messages[{index}].content` must be a string or a list", f"messages[{index}]"
            )
    return "\n".join(parts)


def _completion_prompt(body: dict[str, Any], bytes_per_token: float) -> tuple[str, int]:
    prompt = body.get("prompt")
    if isinstance(prompt, str):
        return prompt, _text_tokens(prompt, bytes_per_token)
    if (
        isinstance(prompt, list)
        and prompt
        and all(isinstance(t, int) and not isinstance(t, bool) for t in prompt)
    ):
        return " ".join(map(str, prompt[:256])), len(prompt)
    raise BadRequestError(
        "`prompt` must be a string or a non-empty list of token ids (one prompt per request)", "prompt"
    )


def parse_request(raw: bytes | bytearray, path: str, bytes_per_token: float = 4.0) -> ParsedRequest:
    """The fields the gates read; BadRequestError (400) naming the field for anything else."""
    body = parse_body(raw)
    model = body.get("model")
    if not isinstance(model, str) or not model:
        raise BadRequestError("`model` is required: the served model's name", "model")
    stream = body.get("stream", False)
    if not isinstance(stream, bool):
        raise BadRequestError("`stream` must be true or false", "stream")
    requested, field = _max_tokens(body, path)
    if path == CHAT_PATH:
        text = _chat_prompt(body)
        tokens = _text_tokens(text, bytes_per_token) + 4 * len(body["messages"])  # role markers
        prompt_field = "messages"
    else:
        text, tokens = _completion_prompt(body, bytes_per_token)
        prompt_field = "prompt"
    return ParsedRequest(body, model, stream, max(1, tokens), requested, field, text, prompt_field)


def error_body(message: str, kind: str, field: str | None = None, code: str | None = None) -> dict[str, Any]:
    """OpenAI's error shape, which clients of vLLM already parse."""
    return {"error": {"message": message, "type": kind, "param": field, "code": code}}
