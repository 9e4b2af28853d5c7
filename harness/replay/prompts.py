"""Deterministic prompt text for trace rows without recorded text (redacted or imported from counts).

Words come from a fixed vocabulary of short, common, lower-case English words, each a single token in the
usual BPE tokenizers when preceded by a space, so "n words" is close to "n tokens"; `token_fit` then
adjusts the count against the server's own tokenizer. Text depends only on (seed, block id) for shared
prefix blocks and (seed, request id) for the rest, never on row order, slicing or worker count, so requests
that share leading `prefix_block_ids` share the same leading words and both arms get identical text.
"""

from __future__ import annotations

import random
from collections.abc import Sequence

_WORDS = """
    the of and to in is was for on with as by at from that this it be are or an not have had has but which
    one all were they there been more can will would when who what their if about so time out up into some
    them than other only new its first two may over any also after use most these such made like many back
    then where well through just long must before good each people year way years day both work part
    still world life state while find great old see same last high under take small large group place end
    home case point fact hand water number city name left right game house side open line music power
    light book form family head paper tree road river night color story area sound table door
    plan rule field body test model data cost price value order list level page word start stop run help
    move play show turn keep read write call ask need feel try leave put mean let begin seem talk hold
    bring happen stand lose pay meet include continue set learn change lead watch follow create speak
    spend grow offer remember love consider appear buy wait serve die send expect build stay fall cut reach
    kill remain suggest raise pass sell require report decide pull
"""
VOCABULARY = tuple(_WORDS.split())


def _rng(seed: int, kind: str, key: object) -> random.Random:
    # str seeds are hashed with SHA-512 by `random`, so this is stable across processes and Python runs.
    return random.Random(f"replaybench:{seed}:{kind}:{key}")


def block_words(seed: int, block_id: int, block_size: int) -> list[str]:
    """The words of one shared prefix block (same for every request carrying this block id)."""
    return _rng(seed, "block", block_id).choices(VOCABULARY, k=block_size)


def request_words(seed: int, request_id: str, count: int) -> list[str]:
    """Words private to one request (its tail after any shared prefix blocks)."""
    return _rng(seed, "request", request_id).choices(VOCABULARY, k=count)


def prompt_words(seed: int, request_id: str, block_ids: Sequence[int], block_size: int, count: int) -> list[str]:
    """Exactly `count` words: the shared blocks in order, then request-private words, truncated at `count`."""
    words: list[str] = []
    for block_id in block_ids:
        if len(words) >= count:
            break
        words += block_words(seed, int(block_id), block_size)
    if len(words) < count:
        words += request_words(seed, request_id, count - len(words))
    return words[:count]
