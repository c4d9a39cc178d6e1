"""Cluster launch control (sm_100, PTX ISA 8.6+ ``clusterlaunchcontrol``): the try_cancel response.

``clusterlaunchcontrol.try_cancel`` asks to atomically cancel the launch of a cluster that has not
started running; it writes a 16-byte response to shared memory asynchronously and performs a
complete-tx of 16 bytes on an mbarrier. On success the response carries the ctaid of the canceled
cluster's first CTA, and no other successful response of the same grid carries it; otherwise it says
the request failed. ``clusterlaunchcontrol.query_cancel`` decodes a response held in a ``.b128``
register: ``.is_canceled.pred`` and ``.get_first_ctaid{::x,::y,::z}.b32`` /
``.get_first_ctaid.v4.b32`` (x, y, z, and an unused fourth word); the ctaid of a failed response is
undefined. A CTA that observed a failed response must not issue another try_cancel (undefined).

The ISA calls the response *opaque* and documents no layout, so only the query instructions may read
it. The emulator's encoding (little-endian 32-bit words; the ``.b128`` register holds bytes 0..15,
bytes 0..7 in its low half):

* word 0: :data:`RESPONSE_TAG` with bit 0 set when the request succeeded;
* words 1, 2, 3: the first ctaid's x, y, z; :data:`UNDEFINED_CTAID` in each when it failed, so a kernel
  that uses the ctaid of a failed response gets coordinates far out of range.

A query of 16 bytes that do not carry the tag (not a try_cancel response) is an error.
"""

from __future__ import annotations

import struct

from nvgemm.emulator.isa.errors import IsaError

RESPONSE_BYTES = 16
RESPONSE_TAG = 0x434C4300  # "\0CLC" little-endian; bit 0 is the canceled flag
UNDEFINED_CTAID = 0xFFFFFFFF


def encode_response(first_ctaid: tuple[int, int, int] | None) -> bytes:
    """The 16-byte response of a request that canceled the cluster of ``first_ctaid`` (None: failed)."""
    if first_ctaid is None:
        return struct.pack("<4I", RESPONSE_TAG, UNDEFINED_CTAID, UNDEFINED_CTAID, UNDEFINED_CTAID)
    x, y, z = first_ctaid
    return struct.pack("<4I", RESPONSE_TAG | 1, x, y, z)


def response_words(lo: int, hi: int) -> tuple[int, int, int, int]:
    """The four 32-bit words of a ``.b128`` register value given as its low / high 64-bit halves."""
    return lo & 0xFFFFFFFF, lo >> 32, hi & 0xFFFFFFFF, hi >> 32


def decode_response(words: tuple[int, int, int, int]) -> tuple[bool, tuple[int, int, int]]:
    """(is_canceled, first ctaid) of a response's words; the ctaid is undefined when not canceled."""
    if words[0] & ~1 != RESPONSE_TAG:
        raise IsaError(f"clusterlaunchcontrol.query_cancel of a value that is not a try_cancel response "
                       f"(words {[hex(x) for x in words]})")
    return bool(words[0] & 1), (words[1], words[2], words[3])


__all__ = ["RESPONSE_BYTES", "RESPONSE_TAG", "UNDEFINED_CTAID", "decode_response", "encode_response",
           "response_words"]
