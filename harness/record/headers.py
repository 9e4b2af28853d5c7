"""Which headers cross the proxy: all of them, except the hop-by-hop ones that belong to one connection."""

from __future__ import annotations

from collections.abc import Iterable

from multidict import CIMultiDict, CIMultiDictProxy

HOP_BY_HOP = frozenset(
    {
        "connection",
        "keep-alive",
        "proxy-authenticate",
        "proxy-authorization",
        "te",
        "trailer",
        "trailers",
        "transfer-encoding",
        "upgrade",
    }
)
# aiohttp's client adds these when absent; the proxy must send exactly what the client sent.
CLIENT_AUTO_HEADERS = ("Accept", "Accept-Encoding", "User-Agent", "Content-Type")


def end_to_end(headers: CIMultiDictProxy[str] | CIMultiDict[str], drop: Iterable[str] = ()) -> CIMultiDict[str]:
    """`headers` without hop-by-hop ones (including those named by `Connection`) and without `drop`."""
    named = {name.strip().lower() for value in headers.getall("Connection", ()) for name in value.split(",")}
    skip = HOP_BY_HOP | named | {name.lower() for name in drop}
    return CIMultiDict((k, v) for k, v in headers.items() if k.lower() not in skip)


def upstream_request_headers(headers: CIMultiDictProxy[str], body_replaced: bool, identity: bool) -> CIMultiDict[str]:
    """Client headers for the upstream request. `Host` is the upstream's; `Content-Length` is recomputed when the
    body is sent as bytes; `Expect: 100-continue` was already answered by the proxy's server; `identity` asks
    for an uncompressed response (recorded routes, so it can be read)."""
    drop = ["Host", "Expect"] + (["Content-Length"] if body_replaced else [])
    out = end_to_end(headers, drop)
    if identity:
        out["Accept-Encoding"] = "identity"
    return out
