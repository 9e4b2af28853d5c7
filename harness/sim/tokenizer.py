"""A deterministic word-level tokenizer: one whitespace-separated word is one token.

It follows the convention of the word-level tokenizer the GPU runs use (`make-tokenizer.py`): the word `t<N>`
is token N, so "t17 t99" -> [17, 99]; any other word also counts as one token, with a stable hashed id.
Generated text is made of `t<N>` words, so re-tokenising an output gives back exactly its token count.
"""

from __future__ import annotations

import zlib
from typing import Any

FIRST_WORD_ID = 3  # below: pad, bos, eos


def word_id(word: str, vocab_size: int) -> int:
    if word.startswith("t") and word[1:].isdigit():
        number = int(word[1:])
        if number < vocab_size:
            return number
    return FIRST_WORD_ID + zlib.crc32(word.encode()) % (vocab_size - FIRST_WORD_ID)


def encode(text: str, vocab_size: int) -> list[int]:
    return [word_id(word, vocab_size) for word in text.split()]


def count_tokens(text: str) -> int:
    return len(text.split())


def token_text(token_id: int, first: bool) -> str:
    """Text of one generated token, with the separating space that keeps words apart."""
    return f"t{token_id}" if first else f" t{token_id}"


def chat_prompt_text(messages: Any) -> str:
    """The text that counts as the prompt of a chat request: every message's text content, in order."""
    if not isinstance(messages, list) or not messages:
        raise ValueError("'messages' must be a non-empty list of {role, content} objects")
    parts: list[str] = []
    for message in messages:
        if not isinstance(message, dict):
            raise ValueError("every message must be an object with 'role' and 'content'")
        content = message.get("content") or ""
        if isinstance(content, list):
            parts.extend(p.get("text", "") for p in content if isinstance(p, dict))
        else:
            parts.append(str(content))
    return " ".join(parts)
