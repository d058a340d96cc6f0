"""Whether a ``.json`` / ``.json.gz`` file of any name is a Chrome (Kineto) trace, from its first
bytes only.

Most PyTorch traces are not named ``*.pt.trace.json``: ``prof.export_chrome_trace("trace.json")``
(the profiler recipe), ``rank-3.json.gz`` and ``<run>-rank0-chrome-trace.json.gz`` (per-rank
layouts).  A logdir also holds JSON that is no trace (configs, metrics, a dataset of gigabytes),
so a file is claimed only when its head says so, and no more than ``HEAD_BYTES`` of it (inflated,
for gzip) is ever read here: a 1 GB JSON that is not a trace costs one small read.

A trace is an object with a ``"traceEvents"`` key (or Kineto's header keys ``deviceProperties``
/ ``distributedInfo``, written before it), or a bare array whose first element is an event (a
``"ph"`` key).  Kineto writes ``distributedInfo`` at the top, so a rank's number and the job's
world size are read from the head when it is there.
"""

from __future__ import annotations

import json
import re
import zlib

from tb_gpuadvisor.input import Sniffed
from tb_gpuadvisor.input.files import GZIP_MAGIC, CaptureError, Opener, read_head

# How much of a file (inflated) is looked at: Kineto's header (device properties of 8 GPUs, a
# harness's metadata block) puts "traceEvents" up to 26 KB in (the corpus's traces).
HEAD_BYTES = 64 << 10
# A trace that ends early and changed this recently is taken as one the profiler is still
# writing (tensorboard_trace_handler writes while training goes on): a pause between two writes
# is far shorter.  An older one is truncated for good.
WRITING_S = 30.0

_BLANK = b" \t\r\n"
_BOM = b"\xef\xbb\xbf"
_TRACE_KEY = re.compile(rb'"(?:traceEvents|deviceProperties|distributedInfo)"\s*:')
_EVENT_KEY = re.compile(rb'"ph"\s*:')
_DISTRIBUTED = re.compile(rb'"distributedInfo"\s*:\s*\{[^{}]*\}')
_RANK = re.compile(rb'"rank"\s*:\s*(\d{1,9})\b')
_WORLD = re.compile(rb'"world_size"\s*:\s*(\d{1,9})\b')


def sniff(path: str, opener: Opener | None) -> Sniffed:
    """What the first bytes of the file at PATH (local, or through OPENER) say: a trace (with the
    rank it names), not one, or (None) too little written yet to tell while it is still changing."""
    try:
        head = read_head(path, opener, HEAD_BYTES)
    except CaptureError:
        return Sniffed(False)
    text, complete = head.data, head.complete
    if text[:2] == GZIP_MAGIC:
        inflated = _inflate_head(text, complete)
        if inflated is None:
            return Sniffed(False)
        text, complete = inflated
    verdict = judge(text, complete)
    if verdict is None:
        young = head.age_s is not None and head.age_s < WRITING_S
        return Sniffed(None if young else False)
    if not verdict:
        return Sniffed(False)
    return Sniffed(True, *_distributed(text))


def judge(text: bytes, complete: bool) -> bool | None:
    """Whether TEXT, the first bytes of a file (all of it when COMPLETE), starts a Chrome trace;
    None when it is too short to tell (a file cut early: one being written, or truncated)."""
    text = text.removeprefix(_BOM).lstrip(_BLANK)
    if not text:
        return None
    if text[:1] == b"{":
        if _TRACE_KEY.search(text):
            return True
    elif text[:1] == b"[":
        rest = text[1:].lstrip(_BLANK)
        if rest[:1] == b"{" and _EVENT_KEY.search(rest):
            return True
        if rest and rest[:1] != b"{":
            return False
    else:
        return False
    if not complete:
        return False        # a full head without a trace's keys: some other JSON
    try:
        json.loads(text)
    except ValueError:
        return None         # the whole file, and it stops mid-JSON: cut before it could tell
    return False


def _inflate_head(stored: bytes, complete: bool) -> tuple[bytes, bool] | None:
    """(the first HEAD_BYTES of the gzip stream STORED inflates to, whether that is all of it);
    None when STORED is no gzip stream.
    Deflate never shrinks text below its stored size by more than its headers, so HEAD_BYTES
    stored inflate to at least about HEAD_BYTES; inflating stops there (a bomb costs no more)."""
    inflater = zlib.decompressobj(16 + zlib.MAX_WBITS)
    try:
        text = inflater.decompress(stored, HEAD_BYTES)
    except zlib.error:
        return None
    ended = inflater.eof or (complete and not inflater.unconsumed_tail)
    return text, ended and len(text) < HEAD_BYTES


def _distributed(text: bytes) -> tuple[int | None, int | None]:
    """(rank, world size) of Kineto's ``distributedInfo``, when the head holds it."""
    block = _DISTRIBUTED.search(text)
    info = block.group(0) if block else b""
    return _number(_RANK, info), _number(_WORLD, info)


def _number(pattern: re.Pattern, text: bytes) -> int | None:
    match = pattern.search(text)
    return int(match.group(1)) if match else None
